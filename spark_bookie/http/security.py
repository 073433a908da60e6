"""Who may use the admin API, and TLS on its port (DESIGN §4.8, docs/security.md).

With token authentication on, a request carries `Authorization: Bearer <token>` checked by the
bookie's own TokenVerifier: reading calls (GET) need a valid token of either role, changing calls
(gc, decommission, ledger delete: PUT, POST, DELETE) the `admin` role. A missing or bad token gets
401, a `client` token on an admin call 403. /heartbeat, /metrics and /api/v1/bookie/is_ready stay
open: health checks and Prometheus scrapes carry no token (and reveal no ledger data).
"""

from __future__ import annotations

import os
import ssl
import threading
import time

from spark_bookie.http.params import ApiError
from spark_bookie.http.server import Guard, Request
from spark_bookie.server.auth import AuthError, RoleError, TokenVerifier, bearer_token

OPEN_PATHS = frozenset({"/heartbeat", "/metrics", "/api/v1/bookie/is_ready"})
READ_METHODS = frozenset({"GET", "HEAD"})
SECRET_CONFIG_KEYS = frozenset({"zk_auth"})


def token_guard(verifier: TokenVerifier) -> Guard:
    def guard(req: Request) -> None:
        if req.path.rstrip("/") in OPEN_PATHS:
            return
        try:
            verifier.verify(bearer_token(req.authorization), admin=req.method not in READ_METHODS)
        except RoleError as e:
            raise ApiError(403, str(e)) from e
        except AuthError as e:
            raise ApiError(401, str(e)) from e
    return guard


def redacted(config: dict[str, object]) -> dict[str, object]:
    """The configuration as server_config shows it: credentials replaced by a mark."""
    return {k: ("<redacted>" if k in SECRET_CONFIG_KEYS and v else v) for k, v in config.items()}


class ReloadingContext:
    """A server SSLContext whose certificate chain is re-read when its files change (checked at most
    every `refresh_s` seconds, on accepting a connection); a failed reload keeps the old chain."""

    def __init__(self, cert_path: str, key_path: str, trust_path: str, client_auth: bool, refresh_s: float) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert_path, key_path)
        if trust_path:
            self.context.load_verify_locations(trust_path)
        if client_auth:
            self.context.verify_mode = ssl.CERT_REQUIRED
        self._paths = (cert_path, key_path)
        self._refresh_s = refresh_s
        self._stamps = self._mtimes()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in self._paths)

    def refreshed(self) -> ssl.SSLContext:
        if self._refresh_s > 0 and time.monotonic() - self._checked >= self._refresh_s:
            with self._lock:
                self._checked = time.monotonic()
                try:
                    stamps = self._mtimes()
                    if stamps != self._stamps:
                        self.context.load_cert_chain(*self._paths)   # new handshakes use the new chain
                        self._stamps = stamps
                except (OSError, ssl.SSLError):
                    pass   # half-written rotation: the next check tries again
        return self.context
