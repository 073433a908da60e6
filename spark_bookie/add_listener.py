"""Adds over a plain TCP connection: the same AddBatch / AddBatchResponse messages as the gRPC
AddStream, framed by a 4-byte big-endian length, after a hello naming the bookie meant
(`ledger_client.protocol.add_framing`).

Why a second way in: a gRPC stream message costs each side a few hundred microseconds of Python
(the sync client's sender, channel-spin and reader threads per message, the aio server's per
message tasks), so at a few thousand small appends per second, where every add is its own
message, two cores were mostly busy with gRPC. BookKeeper itself frames protobuf on a TCP
connection; here a frame is one `data_received` on the server's loop and one `sendall` / `recv`
in the client. The gRPC AddStream stays for clients that ask for it
(ClientConfig.bookie_add_transport = "grpc").

A connection opened with READ_HELLO carries range and listed reads instead (ReadRangeRequest /
ReadRangeResponse, answered in any order by request_id): with ~450 KB answers the bookie spent
2.7 ms of CPU per MB here vs 3.2 on gRPC (its storage ~0.7), the client 1.2 vs 1.5, and in the
re-replication benchmark, where CPU is the bound, workers and bookies together over a quarter
less per ledger. Single-entry reads, long polls, LAC and fencing stay on gRPC.

Add rules are those of the gRPC stream: at most `in_flight_adds_max` adds of a connection wait for the
journal (more get ETOOMANYREQUESTS), and reading stops while the client does not take its answers
(reads too). Adds are answered from the journal thread, one frame per connection per journal
group, written straight to the socket while nothing is waiting in the transport's buffer (else
handed to the loop, which keeps the frames in order). A frame that does not parse, a length
over `message_bytes_max`, a wrong hello or another bookie's id closes that connection (logged);
the bookie goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import cast

from google.protobuf.message import DecodeError

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.add_framing import ADD_HELLO, LENGTH, READ_HELLO, FrameError, frame, next_frame

from .processor import RequestProcessor, add_groups, batch_size, group_failures
from .server import answer_read_range

log = logging.getLogger(__name__)
HELLO_ID_BYTES_MAX = 1024
READS_PER_CONNECTION_MAX = 64  # reads served at once per read connection; then its requests wait in the socket


class AddConnection(asyncio.Protocol):
    """One client connection; every method runs on the bookie's event loop."""

    def __init__(self, processor: RequestProcessor, bookie_id: str, in_flight_adds_max: int,
                 message_bytes_max: int, live: set[AddConnection]) -> None:
        self._p = processor
        self._live = live
        self._bookie_id = bookie_id
        self._in_flight_max = in_flight_adds_max
        self._bytes_max = message_bytes_max
        self._in_flight = 0
        self._buf = bytearray()
        self._hello = False
        self._reads = False  # a read connection (READ_HELLO)
        self._tasks: set[asyncio.Task[None]] = set()  # reads being served
        self._write_paused = False  # the client is not taking its answers
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        # Answers come from the journal thread (and refusals from the loop): the lock covers the
        # answer lists, the in-flight count and every write of an answer.
        self._out_lock = threading.RLock()
        self._ok: list[int] = []
        self._failed: list[pb.AddResponse] = []
        self._handed_off = 0  # answer frames (or their tails) given to the loop and not written yet
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = transport.get_extra_info("socket").fileno()
        self._transport = cast(asyncio.Transport, transport)
        self._peer = str(transport.get_extra_info("peername"))
        self._live.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        with self._out_lock:  # the socket is closed after this returns: no answer may write to it then
            self._transport = None  # answers still coming from the journal are dropped
        self._live.discard(self)

    def close(self) -> None:
        """Send what is already answered, then close (the bookie is stopping)."""
        self._send_answers()
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:  # the client is not reading its answers: stop reading its requests
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def _reads_full(self) -> bool:
        return len(self._tasks) >= READS_PER_CONNECTION_MAX

    def _update_reading(self) -> None:
        """Read requests only while the client takes its answers and, on a read connection, fewer
        than READS_PER_CONNECTION_MAX reads (answers of up to read_range_bytes_max) are served."""
        if self._transport is None:
            return
        if self._write_paused or self._reads_full():
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._hello and not self._check_hello():
            return
        self._parse()

    def _parse(self) -> None:
        """Handle the whole frames buffered (on a read connection: until its reads are full)."""
        buf, pos = self._buf, 0
        while not (self._reads and self._reads_full()):
            try:
                got = next_frame(buf, pos, self._bytes_max)
            except FrameError as e:
                self._drop(f"{e} (message_bytes_max)")
                return
            if got is None:
                break
            body, pos = got
            kind = pb.ReadRangeRequest if self._reads else pb.AddBatch
            try:
                msg = kind.FromString(body)
            except DecodeError as e:
                self._drop(f"frame is not a {kind.__name__}: {e}")
                return
            if self._reads:
                self._on_read(cast(pb.ReadRangeRequest, msg))
            else:
                self._on_batch(cast(pb.AddBatch, msg))
            if self._transport is None:
                return
        del buf[:pos]

    def _check_hello(self) -> bool:
        """ADD_HELLO or READ_HELLO, then a frame with the id of the bookie the client means (see
        add_framing)."""
        buf, k = self._buf, len(ADD_HELLO)
        head = bytes(buf[:k])
        if head not in (ADD_HELLO[:len(head)], READ_HELLO[:len(head)]):
            self._drop(f"not an add or read connection (hello {head!r})")
            return False
        self._reads = head == READ_HELLO
        try:
            got = next_frame(buf, k, HELLO_ID_BYTES_MAX) if len(buf) >= k else None
        except FrameError as e:
            self._drop(f"bookie id in the hello: {e}")
            return False
        if got is None:
            return False
        meant = got[0].decode(errors="replace")
        if meant != self._bookie_id:
            self._drop(f"connection meant for bookie {meant!r}, this is {self._bookie_id!r}")
            return False
        del buf[:got[1]]
        self._hello = True
        return True

    def _on_batch(self, batch: pb.AddBatch) -> None:
        n = batch_size(batch)
        with self._out_lock:
            full = self._in_flight + n > self._in_flight_max
            if not full:
                self._in_flight += n
        if full:
            detail = f"more than {self._in_flight_max} adds in flight on this connection"
            self._reply([], [f for g in add_groups(batch) for f in group_failures(g, pb.ETOOMANYREQUESTS, detail)],
                        counted=False)
            self._send_answers()
            return
        try:
            self._p.process_adds(batch, self._reply, self._send_answers)
        except Exception as e:  # a bug must not kill the bookie: answer EIO, as the gRPC path does
            log.exception("add batch from %s failed", self._peer)
            self._reply([], [f for g in add_groups(batch)
                             for f in group_failures(g, pb.EIO, f"internal error: {type(e).__name__}: {e}")])
            self._send_answers()

    def _on_read(self, req: pb.ReadRangeRequest) -> None:
        task = asyncio.ensure_future(self._read(req))
        self._tasks.add(task)  # a task nobody refers to may be collected before it ends
        task.add_done_callback(self._read_done)
        if self._reads_full():
            self._update_reading()

    def _read_done(self, task: asyncio.Task[None]) -> None:
        was_full = self._reads_full()
        self._tasks.discard(task)
        if was_full and self._transport is not None:
            self._update_reading()
            self._parse()  # requests that arrived while full wait in the buffer

    async def _read(self, req: pb.ReadRangeRequest) -> None:
        """One read, answered when it is done (so a slow disk read holds up only itself); the
        processor bounds the reads in flight (ETOOMANYREQUESTS)."""
        resp = await answer_read_range(self._p, req)
        resp.request_id = req.request_id
        if self._transport is not None:
            body = resp.SerializeToString()  # up to read_range_bytes_max: not copied once more into a frame
            self._transport.write(len(body).to_bytes(LENGTH, "big"))
            self._transport.write(body)

    def _reply(self, ok: list[int], failed: list[pb.AddResponse], counted: bool = True) -> None:
        """Collect answers (any thread); _send_answers sends them."""
        with self._out_lock:
            if counted:
                self._in_flight -= len(ok) + len(failed)
            self._ok.extend(ok)
            self._failed.extend(failed)

    def _send_answers(self) -> None:
        """Send the collected answers as one frame (any thread): straight to the socket while the
        transport holds nothing unsent, else through the loop, after what it holds."""
        with self._out_lock:
            ok, failed, transport = self._ok, self._failed, self._transport
            if transport is None or not (ok or failed):
                return
            self._ok, self._failed = [], []
            data = frame(pb.AddBatchResponse(ok_request_ids=ok, responses=failed).SerializeToString())
            if not self._handed_off and not transport.get_write_buffer_size():
                try:
                    sent = os.write(self._fd, data)
                except OSError:  # full (or broken: the transport meets that too and closes)
                    sent = 0
                if sent == len(data):
                    return
                data = data[sent:]
            self._handed_off += 1
            try:
                cast(asyncio.AbstractEventLoop, self._loop).call_soon_threadsafe(self._write_on_loop, data)
            except RuntimeError:  # the loop is closed: the bookie is gone, and with it the connection
                self._handed_off -= 1

    def _write_on_loop(self, data: bytes) -> None:
        with self._out_lock:
            self._handed_off -= 1
            if self._transport is not None:
                self._transport.write(data)

    def _drop(self, why: str) -> None:
        log.warning("closing %s connection from %s: %s", "read" if self._reads else "add", self._peer, why)
        with self._out_lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None


class AddListener:
    """The listening socket and its open connections; runs on the bookie's event loop."""

    def __init__(self, server: asyncio.Server, live: set[AddConnection]) -> None:
        self._server = server
        self._live = live
        self.port: int = server.sockets[0].getsockname()[1]

    def stop_accepting(self) -> None:
        self._server.close()

    def close(self) -> None:
        """Stop accepting and close every connection, so clients see the end at once instead of
        waiting out their add timeout on a socket nobody serves."""
        self._server.close()
        for conn in list(self._live):
            conn.close()


async def start_add_listener(processor: RequestProcessor, bookie_id: str, host: str, port: int,
                             in_flight_adds_max: int, message_bytes_max: int) -> AddListener:
    """Listen on host:port (0 = a port the OS picks; the bookie advertises it in GetBookieInfo)."""
    loop = asyncio.get_running_loop()
    live: set[AddConnection] = set()
    server = await loop.create_server(
        lambda: AddConnection(processor, bookie_id, in_flight_adds_max, message_bytes_max, live), host, port,
        reuse_address=True, backlog=128)
    return AddListener(server, live)
