"""One thread that reads the answers on all of a client's add connections (socket_stream).

A thread per connection blocked in recv meant, at 1,000 appends/s to three bookies, three
wake-ups per entry in the client and three threads taking the GIL from each other and from the
appending thread (~75 us of CPU per entry each). One thread waiting in a selector for all of
them takes an entry's answers, which arrive within a few hundred microseconds of each other,
in fewer wake-ups and on warm caches (~170 us for all three), and the number of threads no
longer grows with the number of bookies.

A connection is registered with two handlers. The thread reads what is there without blocking
(MSG_DONTWAIT: the socket stays blocking for its sender), splits the frames and calls
`on_frame(body)` for each; at the end of the stream, or when reading, framing or a handler fails,
it unregisters the connection and calls `on_end(detail)`. Handlers run on this thread, so they
must not block (the writer's completions do not: see WriteHandle.on_add_results). The owner
closes the socket only after the Event `register` returned is set, so its descriptor cannot be
reused by another connection while this thread may still read it.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable

from ..protocol.tcp_framing import next_frame

log = logging.getLogger(__name__)

RECV_BYTES = 1 << 18  # one recv takes all a busy bookie answered since the last one


class _Conn:
    __slots__ = ("sock", "on_frame", "on_end", "bytes_max", "buf", "done")

    def __init__(self, sock: socket.socket, on_frame: Callable[[bytes], None],
                 on_end: Callable[[str | None], None], bytes_max: int) -> None:
        self.sock = sock
        self.on_frame = on_frame
        self.on_end = on_end
        self.bytes_max = bytes_max
        self.buf = bytearray()
        self.done = threading.Event()


class AddReaders:
    """The reading thread of one client: started by the first `register` (again in a forked
    child, which does not inherit threads), stopped by `close`."""

    def __init__(self, name: str = "add-readers") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._sel: selectors.BaseSelector | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._pid = 0
        self._closed = False

    def register(self, sock: socket.socket, on_frame: Callable[[bytes], None],
                 on_end: Callable[[str | None], None], bytes_max: int) -> threading.Event:
        """Read `sock` from now on: `on_frame(body)` per frame, then once `on_end(None)` when the
        peer closed cleanly, `on_end(detail)` when the connection broke or the readers closed.
        The Event is set when neither will be called again. OSError once closed."""
        conn = _Conn(sock, on_frame, on_end, bytes_max)
        with self._lock:
            if self._closed:
                raise OSError(f"{self._name} is closed")
            self._running().register(sock, selectors.EVENT_READ, conn)
        return conn.done

    def _running(self) -> selectors.BaseSelector:
        """Under the lock: the selector of a live thread in this process."""
        if self._sel is None or self._pid != os.getpid():
            sel = self._sel = selectors.DefaultSelector()
            self._wake = socket.socketpair()
            self._wake[0].setblocking(False)
            sel.register(self._wake[0], selectors.EVENT_READ, None)
            self._pid = os.getpid()
            threading.Thread(target=self._run, args=(sel,), name=self._name, daemon=True).start()
        return self._sel

    def _run(self, sel: selectors.BaseSelector) -> None:
        detail = "the client was closed"
        try:
            self._serve(sel)
        except BaseException as e:  # a bug: fail what this thread served; the next register starts anew
            log.exception("%s failed", self._name)
            detail = f"{self._name} failed: {type(e).__name__}: {e}"
        with self._lock:
            conns = [k.data for k in sel.get_map().values() if k.data is not None]
            wake = self._wake
            if self._sel is sel:
                self._sel, self._wake = None, None
        for conn in conns:
            self._end(sel, conn, detail)
        sel.close()
        for s in wake or ():
            s.close()

    def _serve(self, sel: selectors.BaseSelector) -> None:
        chunk = bytearray(RECV_BYTES)
        view = memoryview(chunk)
        while not self._closed:
            for key, _ in sel.select():
                if key.data is not None:
                    self._read(sel, key.data, chunk, view)

    def _read(self, sel: selectors.BaseSelector, conn: _Conn, chunk: bytearray, view: memoryview) -> None:
        try:
            n = conn.sock.recv_into(chunk, RECV_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._end(sel, conn, f"{type(e).__name__}: {e}")
            return
        buf = conn.buf
        if not n:
            self._end(sel, conn, f"FrameError: connection closed inside a frame ({len(buf)} bytes left over)"
                      if buf else None)
            return
        buf += view[:n]
        pos = 0
        try:
            while (got := next_frame(buf, pos, conn.bytes_max)) is not None:
                body, pos = got
                conn.on_frame(body)
        except Exception as e:  # a bad frame, or a body the handler could not take
            self._end(sel, conn, f"{type(e).__name__}: {e}")
            return
        if pos:
            del buf[:pos]

    def _end(self, sel: selectors.BaseSelector, conn: _Conn, detail: str | None) -> None:
        with self._lock:
            try:
                sel.unregister(conn.sock)
            except (KeyError, ValueError, OSError):  # ValueError: the socket was closed already
                pass
        try:
            conn.on_end(detail)
        except Exception:
            log.exception("end of an add connection: handler raised; ignored")
        finally:
            conn.done.set()

    def close(self) -> None:
        """Stop the thread; connections still registered end with a detail saying so."""
        with self._lock:
            self._closed = True
            wake = self._wake if self._pid == os.getpid() else None
        if wake is not None:
            try:
                wake[1].send(b"x")
            except OSError:
                pass


DEFAULT_READERS = AddReaders("add-readers-default")  # for BookieClients made outside a pool
