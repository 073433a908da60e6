"""Token authentication of the bookie's clients (DESIGN §4.8, docs/security.md).

A client presents a signed JWT (Pulsar's token authentication): on gRPC in the `authorization`
metadata of every call (`Bearer <token>`), on the TCP port in the hello that opens a connection
(`ledger_client.protocol.tcp_framing`). The bookie checks the signature (HS256 with a shared secret
file, or RS256 with a public key: the bookie then holds nothing that can mint tokens), `exp`, and
the claims `sub` (who) and `role` (`client` or `admin`), before it serves any request of that call
or connection. A refused call gets gRPC's UNAUTHENTICATED (PERMISSION_DENIED for a role too weak),
a refused TCP connection has every request answered EUA: either way the client raises
UnauthorizedAccessError and nothing is written or read.

Verified tokens are cached (a bounded dict keyed by the token, its expiry still checked on every
use): a signature check costs tens of microseconds, which every gRPC call would otherwise pay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt

from ledger_client.protocol.auth_keys import BEARER, ROLE_KEY, TOKEN_KEY
from metadata.tenancy import Caller
from spark_bookie.errors import ConfigError, UnauthorizedError

log = logging.getLogger(__name__)
ROLES = ("client", "admin", "service")   # service: the cluster's own processes (DESIGN §4.9)
ALGORITHMS = ("HS256", "RS256")
CACHE_ENTRIES_MAX = 4096


@dataclass(frozen=True)
class Principal:
    """Who a verified token names: `subject` (its `sub`), `role`, and when it stops being valid."""

    subject: str
    role: str
    expires_at_s: float

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def caller(self) -> Caller:
        """Who asks, as the tenant checks see it (metadata.tenancy)."""
        return Caller(self.subject, self.role)


class AuthError(UnauthorizedError):
    """A token is missing, malformed, forged, expired or names an unknown role (wire status EUA)."""


class RoleError(AuthError):
    """A valid token whose role is not allowed to do what was asked (an admin call by a client)."""


class TokenVerifier:
    """Checks tokens against one key. Thread-safe."""

    def __init__(self, key: str | bytes, algorithm: str, leeway_s: float = 0.0) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"auth token algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
        if not key:
            raise ConfigError("auth token key is empty")
        self._key = key
        self._algorithm = algorithm
        self.leeway_s = leeway_s   # clock skew forgiven on `exp`
        self._cache: dict[str, Principal] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_files(cls, secret_path: str, public_key_path: str, leeway_s: float = 0.0) -> TokenVerifier:
        """HS256 with the secret in `secret_path`, or RS256 with the PEM public key in
        `public_key_path` (exactly one of them). ConfigError naming the file when it is unreadable."""
        if bool(secret_path) == bool(public_key_path):
            raise ConfigError("auth_enabled needs exactly one of auth_token_secret_path (HS256) and "
                              "auth_token_public_key_path (RS256)")
        path = secret_path or public_key_path
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read auth token key {path}: {e.strerror or e}") from e
        if secret_path:
            return cls(data.strip(), "HS256", leeway_s)
        return cls(data.decode("ascii", errors="replace"), "RS256", leeway_s)

    def verify(self, token: str | None, *, admin: bool = False) -> Principal:
        """The principal of a valid token; AuthError otherwise, RoleError when `admin` is asked
        and the token's role is `client`."""
        if not token:
            raise AuthError("no auth token: this bookie requires one (auth_token / auth_token_file)")
        now = time.time()
        principal = self._cache.get(token)
        if principal is None:
            principal = self._decode(token)
            with self._lock:
                if len(self._cache) >= CACHE_ENTRIES_MAX:
                    self._cache.clear()
                self._cache[token] = principal
        if principal.expires_at_s + self.leeway_s <= now:
            self._cache.pop(token, None)
            raise AuthError(f"auth token of {principal.subject!r} expired")
        if admin and not principal.is_admin:
            raise RoleError(f"{principal.subject!r} has role {principal.role!r}; this call needs 'admin'")
        return principal

    def _decode(self, token: str) -> Principal:
        try:
            claims = jwt.decode(token, self._key, algorithms=[self._algorithm], leeway=self.leeway_s,
                                options={"require": ["exp", "sub"]})
        except jwt.ExpiredSignatureError as e:
            raise AuthError("auth token expired") from e
        except jwt.InvalidTokenError as e:
            raise AuthError(f"auth token refused: {type(e).__name__}: {e}") from e
        except (UnicodeError, ValueError, TypeError) as e:   # PyJWT lets a lone surrogate through as these
            raise AuthError(f"auth token refused: not a token ({type(e).__name__})") from e
        role = claims.get("role", "client")
        if role not in ROLES:
            raise AuthError(f"auth token of {claims['sub']!r} has unknown role {role!r} (not one of {ROLES})")
        return Principal(str(claims["sub"]), role, float(claims["exp"]))


class ConnectionAccess:
    """Whether the requests of one TCP connection are served (the gRPC port checks every call).

    Its token is checked at the hello and its expiry on every request after, so a connection
    does not outlive its token; a client whose token rotated sends the new one on the connection
    (AddBatch.auth_token, ReadRangeRequest.auth_token) and is served until that one expires. A
    refused or expired connection stays open, every request answered EUA, so the client learns
    why rather than seeing a dead bookie. One per connection; used from its serving thread."""

    def __init__(self, verifier: TokenVerifier, token: str | None) -> None:
        self._verifier = verifier
        self._refusal: str | None = None
        self._until_s = 0.0
        self._subject = ""
        self.caller: Caller | None = None   # who the token names, once one was accepted
        self.renew(token)

    def renew(self, token: str | None) -> None:
        """Check `token` (the hello's, or a newer one sent on the connection) and serve by it."""
        try:
            principal = self._verifier.verify(token)
        except AuthError as e:
            self._refusal = str(e)
            return
        self._refusal = None
        self._subject = principal.subject
        self.caller = principal.caller
        self._until_s = principal.expires_at_s + self._verifier.leeway_s

    def refusal(self, token: str = "") -> str | None:
        """Why the request is not served (None: it is), after renewing with `token` if one came
        with it. Costs one clock read when nothing changed."""
        if token:
            self.renew(token)
        if self._refusal is None and time.time() >= self._until_s:
            self._refusal = (f"auth token of {self._subject!r} expired while connected; send a new one "
                             f"(auth_token_file) or reconnect")
        return self._refusal


def call_credentials(metadata: Any) -> tuple[str | None, bool]:
    """(the token, whether the admin role is asked) of a gRPC call's invocation metadata."""
    token, admin = None, False
    for key, value in metadata or ():
        if key == TOKEN_KEY:
            token = bearer_token(value)
        elif key == ROLE_KEY:
            admin = value == "admin"
    return token, admin


def bearer_token(value: str | bytes | None) -> str | None:
    """The token of an `authorization` metadata value (`Bearer <token>`), or None."""
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not value or not value.startswith(BEARER):
        return None
    return value[len(BEARER):].strip() or None


def mint_token(key: str | bytes, subject: str, role: str = "client", ttl_s: float = 86_400.0,
               algorithm: str = "HS256", now_s: float | None = None) -> str:
    """A signed token (HS256: `key` is the shared secret; RS256: a PEM private key), for the
    sandbox, tests and operators (`spark-bookie` has no command of its own for this)."""
    if role not in ROLES:
        raise ConfigError(f"role must be one of {ROLES}, not {role!r}")
    now = time.time() if now_s is None else now_s
    return jwt.encode({"sub": subject, "role": role, "iat": int(now), "exp": int(now + ttl_s)}, key,
                      algorithm=algorithm)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every gRPC call without a valid token (UNAUTHENTICATED) before its handler runs.
    Refusals are logged at most once a second: a misconfigured client retries a lot."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier
        self._last_log_s = 0.0

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        token, admin = call_credentials(handler_call_details.invocation_metadata)
        try:
            self._verifier.verify(token, admin=admin)
            return handler
        except AuthError as e:
            now = time.monotonic()
            if now - self._last_log_s >= 1.0:
                self._last_log_s = now
                log.warning("refused %s: %s", handler_call_details.method, e)
            code = grpc.StatusCode.PERMISSION_DENIED if isinstance(e, RoleError) else grpc.StatusCode.UNAUTHENTICATED
            return _denied(handler, str(e), code)


def _denied(handler: Any, detail: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED) -> Any:
    """A handler of the same kind as `handler` that only aborts with `code`."""
    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, detail)

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
