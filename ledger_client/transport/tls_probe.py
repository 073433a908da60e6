"""Why a bookie refuses our TLS, when it does (docs/security.md).

A refused TLS handshake looks to a gRPC client like a dead bookie: "UNAVAILABLE ... Socket closed",
because the bookie's side of the failure (no client certificate, one from another CA, a plaintext
client on a TLS port) arrives as a closed connection, not as a reason. Treated as unavailable, a
writer replaces the bookie, then the next, and ends in NotEnoughBookiesError, which sends an
operator looking for dead bookies. So when a call fails that way, the client asks once with a
handshake of its own on the same port, with the same certificates, and reads what the bookie
answers: a certificate it cannot verify, or an alert ("certificate required", "unknown CA"), or a
bookie that speaks TLS to a client configured without it. Any of those is a refusal, raised as
UnauthorizedAccessError: replacing the bookie cannot help. A port that does not answer, a reset,
or a connection closed during the handshake is not a refusal (the bookie may just be going down),
so a dead bookie is still one. gRPC's server ends a connection whose client certificate it refuses
right after the handshake, without an alert: that end is read as a refusal.

Only failure paths probe, at most once per PROBE_TTL_S per bookie, each bounded by PROBE_TIMEOUT_S.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable

PROBE_TIMEOUT_S = 2.0
PROBE_TTL_S = 5.0
# What a gRPC client sends first on a TLS connection (RFC 7540 §3.5: the preface, then SETTINGS):
# enough for the bookie's TLS stack to answer with an alert, or its HTTP/2 server with SETTINGS.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def tls_refusal(host: str, port: int, context: ssl.SSLContext | None,
                timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the gRPC port at host:port refuses a client with `context` (None: a plaintext client;
    else the client's certificates, offering ALPN h2 as gRPC does), or None when it does not
    refuse (it accepts, or it cannot be reached at all)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None
    with sock:
        if context is None:
            return _speaks_tls(sock, host)
        return _refuses(sock, host, context)


def _speaks_tls(sock: socket.socket, host: str) -> str | None:
    """A plaintext client: a refusal when the port completes a TLS handshake."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    probe.set_alpn_protocols(["h2"])
    try:
        with probe.wrap_socket(sock, server_hostname=host):
            pass
    except (OSError, ValueError):
        return None
    return "the bookie requires TLS and this client has none (set tls_ca_path, and tls_cert_path and " \
           "tls_key_path if it asks for client certificates)"


def _refuses(sock: socket.socket, host: str, context: ssl.SSLContext) -> str | None:
    try:
        tls = context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        return f"the bookie's certificate is not trusted: {e.verify_message or e}"
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return None   # the port closed during the handshake: a bookie going down, or no TLS there
    except ssl.SSLError as e:
        if e.reason == "WRONG_VERSION_NUMBER":
            return "the bookie does not speak TLS on this port (its tls_enabled is off)"
        return f"TLS handshake refused: {e.reason or e}"
    except OSError:
        return None
    with tls:
        try:
            tls.sendall(HTTP2_PREFACE)
            answer = tls.recv(9)
        except ssl.SSLError as e:   # an alert after the handshake: how TLS 1.3 refuses a client certificate
            return f"the bookie refused this client's certificate: {e.reason or e}"
        except OSError:   # a reset, no answer in time: not a refusal we can name
            return None
    if answer:
        return None   # the bookie's HTTP/2 SETTINGS: it took our TLS
    # gRPC's TLS stack (BoringSSL) ends a connection whose client certificate it refuses (or that
    # has none when one is required) without an alert, right after the handshake.
    return "the bookie closed the connection after the TLS handshake: it refused this client's certificate " \
           "(or requires one: set tls_cert_path and tls_key_path)"


class RefusalCache:
    """One bookie's last probe verdict, kept PROBE_TTL_S: a writer failing many adds at once, or
    reads retrying, probe once. Concurrent askers wait for the one probe in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at_s = -1e9
        self._verdict: str | None = None

    def get(self, probe: Callable[[], str | None]) -> str | None:
        with self._lock:
            now = time.monotonic()
            if now - self._at_s >= PROBE_TTL_S:
                self._verdict = probe()
                self._at_s = time.monotonic()
            return self._verdict
