"""Adds to one bookie over its TCP add listener (spark_bookie.server.tcp_listener, framing in
ledger_client.protocol.tcp_framing): the same batches and answers as the gRPC AddStream at a
fraction of the CPU per message, which is what decides latency when appends arrive one by one.

A sender thread per connection resolves the bookie's add port, connects, then writes what
`_batches()` yields (it batches whatever queued meanwhile); the answers are read by the client's
one reading thread (add_readers), shared by all its connections. An add that finds nothing
unanswered and nothing queued is written by the appending thread itself: at 1,000 appends/s that
was about half of them, and waking the sender for each cost ~70 us of CPU per bookie per add (and
the wake-up's latency). The connection is made on the sender thread so that an append never
blocks on a connect; a failure to resolve or connect, a reset, or a frame that does not parse
fails every pending add with BookieUnavailableError (asynchronously, as a broken gRPC stream
does), and the next add to the bookie opens a new connection.

One exception, for the failure a writer most needs to know at once: when the add port is already
known and numeric, the appending thread starts the connect itself without blocking, and a refusal
the kernel already knows (a dead bookie on this host: always, before connect() returns) raises
BookieUnavailableError from the add. The writer then starts its ensemble change before any entry
sent after the death can complete on the live bookies alone.
"""

from __future__ import annotations

import errno
import select
import socket
import threading
from collections.abc import Callable

from .. import errors
from ..protocol import bookkeeper_pb2 as pb
from ..protocol.tcp_framing import ADD_HELLO, add_batch_frame
from .add_readers import DEFAULT_READERS, AddReaders
from .add_stream import LAC_ITEM, TRANSPORT_FAILURE, AddStream, StreamLimits
from .credentials import PresentedToken
from .sockets import greet, shutdown


class SocketAddStream(AddStream):
    """`resolve()` returns (host, add port) of the bookie (0: it has none) and may raise; `known`
    is that answer from an earlier connection, if any (see the module's note on refusals);
    `forget()` is called when the connection led nowhere (not made, or ended before any answer:
    the port may now be another bookie's), as socket_reads does."""

    def __init__(self, limits: StreamLimits, address: str, resolve: Callable[[], tuple[str, int]],
                 forget: Callable[[], None], connect_timeout_s: float, message_bytes_max: int,
                 known: tuple[str, int] | None = None, readers: AddReaders = DEFAULT_READERS,
                 token: Callable[[], str | None] = lambda: None,
                 secure: Callable[[socket.socket, str], socket.socket] | None = None) -> None:
        """`secure`: TLS on a connected socket (sockets.tls_client), None for plain TCP."""
        super().__init__(limits, address)
        self._token = PresentedToken(token)
        self._secure = secure
        self._readers = readers
        self._resolve = resolve
        self._forget = forget
        self._connect_timeout_s = connect_timeout_s
        self._bytes_max = message_bytes_max
        # raises OSError; with TLS the connect happens on the sender thread (the handshake blocks)
        self._early = _start_connect(*known) if known and secure is None else None
        self._sock: socket.socket | None = None
        self._answered_any = False
        self._send_lock = threading.Lock()  # one writer of frames at a time
        self._closed = threading.Event()
        self._sender = threading.Thread(target=self._send_all, name=f"add-send-{address}", daemon=True)
        self._sender.start()

    def _connect(self) -> socket.socket:
        if self._early is not None:
            sock, self._early = self._early, None
            _finish_connect(sock, self._connect_timeout_s)
        else:
            host, port = self._resolve()
            if not port:
                raise ConnectionError(f"bookie {self._address} has no TCP add port (use add transport 'grpc')")
            sock = socket.create_connection((host, port), timeout=self._connect_timeout_s)
            if self._secure is not None:
                sock = self._secure(sock, host)
        # Deadlines are the writer's (add_timeout_ms replaces a silent bookie).
        greet(sock, ADD_HELLO, self._address, self._token.at_hello())
        return sock

    def _send_all(self) -> None:
        try:
            sock = self._connect()
        except Exception as e:  # resolve (an RPC) or connect: the bookie is not reachable now
            self._forget()
            status = pb.EUA if isinstance(e, errors.UnauthorizedAccessError) else TRANSPORT_FAILURE
            self._fail(f"add connection to {self._address} failed: {type(e).__name__}: {e}", status)
            return
        self._sock = sock
        if self._closed.is_set():  # closed while connecting
            sock.close()
            return
        try:
            read_done = self._readers.register(sock, self._on_frame, self._on_end, self._bytes_max)
        except OSError as e:  # the client is closing
            sock.close()
            self._fail(f"add connection to {self._address}: {e}")
            return
        try:
            for items in self._batches():
                columns, lacs = self._columns(items)
                data = add_batch_frame(columns, self._token.rotated(), lacs)
                with self._send_lock:
                    sock.sendall(data)
        except OSError as e:
            self._fail(f"add connection to {self._address} broke while sending: {e}")
        self._shutdown()
        read_done.wait()
        sock.close()  # here, once the reading thread is done with it

    def dispatch(self, item: tuple[int, int, bytes, bytes, int, int]) -> None:
        if not self._sent_now(item):
            self._q.put(item)

    def _sent_now(self, item: tuple[int, int, bytes, bytes, int, int]) -> bool:
        """Write the add from this thread if nothing is queued and the window lets it go now (it
        would go at once anyway). Only what the socket buffer does not take blocks this thread, as
        it would the sender. A failure here only shuts the socket down: the reader fails the
        pending adds from its own thread, never inside the caller's locks."""
        sock = self._sock
        # An announced LAC goes past the window (nothing answers it, and it is small): held back, it
        # would wait for this bookie's answer to the entry it confirms, while readers may poll here.
        held = self._held if item[4] != LAC_ITEM else _never
        if sock is None or not self._q.empty() or held() or not self._send_lock.acquire(blocking=False):
            return False
        try:
            if held() or not self._q.empty() or self.broken is not None:
                return False
            columns, lacs = self._columns([item])
            data = add_batch_frame(columns, self._token.rotated(), lacs)
            try:
                try:
                    sent = sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                if sent < len(data):
                    sock.sendall(data[sent:])
            except OSError:
                self._shutdown()
            return True
        finally:
            self._send_lock.release()

    def _on_frame(self, body: bytes) -> None:
        """On the reading thread (add_readers): one answer message."""
        self._on_response(pb.AddBatchResponse.FromString(body))
        self._answered_any = True

    def _on_end(self, detail: str | None) -> None:
        """On the reading thread: the connection ended (detail None: the bookie closed it)."""
        if not self._answered_any:
            self._forget()
        self._fail(detail and f"add connection to {self._address} failed: {detail}"
                   or f"bookie {self._address} closed the add connection")
        self._shutdown()

    def _fail(self, detail: str, status: int = TRANSPORT_FAILURE) -> None:
        super()._fail(detail, status)
        self.close()  # ends the sender's request loop too

    def _shutdown(self) -> None:
        shutdown(self._sock)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            super().close()
        self._shutdown()


def _never() -> bool:
    return False


def _start_connect(host: str, port: int) -> socket.socket | None:
    """A non-blocking connect begun on the caller's thread; None for a host name (its lookup may
    block, so the sender thread does it). Raises OSError for a refusal already known."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_NUMERICHOST)[0]
    except socket.gaierror:
        return None
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    err = sock.connect_ex(addr)
    if err == errno.EINPROGRESS and select.select([], [sock], [], 0)[1]:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err not in (0, errno.EINPROGRESS, errno.EISCONN):
        sock.close()
        raise OSError(err, f"add port {host}:{port}: {errno.errorcode.get(err, err)}")
    return sock


def _finish_connect(sock: socket.socket, timeout_s: float) -> None:
    """Wait for a connect `_start_connect` began; then the socket blocks, as create_connection's."""
    try:
        if not select.select([], [sock], [], timeout_s)[1]:
            raise TimeoutError(f"connect did not finish in {timeout_s:.1f}s")
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, errno.errorcode.get(err, str(err)))
        sock.setblocking(True)
    except OSError:
        sock.close()
        raise
