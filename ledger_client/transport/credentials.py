"""What a client shows the bookies (docs/security.md): an auth token and TLS material.

The token goes in the `authorization` metadata of every gRPC call and in the hello of every TCP
connection. A token file is re-read when its modification time changes (checked at most once per
TOKEN_FILE_CHECK_S), so a token rotated on disk is used by the next call and connection without
restarting the client. TLS: gRPC channel credentials from a CA bundle (the bookie's certificate is
checked against it and against the host name the client dialled) and an optional client
certificate and key (mTLS).
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import jwt

from metadata.tenancy import Caller

from .. import errors
from ..config import ClientConfig
from ..protocol.auth_keys import BEARER, ROLE_KEY, TOKEN_KEY

TOKEN_FILE_CHECK_S = 1.0


@dataclass
class Credentials:
    auth_token: str | None = None
    auth_token_file: str | None = None
    tls_ca_path: str | None = None
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    _file_token: str | None = field(default=None, repr=False)
    _file_mtime_ns: int = field(default=-1, repr=False)
    _checked_s: float = field(default=-1e9, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _channel_creds: grpc.ChannelCredentials | None = field(default=None, repr=False)
    _ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    _caller: tuple[str, Caller] | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.tls_ca_path is not None

    def token(self) -> str | None:
        """The token to present now (None: none configured). IncorrectParameterError when the
        token file cannot be read."""
        if self.auth_token is not None:
            return self.auth_token
        if self.auth_token_file is None:
            return None
        now = time.monotonic()
        if now - self._checked_s < TOKEN_FILE_CHECK_S:
            return self._file_token
        with self._lock:
            try:
                mtime = os.stat(self.auth_token_file).st_mtime_ns
                if mtime != self._file_mtime_ns:
                    with open(self.auth_token_file, encoding="ascii") as f:
                        self._file_token = f.read().strip() or None
                    self._file_mtime_ns = mtime
            except (OSError, UnicodeDecodeError) as e:
                raise errors.IncorrectParameterError(f"cannot read auth_token_file {self.auth_token_file}: {e}") from e
            self._checked_s = now
            return self._file_token

    def caller(self) -> Caller | None:
        """Who this client's token says it is (None: no token, nothing is checked). Decoded without
        checking the signature: the bookies check it; the client only uses it to name itself in
        the metadata of the ledgers it creates and to refuse early what the cluster would refuse."""
        token = self.token()
        if not token:
            return None
        cached = self._caller
        if cached is not None and cached[0] == token:
            return cached[1]
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except (jwt.InvalidTokenError, UnicodeError, ValueError, TypeError):
            return None   # not a token at all: the bookies refuse it, with their own words
        caller = Caller(str(claims.get("sub", "")), str(claims.get("role", "client")))
        self._caller = (token, caller)
        return caller

    def grpc_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Metadata for a gRPC call: the token as a bearer credential, or None."""
        token = self.token()
        return ((TOKEN_KEY, BEARER + token),) if token else None

    def role_metadata(self, role: str) -> tuple[tuple[str, str], ...]:
        """Metadata of a call the bookie must serve only for a token of `role`."""
        return (*(self.grpc_metadata() or ()), (ROLE_KEY, role))

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC TLS credentials (the files are read once per client; IncorrectParameterError when
        one cannot be read)."""
        with self._lock:
            if self._channel_creds is None:
                self._channel_creds = grpc.ssl_channel_credentials(
                    root_certificates=_read(self.tls_ca_path), private_key=_read(self.tls_key_path),
                    certificate_chain=_read(self.tls_cert_path))
            return self._channel_creds


    def ssl_context(self) -> ssl.SSLContext:
        """The client context of the TCP add/read port: the CA, host name checks, and the client
        certificate if any (IncorrectParameterError when a file cannot be loaded)."""
        with self._lock:
            if self._ssl_context is None:
                self._ssl_context = self._new_context()
            return self._ssl_context

    def probe_context(self) -> ssl.SSLContext:
        """The same certificates offering ALPN h2, as gRPC does: for asking the gRPC port why it
        refused us (tls_probe). Made on each call: only failures ask."""
        ctx = self._new_context()
        ctx.set_alpn_protocols(["h2"])
        return ctx

    def _new_context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.tls_ca_path)
            if self.tls_cert_path is not None:
                ctx.load_cert_chain(self.tls_cert_path, self.tls_key_path)
        except (OSError, ssl.SSLError) as e:
            raise errors.IncorrectParameterError(f"cannot load the client's TLS files: {e}") from e
        return ctx


class PresentedToken:
    """The token one TCP connection presented to the bookie. The bookie serves a connection only
    until that token expires, so when the client's token changes (a rotated auth_token_file) the
    connection sends the new one with its next request (AddBatch / ReadRangeRequest.auth_token).
    No lock: two requests racing may both carry the new token, which is harmless. Reading the
    token costs a clock read at most (see Credentials.token)."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token
        self._presented: str | None = None

    def at_hello(self) -> str | None:
        """The token for the hello, remembered as presented."""
        self._presented = self._token()
        return self._presented

    def rotated(self) -> str | None:
        """The current token when it differs from the one presented (then it is), else None. A
        token file that became unreadable keeps the one presented: the bookie decides."""
        try:
            token = self._token()
        except errors.LedgerError:
            return None
        if token == self._presented or not token:
            return None
        self._presented = token
        return token


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise errors.IncorrectParameterError(f"cannot read {path}: {e.strerror or e}") from e


NO_CREDENTIALS = Credentials()


def credentials_of(config: ClientConfig) -> Credentials:
    """The credentials a ClientConfig names (NO_CREDENTIALS when it names none)."""
    c = config
    if not (c.auth_token or c.auth_token_file or c.tls_ca_path):
        return NO_CREDENTIALS
    return Credentials(auth_token=c.auth_token, auth_token_file=c.auth_token_file, tls_ca_path=c.tls_ca_path,
                       tls_cert_path=c.tls_cert_path, tls_key_path=c.tls_key_path)
