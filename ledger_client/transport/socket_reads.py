"""Range and listed reads of one bookie over its TCP port (a connection opened with READ_HELLO,
see spark_bookie.server.tcp_listener): the answers that carry the most bytes. On gRPC they cost the
client ~1.5 ms of CPU per MB and the bookie ~3.2 (here: 1.2 and 2.7), and gRPC's threads
competed for the GIL with the work around them (a re-replication used over a quarter more CPU).

One connection per bookie, opened by the first read that needs it (on the caller's thread: the
caller waits for its answer anyway) and shared by every thread; requests are written under a
lock, and a reader thread hands each answer to the Future of its request_id. A broken connection
fails every read it carried with BookieUnavailableError; the next read opens a new one. Reads
whose deadline passed are failed with LedgerTimeoutError when the next read is sent (their
callers gave up on them already), so a bookie that never answers cannot grow the table.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from google.protobuf.message import DecodeError

from .. import errors
from ..protocol import bookkeeper_pb2 as pb
from ..protocol.tcp_framing import READ_HELLO, FrameError, frame, read_frames
from .credentials import PresentedToken
from .sockets import greet, shutdown


class SocketReads:
    """`endpoint()` returns (host, port) of the bookie's TCP port and may raise; `forget()` is
    called when a connection led nowhere (refused, or closed before any answer: the port may now
    be another bookie's), so the next read asks for the port again."""

    def __init__(self, address: str, endpoint: Callable[[], tuple[str, int]], forget: Callable[[], None],
                 timeout_s: float, message_bytes_max: int, token: Callable[[], str | None] = lambda: None,
                 secure: Callable[[socket.socket, str], socket.socket] | None = None) -> None:
        self._address = address
        self._token = PresentedToken(token)
        self._secure = secure  # TLS on a connected socket (sockets.tls_client), None for plain TCP
        self._endpoint = endpoint
        self._forget = forget
        self._timeout_s = timeout_s
        self._bytes_max = message_bytes_max
        self._lock = threading.Lock()       # the connection and the table of pending reads
        self._send_lock = threading.Lock()  # one writer of frames at a time
        self._sock: socket.socket | None = None
        self._pending: dict[int, tuple[Future[pb.ReadRangeResponse], float]] = {}
        self._ids = itertools.count(1)
        self._closed = False

    def submit(self, req: pb.ReadRangeRequest) -> Future[pb.ReadRangeResponse]:
        """Send `req` (its request_id is set here); the Future fails with BookieUnavailableError
        when the connection breaks, LedgerTimeoutError once its deadline passed."""
        fut: Future[pb.ReadRangeResponse] = Future()
        now = time.monotonic()
        with self._lock:
            late = self._expired(now)
        for f in late:
            _settle(f, errors.LedgerTimeoutError(f"{self._address}: no answer to a read in {self._timeout_s:.0f}s"))
        with self._lock:
            if self._closed:
                raise errors.BookieUnavailableError(f"client of {self._address} is closed")
            sock = self._sock if self._sock is not None else self._connect()
            rid = next(self._ids)
            req.request_id = rid
            rotated = self._token.rotated()
            if rotated:
                req.auth_token = rotated
            self._pending[rid] = (fut, now + self._timeout_s)
        data = frame(req.SerializeToString())
        # Not under _lock: a send blocked by a bookie that stopped reading must not keep the reader
        # from taking answers (which is what makes the bookie read again).
        with self._send_lock:
            try:
                sock.sendall(data)
            except OSError:
                shutdown(sock)  # the reader fails what the connection carried, this read included
        return fut

    def _connect(self) -> socket.socket:
        """Under the lock: a new connection and its reader thread."""
        try:
            host, port = self._endpoint()
            if not port:
                raise ConnectionError("it has no TCP port (use read transport 'grpc')")
            sock = socket.create_connection((host, port), timeout=self._timeout_s)
            if self._secure is not None:
                sock = self._secure(sock, host)
        except errors.UnauthorizedAccessError:
            raise
        except (OSError, errors.LedgerError) as e:
            self._forget()
            raise errors.BookieUnavailableError(f"read connection to {self._address}: {e}") from e
        try:
            greet(sock, READ_HELLO, self._address, self._token.at_hello())  # deadlines are per read (see _expired)
        except OSError as e:
            raise errors.BookieUnavailableError(f"read connection to {self._address}: {e}") from e
        self._sock = sock
        threading.Thread(target=self._read, args=(sock,), name=f"read-{self._address}", daemon=True).start()
        return sock

    def _read(self, sock: socket.socket) -> None:
        answered = False
        try:
            for body in read_frames(sock, self._bytes_max):
                resp = pb.ReadRangeResponse.FromString(body)
                answered = True
                with self._lock:
                    got = self._pending.pop(resp.request_id, None)
                if got is not None:
                    _settle(got[0], resp)
            detail = f"bookie {self._address} closed the read connection"
        except (OSError, FrameError, DecodeError) as e:
            detail = f"read connection to {self._address} failed: {type(e).__name__}: {e}"
        with self._lock:
            if self._sock is sock:
                self._sock = None
            pending, self._pending = self._pending, {}
        if not answered:
            self._forget()
        for fut, _ in pending.values():
            _settle(fut, errors.BookieUnavailableError(detail))
        shutdown(sock)
        sock.close()

    def _expired(self, now: float) -> list[Future[pb.ReadRangeResponse]]:
        """Under the lock: take out the reads whose deadline passed (failed outside it)."""
        late = [rid for rid, (_, deadline) in self._pending.items() if deadline < now]
        return [self._pending.pop(rid)[0] for rid in late]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock = self._sock
        if sock is not None:
            shutdown(sock)  # the reader fails what is pending and closes it


def _settle(fut: Future[pb.ReadRangeResponse], outcome: pb.ReadRangeResponse | BaseException) -> None:
    """Complete `fut` unless its caller cancelled it meanwhile."""
    try:
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
    except InvalidStateError:
        pass

