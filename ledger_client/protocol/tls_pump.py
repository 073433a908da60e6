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
from collections.abc import Callable

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
            self._move(self._read_tls, self._read_plain)
            self._flush()
            if self._done():
                return
            for sock, events in ((self._tls, self._tls_events()), (self._plain, self._plain_events())):
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

    def _tls_events(self) -> int:
        ev = 0
        if not self._tls_eof and len(self._to_plain) < BUFFER_BYTES_MAX:
            ev |= selectors.EVENT_READ
        if self._to_tls:
            ev |= selectors.EVENT_WRITE
        return ev

    def _plain_events(self) -> int:
        ev = 0
        if not self._plain_eof and len(self._to_tls) < BUFFER_BYTES_MAX:
            ev |= selectors.EVENT_READ
        if self._to_plain:
            ev |= selectors.EVENT_WRITE
        return ev

    def _move(self, *readers: Callable[[], None]) -> None:
        for read in readers:
            read()

    def _read_tls(self) -> None:
        while not self._tls_eof and len(self._to_plain) < BUFFER_BYTES_MAX:
            try:
                data = self._tls.recv(CHUNK_BYTES)   # also what OpenSSL already decrypted (pending)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return
            if not data:
                self._tls_eof = True
                return
            self._to_plain += data

    def _read_plain(self) -> None:
        while not self._plain_eof and len(self._to_tls) < BUFFER_BYTES_MAX:
            try:
                data = self._plain.recv(CHUNK_BYTES)
            except BlockingIOError:
                return
            if not data:
                self._plain_eof = True
                return
            self._to_tls += data

    def _flush(self) -> None:
        while self._to_tls:
            try:
                n = self._tls.send(self._to_tls[:CHUNK_BYTES])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                break
            del self._to_tls[:n]
        while self._to_plain:
            try:
                n = self._plain.send(self._to_plain)
            except BlockingIOError:
                break
            del self._to_plain[:n]
