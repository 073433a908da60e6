"""The bookie's TCP port for adds and range reads: the same AddBatch / AddBatchResponse messages
as the gRPC AddStream, framed by a 4-byte big-endian length, after a hello naming the bookie meant
(`ledger_client.protocol.tcp_framing`).

Why a second way in: a gRPC stream message costs each side a few hundred microseconds of Python
(the sync client's sender, channel-spin and reader threads per message, the aio server's per
message tasks), so at a few thousand small appends per second, where every add is its own
message, two cores were mostly busy with gRPC. BookKeeper itself frames protobuf on a TCP
connection. The gRPC AddStream stays for clients that ask for it
(ClientConfig.bookie_add_transport = "grpc").

A thread accepts connections; each gets a thread that reads its hello (within HELLO_TIMEOUT_S).
An add connection stays on that thread (spark_bookie.server.add_connection: why a thread). A connection
opened with READ_HELLO carries range and listed reads, range long polls included, and is handed to
the bookie's event loop (spark_bookie.server.read_connection). Single-entry reads and their long
polls, LAC reads and fencing stay on gRPC.

Add rules are those of the gRPC stream: at most `in_flight_adds_max` adds of a connection wait for
the journal (more get ETOOMANYREQUESTS), and reading stops while the client does not take its
answers (reads too). A frame that does not parse, a length over `message_bytes_max`, a wrong hello
or another bookie's id closes that connection (logged); the bookie goes on.

With token authentication on (spark_bookie.server.auth), the hello must carry a token the bookie
accepts (version 2 of the hello), and a request is served only while that token (or a newer one
the client sent on the connection) has not expired (ConnectionAccess); otherwise the connection
is kept open but every request on it is answered EUA and none is served, so the client learns
why (UnauthorizedAccessError) rather than seeing a bookie that looks dead and replacing it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

from ledger_client.protocol.sockets import shutdown
from ledger_client.protocol.tcp_framing import HELLOS, LENGTH
from ledger_client.protocol.tls_pump import tunnel
from spark_bookie.server.add_connection import AddConnection
from spark_bookie.server.auth import ConnectionAccess, TokenVerifier
from spark_bookie.server.processor import RequestProcessor
from spark_bookie.server.read_connection import ReadConnection

log = logging.getLogger(__name__)
HELLO_ID_BYTES_MAX = 1024
HELLO_TOKEN_BYTES_MAX = 16 * 1024  # a JWT of a few claims is a few hundred bytes (RS256: ~600)
HELLO_TIMEOUT_S = 10.0  # a connection that has not said hello by then is closed
CONNECTIONS_MAX = 1024  # open add and read connections per bookie; more are closed at once (logged)
CLOSE_WAIT_S = 5.0  # how long close() waits for the connections' threads to end
ACCEPT_RETRY_S = 0.1  # after a failed accept (out of file descriptors, say), before the next


class TcpListener:
    """The listening socket, its accept thread and the open connections. Thread-safe."""

    def __init__(self, sock: socket.socket, processor: RequestProcessor, bookie_id: str, in_flight_adds_max: int,
                 message_bytes_max: int, loop: asyncio.AbstractEventLoop,
                 verifier: TokenVerifier | None = None, tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        self._sock = sock
        self._verifier = verifier  # None: no authentication
        self._tls = tls            # None: plain TCP; else the context of each new connection
        self._p = processor
        self._bookie_id = bookie_id
        self._in_flight_max = in_flight_adds_max
        self._bytes_max = message_bytes_max
        self._loop = loop
        self._lock = threading.Lock()
        self._live: set[AddConnection | ReadConnection | socket.socket] = set()  # sockets: saying hello
        self._threads: set[threading.Thread] = set()  # one per connection until it is served or handed on
        self._closing = False
        self._stopped = False  # stop_accepting was called
        self.port: int = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name=f"add-accept-{self.port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self._sock.accept()
            except OSError as e:
                if self._stopped:  # stop_accepting shut the socket down
                    break
                log.warning("accepting on the add port %d: %s", self.port, e)  # e.g. out of file descriptors
                time.sleep(ACCEPT_RETRY_S)
                continue
            with self._lock:
                refused = self._closing or len(self._live) >= CONNECTIONS_MAX
                if not refused:
                    self._live.add(conn)
            if refused:
                log.warning("closing connection from %s: %d connections open (the most a bookie serves) "
                            "or the bookie is stopping", addr, CONNECTIONS_MAX)
                conn.close()
                continue
            thread = threading.Thread(target=self._serve, args=(conn, str(addr)), name=f"add-conn-{addr[1]}",
                                      daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        self._sock.close()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        """Hello, then serve adds on this thread or hand a read connection to the loop."""
        try:
            self._serve_one(conn, peer)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _serve_one(self, conn: socket.socket, peer: str) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(HELLO_TIMEOUT_S)  # covers the TLS handshake too
            if self._tls is not None:
                conn = self._tunnel(self._tls(), conn, peer)
                conn.settimeout(HELLO_TIMEOUT_S)
            reads, token = _hello(conn, self._bookie_id)
            conn.settimeout(None)
        except (OSError, HelloError) as e:
            log.warning("closing add connection from %s: %s", peer, e)  # the add port's, whatever it meant
            self._forget(conn)
            conn.close()
            return
        access = self._access(token, peer)
        if reads:
            self._start_reads(conn, peer, access)
            return
        handler = AddConnection(conn, peer, self._p, self._in_flight_max, self._bytes_max, access)
        if not self._swap(conn, handler):
            handler.close()
        try:
            handler.serve()
        finally:
            self._forget(handler)

    def _tunnel(self, context: ssl.SSLContext, conn: socket.socket, peer: str) -> socket.socket:
        """TLS handshake (a client certificate checked if the context requires one), then the plain
        end of a pump to serve instead (see tls_pump); OSError (ssl.SSLError) when it fails."""
        tls_sock = context.wrap_socket(conn, server_side=True)   # detaches conn: nothing left to close
        plain = tunnel(tls_sock, peer)
        with self._lock:
            self._live.discard(conn)
            self._live.add(plain)
        return plain

    def _access(self, token: str | None, peer: str) -> ConnectionAccess | None:
        """What decides whether the connection of the client with `token` is served (a refusal
        is logged); None when the bookie checks no tokens."""
        if self._verifier is None:
            return None
        access = ConnectionAccess(self._verifier, token)
        why = access.refusal()
        if why is not None:
            log.warning("refusing the requests of the connection from %s: %s", peer, why)
        return access

    def _start_reads(self, conn: socket.socket, peer: str, access: ConnectionAccess | None) -> None:
        def made() -> ReadConnection:
            protocol = ReadConnection(self._p, self._bytes_max, peer, self._forget, access, conn)
            if not self._swap(conn, protocol):
                self._loop.call_soon(protocol.close)
            return protocol

        def failed(fut: concurrent.futures.Future[tuple[asyncio.Transport, ReadConnection]]) -> None:
            if not fut.cancelled() and fut.exception() is not None:
                log.warning("read connection from %s not served: %s", peer, fut.exception())
                self._forget(conn)
                conn.close()

        try:
            asyncio.run_coroutine_threadsafe(self._loop.connect_accepted_socket(made, conn),
                                             self._loop).add_done_callback(failed)
        except RuntimeError:  # the loop is closed: the bookie is gone
            self._forget(conn)
            conn.close()

    def _swap(self, old: socket.socket, new: AddConnection | ReadConnection) -> bool:
        """Replace a connection saying hello by its handler; False if the listener is closing."""
        with self._lock:
            self._live.discard(old)
            if self._closing:
                return False
            self._live.add(new)
            return True

    def _forget(self, what: AddConnection | ReadConnection | socket.socket) -> None:
        with self._lock:
            self._live.discard(what)

    def stop_accepting(self) -> None:
        self._stopped = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread, which closes the socket
        except OSError:
            pass

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop accepting and close every connection, so clients see the end at once instead of
        waiting out their add timeout on a socket nobody serves; then wait (up to `wait_s`) for
        the connections' threads, so that no add is applied after the bookie stopped serving."""
        self.stop_accepting()
        with self._lock:
            self._closing = True
            live = list(self._live)
            threads = list(self._threads)
        for c in live:
            if isinstance(c, socket.socket):
                shutdown(c)
            elif isinstance(c, ReadConnection):
                try:
                    self._loop.call_soon_threadsafe(c.close)
                except RuntimeError:  # the loop is closed, and with it the connection
                    pass
            else:
                c.close()
        deadline = time.monotonic() + wait_s
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


class HelloError(Exception):
    """The connection did not open with a valid hello for this bookie."""


def _hello(conn: socket.socket, bookie_id: str) -> tuple[bool, str | None]:
    """Read a hello (tcp_framing.HELLOS), a frame with the id of the bookie the client means and,
    in version 2, one with its token, and not a byte more: (a read connection?, the token)."""
    head = _recv_exact(conn, len(next(iter(HELLOS))))
    kind = HELLOS.get(head)
    if kind is None:
        raise HelloError(f"not an add or read connection (hello {head!r})")
    meant = _recv_frame(conn, HELLO_ID_BYTES_MAX, "bookie id").decode(errors="replace")
    if meant != bookie_id:
        raise HelloError(f"connection meant for bookie {meant!r}, this is {bookie_id!r}")
    reads, has_token = kind
    token = _recv_frame(conn, HELLO_TOKEN_BYTES_MAX, "token").decode(errors="replace") if has_token else None
    return reads, token or None


def _recv_frame(conn: socket.socket, bytes_max: int, what: str) -> bytes:
    n = int.from_bytes(_recv_exact(conn, LENGTH), "big")
    if n > bytes_max:
        raise HelloError(f"{what} in the hello: frame of {n} bytes is over the limit of {bytes_max}")
    return _recv_exact(conn, n)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = conn.recv(n - len(out))
        if not data:
            raise HelloError(f"closed during the hello ({len(out)} of {n} bytes)")
        out += data
    return bytes(out)


async def start_tcp_listener(processor: RequestProcessor, bookie_id: str, host: str, port: int,
                             in_flight_adds_max: int, message_bytes_max: int,
                             verifier: TokenVerifier | None = None,
                             tls: Callable[[], ssl.SSLContext] | None = None) -> TcpListener:
    """Listen on host:port (0 = a port the OS picks; the bookie advertises it in GetBookieInfo).
    Runs on the bookie's loop, which then serves the read connections."""
    family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    sock = socket.create_server(addr, family=family, backlog=128)
    return TcpListener(sock, processor, bookie_id, in_flight_adds_max, message_bytes_max,
                       asyncio.get_running_loop(), verifier, tls)
