"""What the client's two kinds of TCP connection to a bookie share (socket_stream for adds,
socket_reads for range reads): the same socket options, the hello that opens them, and a quiet
shutdown."""

from __future__ import annotations

import socket

from ..protocol.add_framing import ADD_HELLO, ADD_HELLO_AUTH, READ_HELLO_AUTH, frame
from ..protocol.sockets import shutdown

__all__ = ["greet", "shutdown"]

# Keepalive: a bookie host that vanished without a reset ends the connection in ~25 s, so the
# next add or read opens a new one instead of writing into a dead socket.
_OPTIONS = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10), (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3))


def greet(sock: socket.socket, hello: bytes, bookie_id: str, token: str | None = None) -> None:
    """Set the options, make the socket blocking without a timeout (deadlines are the callers'),
    and send `hello` naming the bookie meant (see add_framing), in version 2 with `token` when
    there is one. Closes the socket if that fails."""
    try:
        for level, opt, value in _OPTIONS:
            sock.setsockopt(level, opt, value)
        sock.settimeout(None)
        if token:
            hello = ADD_HELLO_AUTH if hello == ADD_HELLO else READ_HELLO_AUTH
            sock.sendall(hello + frame(bookie_id.encode()) + frame(token.encode()))
        else:
            sock.sendall(hello + frame(bookie_id.encode()))
    except OSError:
        sock.close()
        raise
