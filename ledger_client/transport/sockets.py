"""What the client's two kinds of TCP connection to a bookie share (socket_stream for adds,
socket_reads for range reads): the same socket options, the hello that opens them, and a quiet
shutdown."""

from __future__ import annotations

import socket
import ssl

from ..protocol.sockets import shutdown
from ..protocol.tcp_framing import ADD_HELLO, ADD_HELLO_AUTH, READ_HELLO_AUTH, frame
from ..protocol.tls_pump import tunnel

__all__ = ["greet", "shutdown", "tls_client"]

# Keepalive: a bookie host that vanished without a reset ends the connection in ~25 s, so the
# next add or read opens a new one instead of writing into a dead socket.
_OPTIONS = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10), (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3))


def greet(sock: socket.socket, hello: bytes, bookie_id: str, token: str | None = None) -> None:
    """Set the options, make the socket blocking without a timeout (deadlines are the callers'),
    and send `hello` naming the bookie meant (see tcp_framing), in version 2 with `token` when
    there is one. Closes the socket if that fails."""
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):   # not the plain end of a TLS pump
            _set_options(sock)
        sock.settimeout(None)
        if token:
            hello = ADD_HELLO_AUTH if hello == ADD_HELLO else READ_HELLO_AUTH
            sock.sendall(hello + frame(bookie_id.encode()) + frame(token.encode()))
        else:
            sock.sendall(hello + frame(bookie_id.encode()))
    except OSError:
        sock.close()
        raise


def _set_options(sock: socket.socket) -> None:
    for level, opt, value in _OPTIONS:
        sock.setsockopt(level, opt, value)


def tls_client(sock: socket.socket, context: ssl.SSLContext, host: str, timeout_s: float) -> socket.socket:
    """TLS on a connected TCP socket to the bookie at `host` (its certificate checked against the
    context's CA and that host name), then the plain end of a pump (ledger_client.protocol.tls_pump)
    to speak the framing on. OSError (ssl.SSLError, ssl.SSLCertVerificationError) when the handshake
    fails; the socket is closed then."""
    try:
        _set_options(sock)
        sock.settimeout(timeout_s)
        tls_sock = context.wrap_socket(sock, server_hostname=host)
    except OSError:
        sock.close()
        raise
    return tunnel(tls_sock, host)
