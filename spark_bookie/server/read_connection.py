"""A read connection of the bookie's TCP port after its hello (spark_bookie.server.tcp_listener):
range and listed reads (ReadRangeRequest / ReadRangeResponse, answered in any order by request_id).

Requests are read and served on the bookie's event loop, as on gRPC: with ~450 KB answers the
bookie spent 2.7 ms of CPU per MB here vs 3.2 on gRPC. Answers are written by a FrameOut
(spark_bookie.server.frame_out), from any thread, because a tail's long poll (wait_for_lac) that
has to wait is answered by the thread that raises the ledger's LAC (spark_bookie.server.lac): an
add connection's, the moment it takes an entry or an announced LAC. Waking the loop for it cost
0.1-0.4 ms at 1,000 records/s on this 2-core host, and a task's resumption and the answer's
write on the loop another 0.1-0.2 ms, most of a tailing reader's wait after the writer's
acknowledgement. That thread answers from the write cache and from grant decisions already
cached; when either is missing, or the poll times out, the loop answers it as before.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import cast

from google.protobuf.message import DecodeError

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import LENGTH, FrameError, next_frame
from metadata.tenancy import Caller
from spark_bookie.errors import BookieError
from spark_bookie.server.auth import ConnectionAccess
from spark_bookie.server.frame_out import FrameOut
from spark_bookie.server.processor import RequestProcessor
from spark_bookie.server.service import answer_read_range

log = logging.getLogger(__name__)
READS_PER_CONNECTION_MAX = 64  # reads served at once per read connection; then its requests wait in the socket
PENDING_BYTES_MAX = 4 << 20    # answers the client has not taken; above it the connection reads no more


class ReadConnection(asyncio.Protocol):
    """Every method runs on the bookie's event loop but ``_send`` and ``_poll_ready``, which run
    on any thread. ``sock``: the connection's socket, for answers from other threads (None, as
    in tests with a stand-in transport: every answer is written by the transport on the loop)."""

    def __init__(self, processor: RequestProcessor, message_bytes_max: int, peer: str,
                 on_lost: Callable[[ReadConnection], None], access: ConnectionAccess | None = None,
                 sock: socket.socket | None = None) -> None:
        self._p = processor
        self._access = access  # whether this connection's client is served (auth; None: no checks)
        self._bytes_max = message_bytes_max
        self._peer = peer
        self._on_lost = on_lost
        self._buf = bytearray()
        self._tasks: set[asyncio.Task[None]] = set()  # reads being served
        self._polls = 0           # long polls waiting for a LAC outside any task (loop only)
        self._write_paused = False  # the client is not taking its answers
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out = None if sock is None else FrameOut(sock, f"read-{peer}", on_drained=self._drained)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._out is not None:
            self._out.close(join=False)   # a writer thread still sending ends on the closed socket
        self._on_lost(self)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:  # the client is not reading its answers: stop reading its requests
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def _drained(self) -> None:
        """The FrameOut's writer sent what waited (its thread): read requests again, on the loop."""
        self._call_on_loop(self._update_reading)

    def _full(self) -> bool:
        return len(self._tasks) + self._polls >= READS_PER_CONNECTION_MAX

    def _update_reading(self) -> None:
        """Read requests only while the client takes its answers and fewer than
        READS_PER_CONNECTION_MAX reads (answers of up to read_range_bytes_max) are served."""
        if self._transport is None:
            return
        backlog = self._out is not None and self._out.pending_bytes > PENDING_BYTES_MAX
        if self._write_paused or backlog or self._full():
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._parse()

    def _parse(self) -> None:
        """Start the reads of the whole frames buffered, until the connection's reads are full."""
        buf, pos = self._buf, 0
        while not self._full():
            try:
                got = next_frame(buf, pos, self._bytes_max)
            except FrameError as e:
                self._drop(f"{e} (message_bytes_max)")
                return
            if got is None:
                break
            body, pos = got
            try:
                req = pb.ReadRangeRequest.FromString(body)
            except DecodeError as e:
                self._drop(f"frame is not a ReadRangeRequest: {e}")
                return
            why = None if self._access is None else self._access.refusal(req.auth_token)
            if why is not None:
                self._refuse(req, why)
                continue
            task = asyncio.ensure_future(self._read(req))
            self._tasks.add(task)  # a task nobody refers to may be collected before it ends
            task.add_done_callback(self._read_done)
        if self._full():
            self._update_reading()
        del buf[:pos]

    def _read_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._reads_went_down()

    def _reads_went_down(self) -> None:
        if self._transport is not None and not self._full():
            self._update_reading()
            self._parse()  # requests that arrived while full wait in the buffer

    async def _read(self, req: pb.ReadRangeRequest, wait: bool = True) -> None:
        """One read, answered when it is done (so a slow disk read holds up only itself); the
        processor bounds the reads in flight (ETOOMANYREQUESTS). A long poll that has to wait is
        answered later, from another thread (``_poll_later``); ``wait`` False: not again."""
        caller = None if self._access is None else self._access.caller
        if wait and req.wait_for_lac and not req.entry_ids and self._out is not None \
                and await self._poll_later(req, caller):
            return
        if not wait:
            req.timeout_ms = 0   # the LAC is past, or the poll timed out: answer with it at once
        resp = await answer_read_range(self._p, req, caller)
        self._send(resp, req.request_id)

    async def _poll_later(self, req: pb.ReadRangeRequest, caller: Caller | None) -> bool:
        """Whether the poll was left waiting for the LAC, with its answer to come from the thread
        that raises it or from its timeout; False: the loop answers it now (a refusal, a bad
        request, the LAC already past, no timeout)."""
        started = time.perf_counter()
        try:
            max_bytes, timeout_s = await self._p.prepare_poll(req, caller)
        except BookieError:
            return False   # read_range gives the same refusal as the answer
        if timeout_s <= 0:
            return False
        lid = req.ledger_id
        once = threading.Lock()   # the poll is answered once: by _poll_ready or by the timeout

        def ready(lac: int) -> None:
            if once.acquire(blocking=False):
                self._poll_ready(req, lac, max_bytes, caller, started)

        if self._p.lac.call_when_past(lid, req.previous_lac, ready) is not None:
            return False
        self._polls += 1

        def expire() -> None:
            if self._p.lac.drop(lid, ready) and once.acquire(blocking=False):
                self._poll_answered(req, None)

        asyncio.get_running_loop().call_later(timeout_s, expire)
        return True

    def _poll_ready(self, req: pb.ReadRangeRequest, lac: int, max_bytes: int, caller: Caller | None,
                    started: float) -> None:
        """On the thread that raised the LAC: the answer from what is at hand, else by the loop."""
        try:
            resp = self._p.tail_answer(req, lac, max_bytes, caller, started)
        except Exception:   # a bug must not break the thread that took the adds: the loop answers
            log.exception("long poll of ledger %d: answering from the LAC's thread failed", req.ledger_id)
            resp = None
        if resp is not None:
            self._send(resp, req.request_id)
        self._call_on_loop(self._poll_answered, req, resp)

    def _poll_answered(self, req: pb.ReadRangeRequest, resp: pb.ReadRangeResponse | None) -> None:
        """On the loop: a waiting poll is done; without its answer (``resp`` None) the loop gives it."""
        self._polls -= 1
        if resp is None and self._transport is not None:
            task = asyncio.ensure_future(self._read(req, wait=False))
            self._tasks.add(task)
            task.add_done_callback(self._read_done)
        else:
            self._reads_went_down()

    def _call_on_loop(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed: the bookie is stopping
                pass

    def _send(self, resp: pb.ReadRangeResponse, request_id: int) -> None:
        """Any thread when the connection has its socket; the loop's only otherwise."""
        resp.request_id = request_id
        body = resp.SerializeToString()  # up to read_range_bytes_max
        if self._out is not None:
            self._out.send(len(body).to_bytes(LENGTH, "big"), body)
            if self._out.pending_bytes > PENDING_BYTES_MAX:
                self._call_on_loop(self._update_reading)
        elif self._transport is not None:
            self._transport.write(len(body).to_bytes(LENGTH, "big"))
            self._transport.write(body)

    def _refuse(self, req: pb.ReadRangeRequest, why: str) -> None:
        """Answer EUA without reading anything (a client whose token was refused)."""
        self._send(pb.ReadRangeResponse(status=pb.EUA, ledger_id=req.ledger_id, first_entry_id=req.first_entry_id,
                                        detail=why), req.request_id)

    def _drop(self, why: str) -> None:
        log.warning("closing read connection from %s: %s", self._peer, why)
        if self._transport is not None:
            self._transport.close()
            self._transport = None

