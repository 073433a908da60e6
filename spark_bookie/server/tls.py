"""TLS on the bookie's gRPC port (DESIGN §4.8, docs/security.md), with certificates reloaded from
disk without a restart (BookKeeper's tlsCertFilesRefreshDurationSeconds).

gRPC asks a fetcher for the certificate configuration before each new TLS handshake; the fetcher
here looks at the files' modification times at most once per refresh period and hands gRPC a new
configuration only when one changed and the new pair loads (a half-written rotation is logged and
the old certificate kept). Connections already open keep the certificate they started with.

The TCP add/read port and the admin HTTP port use an ssl.SSLContext with the same files and rules
(ReloadingContext); on the TCP port each connection's TLS runs in a pump thread of its own
(ledger_client.protocol.tls_pump), so its framing code keeps a plain socket.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from spark_bookie.errors import StartupError
from spark_bookie.server.config import BookieConfig

log = logging.getLogger(__name__)


class ReloadingCertificates:
    """The bookie's certificate, key and (for mTLS) client CA, re-read when they change."""

    def __init__(self, cert_path: str, key_path: str, trust_path: str, refresh_s: float) -> None:
        self._paths = tuple(p for p in (cert_path, key_path, trust_path) if p)
        self._cert_path, self._key_path, self._trust_path = cert_path, key_path, trust_path
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._checked = time.monotonic()
        self._stamps = self._mtimes()
        self.initial = self._configuration()
        self.reloads = 0

    def _mtimes(self) -> tuple[int, ...]:
        try:
            return tuple(os.stat(p).st_mtime_ns for p in self._paths)
        except OSError as e:
            raise StartupError(f"TLS file {e.filename}: {e.strerror}") from e

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        try:
            cert, key = Path(self._cert_path).read_bytes(), Path(self._key_path).read_bytes()
            trust = Path(self._trust_path).read_bytes() if self._trust_path else None
        except OSError as e:
            raise StartupError(f"cannot read TLS file {e.filename}: {e.strerror}") from e
        if b"PRIVATE KEY" not in key or b"CERTIFICATE" not in cert:
            raise StartupError(f"{self._cert_path} / {self._key_path}: not a PEM certificate and private key")
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=trust)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when the files changed, else None (keep the old)."""
        if self._refresh_s <= 0:
            return None
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self._refresh_s:
                return None
            self._checked = now
            try:
                stamps = self._mtimes()
                if stamps == self._stamps:
                    return None
                config = self._configuration()
            except StartupError as e:
                log.warning("TLS certificate reload failed, keeping the current one: %s", e)
                return None
            self._stamps = stamps
            self.reloads += 1
        log.info("TLS certificate files changed: new connections use the new certificate")
        return config


def server_credentials(cfg: BookieConfig) -> tuple[grpc.ServerCredentials, ReloadingCertificates]:
    """The gRPC server credentials of a bookie with tls_enabled (StartupError for a bad file)."""
    certs = ReloadingCertificates(cfg.tls_certificate_path, cfg.tls_key_path, cfg.tls_trust_store_path,
                                  float(cfg.tls_cert_files_refresh_duration_s))
    creds = grpc.dynamic_ssl_server_credentials(certs.initial, certs.fetch,
                                                require_client_authentication=cfg.tls_client_authentication)
    return creds, certs


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


def socket_context(cfg: BookieConfig) -> Callable[[], ssl.SSLContext] | None:
    """The SSLContext of each new connection to the TCP and HTTP ports (None with TLS off); the
    files are re-read when they change (StartupError, naming the file, when one cannot be read)."""
    if not cfg.tls_enabled:
        return None
    try:
        return ReloadingContext(cfg.tls_certificate_path, cfg.tls_key_path, cfg.tls_trust_store_path,
                                cfg.tls_client_authentication, float(cfg.tls_cert_files_refresh_duration_s)).refreshed
    except (OSError, ssl.SSLError) as e:
        raise StartupError(f"cannot load the TLS certificate, key or trust store: {e}") from e
