"""TLS for the TCP add/read port: a pump between a TLS socket and one end of a socket pair.

Why a pump rather than TLS sockets in place: both ends of the TCP port read a connection on one
thread while others write to it (the client's shared reader and its senders; the bookie's
connection thread and its journal thread), without blocking and with MSG_DONTWAIT, and an OpenSSL
connection must not be used from two threads at once nor be written with socket flags. So with
TLS on, the framing code keeps its plain socket, whose peer is one end of a socket pair, and one
thread per connection moves bytes between the other end and the TLS socket, the only thread that
ever touches the TLS connection. Each direction buffers at most BUFFER_BYTES_MAX, then stops
reading its source: back-pressure passes through. Either side ending ends both.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading

log = logging.getLogger(__name__)
BUFFER_BYTES_MAX = 1 << 20
CHUNK_BYTES = 1 << 16


def tunnel(tls_sock: ssl.SSLSocket, name: str) -> socket.socket:
    """Start a pump for `tls_sock` (handshake done) and return the plain socket to use instead."""
    mine, theirs = socket.socketpair()
    TlsPump(tls_sock, mine, name).start()
    return theirs


class TlsPump(threading.Thread):
    def __init__(self, tls_sock: ssl.SSLSocket, plain: socket.socket, name: str) -> None:
        super().__init__(name=f"tls-{name}", daemon=True)
        self._tls, self._plain = tls_sock, plain
        self._to_plain = bytearray()
        self._to_tls = bytearray()
        self._tls_eof = self._plain_eof = False

    def run(self) -> None:
        self._tls.setblocking(False)
        self._plain.setblocking(False)
        sel = selectors.DefaultSelector()
        try:
            self._pump(sel)
        except (OSError, ValueError) as e:   # a reset, a TLS alert, a socket closed under us
            log.info("TLS connection %s ended: %s: %s", self.name, type(e).__name__, e)
        finally:
            sel.close()
            for s in (self._plain, self._tls):
                try:
                    s.close()
                except OSError:
                    pass

    def _pump(self, sel: selectors.BaseSelector) -> None:
        registered: dict[socket.socket, int] = {}
        while True:
            if not self._tls_eof:
                self._tls_eof = _receive(self._tls, self._to_plain)
            if not self._plain_eof:
                self._plain_eof = _receive(self._plain, self._to_tls)
            _send(self._tls, self._to_tls)
            _send(self._plain, self._to_plain)
            if self._done():
                return
            for sock, events in ((self._tls, _events(self._tls_eof, self._to_plain, self._to_tls)),
                                 (self._plain, _events(self._plain_eof, self._to_tls, self._to_plain))):
                if registered.get(sock) != events:
                    if sock in registered:
                        sel.unregister(sock)
                        del registered[sock]
                    if events:
                        sel.register(sock, events)
                        registered[sock] = events
            if not registered:
                return
            sel.select(timeout=30.0)

    def _done(self) -> bool:
        """Both directions finished: nothing more can arrive and everything was delivered."""
        return (self._tls_eof or self._plain_eof) and not self._to_plain and not self._to_tls


# Either socket may say "not now": the TLS one also when OpenSSL needs the other direction first.
_NOT_NOW = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError)


def _events(eof: bool, incoming: bytearray, outgoing: bytearray) -> int:
    """What to wait for on one socket: reading while it is open and what it fills (`incoming`)
    has room, writing while something waits to go out to it (`outgoing`)."""
    ev = 0
    if not eof and len(incoming) < BUFFER_BYTES_MAX:
        ev |= selectors.EVENT_READ
    if outgoing:
        ev |= selectors.EVENT_WRITE
    return ev


def _receive(sock: socket.socket, into: bytearray) -> bool:
    """Read what `sock` has (for TLS also what OpenSSL already decrypted) into `into`, up to
    BUFFER_BYTES_MAX; True at the end of its stream."""
    while len(into) < BUFFER_BYTES_MAX:
        try:
            data = sock.recv(CHUNK_BYTES)
        except _NOT_NOW:
            return False
        if not data:
            return True
        into += data
    return False


def _send(sock: socket.socket, buf: bytearray) -> None:
    """Write as much of `buf` as `sock` takes now, a chunk at a time, and drop what went."""
    while buf:
        try:
            n = sock.send(buf[:CHUNK_BYTES])
        except _NOT_NOW:
            return
        del buf[:n]
