"""Frames to one client's socket, from any thread, in the order they are given, never blocking.

A frame is written straight to the socket without blocking (MSG_DONTWAIT). What the socket does not
take (a client that does not read its answers) waits in ``pending``, and a writer thread, started
for that case only, sends it in order; meanwhile later frames queue behind it. The owner decides
what to do while too much waits (stop reading that client's requests: back-pressure on it alone).

Both kinds of connection on the bookie's TCP port use it: an add connection answers from its own
thread and the journal's, a read connection from the event loop and, for a long poll, from the
thread that advanced the ledger's LAC (spark_bookie.server.lac), which answers it at once instead of
waking the loop. The lock may be the owner's, so that what it guards and the order of frames are
one: ``*_locked`` methods expect it held.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

from ledger_client.protocol.sockets import shutdown

CLOSE_WAIT_S = 5.0  # how long closing waits for a writer thread stuck on a client that does not read
STALLED_S = 600.0   # a non-blocking socket that takes nothing for this long is given up (a blocking
                    # one, an add connection's, waits as long as the client does not read)


def _send_all(sock: socket.socket, data: bytes) -> None:
    """sendall, for a blocking socket or a non-blocking one (a read connection's, which the event
    loop reads): waiting for room instead of failing. OSError when broken or stalled."""
    view = memoryview(data)
    deadline = time.monotonic() + STALLED_S
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the client took nothing for {STALLED_S:.0f} s") from None
            room = select.poll()   # not select(): descriptors past 1023
            room.register(sock, select.POLLOUT)
            room.poll(min(left, 1.0) * 1000)


class FrameOut:
    def __init__(self, sock: socket.socket, name: str, lock: threading.Lock | None = None,
                 on_drained: Callable[[], None] | None = None) -> None:
        """``on_drained``: called (by the writer thread, without the lock) once what waited was sent."""
        self._sock = sock
        self._name = name
        self._lock = lock if lock is not None else threading.Lock()
        self.drained = threading.Condition(self._lock)   # notified when pending empties or on close
        self._on_drained = on_drained
        self._pending = bytearray()
        self._writer: threading.Thread | None = None
        self.closed = False

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def send(self, *parts: bytes) -> None:
        with self._lock:
            self.send_locked(*parts)

    def send_locked(self, *parts: bytes) -> None:
        """Write ``parts`` (one frame, in pieces: a big answer is not copied to join them) now,
        or after what waits; nothing once closed."""
        if self.closed:
            return
        if self._writer is None:
            try:
                sent = self._sock.sendmsg(parts, (), socket.MSG_DONTWAIT) if len(parts) > 1 \
                    else self._sock.send(parts[0], socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:  # broken: whoever reads the connection meets it too and ends it
                shutdown(self._sock)
                return
            if sent == sum(map(len, parts)):
                return
            data = (parts[0] if len(parts) == 1 else b"".join(parts))[sent:]
            self._writer = threading.Thread(target=self._write_pending, name=f"answers-{self._name}", daemon=True)
            self._writer.start()
            self._pending += data
            return
        for part in parts:
            self._pending += part

    def _write_pending(self) -> None:
        """Send what waits, blocking, until nothing does (or the connection is closed)."""
        while True:
            with self._lock:
                data, self._pending = bytes(self._pending), bytearray()
                self.drained.notify_all()   # what waited is taken: the owner may read requests again
                if not data or self.closed:
                    self._writer = None
                    break
            try:
                _send_all(self._sock, data)
            except OSError:
                shutdown(self._sock)
                with self._lock:
                    self._writer = None
                    self._pending.clear()
                    self.drained.notify_all()
                break
        if self._on_drained is not None:
            self._on_drained()

    def close(self, join: bool = True) -> None:
        """No more frames; shut the socket down (which wakes a writer stuck on a client that does
        not read) and, with ``join``, wait for the writer thread: the owner may then close the
        socket."""
        with self._lock:
            self.closed = True
            writer = self._writer
            self.drained.notify_all()
        shutdown(self._sock)
        if join and writer is not None:
            writer.join(CLOSE_WAIT_S)
