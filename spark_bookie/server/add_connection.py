"""One client's add connection, served by a thread of its own blocked in recv().

Why a thread and not the event loop: at a few thousand small appends per second, where each add
arrives alone, a bookie's cost per add was mostly the loop's turn per message: measured apart on
this kind of host, receiving a 1 KiB message every millisecond cost an asyncio protocol 83-97 us of
CPU and a thread blocked in recv 27-31 us. Adds are then applied on this thread (the processor
serializes them against fencing and key setting with its own lock) and answered from the journal
thread (RequestProcessor.process_adds with a flush): one frame per connection per journal group.

Before a batch is applied, the bookie's admission (server/admission.py) names its flow and may hold
it for its namespace's write rate; the thread then also waits while its flow has its share of the
journal queued (fair share, DESIGN §4.10). Either wait stops this connection's reads alone.

Answers are written without blocking, what the socket does not take by a writer thread
(spark_bookie.server.frame_out). While more than PENDING_BYTES_MAX wait, this connection reads no
more requests: back-pressure on that client alone (the in-flight bound, answered
ETOOMANYREQUESTS, caps what it can have outstanding anyway).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from google.protobuf.message import DecodeError

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import FrameError, frame, next_frame
from spark_bookie.server.adds import add_groups, batch_size, group_failures
from spark_bookie.server.auth import ConnectionAccess
from spark_bookie.server.frame_out import FrameOut
from spark_bookie.server.processor import RequestProcessor

log = logging.getLogger(__name__)
RECV_BYTES = 1 << 16
# Answers the client has not taken, besides the chunk the writer thread is sending; above it the
# connection reads no more requests.
PENDING_BYTES_MAX = 1 << 20


class AddConnection:
    """`serve()` runs on the connection's own thread; `_reply` and `_send_answers` on any thread."""

    def __init__(self, sock: socket.socket, peer: str, processor: RequestProcessor, in_flight_adds_max: int,
                 message_bytes_max: int, access: ConnectionAccess | None = None) -> None:
        self._sock = sock
        self._access = access  # whether this connection's client is served (auth; None: no checks)
        self._peer = peer
        self._p = processor
        self._in_flight_max = in_flight_adds_max
        self._bytes_max = message_bytes_max
        # The lock covers the answer lists, the in-flight count and every write of an answer (the
        # FrameOut's lock), so that answers leave in the order they were collected and nothing is
        # written after close.
        self._out_lock = threading.Lock()
        self._out = FrameOut(sock, f"add-{peer}", self._out_lock)
        self._drained = self._out.drained   # what waited was taken, or closed
        self._in_flight = 0
        self._ok: list[int] = []
        self._failed: list[pb.AddResponse] = []

    @property
    def _closed(self) -> bool:
        return self._out.closed

    # ------------------------------------------------------------------ the connection's thread

    def serve(self) -> None:
        """Read and apply batches until the client closes, the connection breaks or close() is
        called (the listener read the hello exactly, so nothing of the client's is buffered yet)."""
        buf = bytearray()
        chunk = bytearray(RECV_BYTES)  # recv_into: recv(n) allocates n bytes per call (an mmap when large)
        view = memoryview(chunk)
        try:
            while True:
                pos = self._parse(buf)
                if pos < 0:
                    return
                del buf[:pos]
                if not self._wait_for_client():
                    return
                n = self._sock.recv_into(chunk)
                if not n:
                    return
                buf += view[:n]
        except OSError as e:
            if not self._closed:
                log.info("add connection from %s ended: %s", self._peer, e)
        finally:
            self._finish()

    def _parse(self, buf: bytearray) -> int:
        """Apply the whole frames in `buf`; the position after them, or -1 to drop the connection."""
        pos = 0
        while True:
            try:
                got = next_frame(buf, pos, self._bytes_max)
            except FrameError as e:
                return self._drop(f"{e} (message_bytes_max)")
            if got is None:
                return pos
            body, pos = got
            try:
                batch = pb.AddBatch.FromString(body)
            except DecodeError as e:
                return self._drop(f"frame is not an AddBatch: {e}")
            self._on_batch(batch)

    def _wait_for_client(self) -> bool:
        """Block while the client leaves more than PENDING_BYTES_MAX of answers untaken; False once closed."""
        with self._out_lock:
            while self._out.pending_bytes > PENDING_BYTES_MAX and not self._closed:
                self._drained.wait()
            return not self._closed

    def _on_batch(self, batch: pb.AddBatch) -> None:
        why = None if self._access is None else self._access.refusal(batch.auth_token)
        if why is not None:
            self._reply([], [f for g in add_groups(batch) for f in group_failures(g, pb.EUA, why)],
                        counted=False)
            self._send_answers()
            return
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
        flow, pieces = self._p.admit(add_groups(batch))
        started = time.monotonic()
        applied = 0
        try:
            for groups, hold_s in pieces:
                if hold_s > 0 and not self._hold(started + hold_s - time.monotonic()):
                    return
                self._p.wait_for_room(flow)
                self._p.process_adds(batch, self._reply, self._send_answers,
                                     caller=None if self._access is None else self._access.caller, flow=flow,
                                     groups=groups)
                applied += 1
        except Exception as e:  # a bug must not kill the bookie: answer EIO, as the gRPC path does
            log.exception("add batch from %s failed", self._peer)
            self._reply([], [f for groups, _ in pieces[applied:] for g in groups
                             for f in group_failures(g, pb.EIO, f"internal error: {type(e).__name__}: {e}")])
            self._send_answers()

    def _hold(self, seconds: float) -> bool:
        """Wait out a write-rate hold (this connection reads nothing meanwhile: its client's
        window fills and its writes wait); False if the connection closed meanwhile."""
        if seconds > 0:
            with self._out_lock:
                self._drained.wait_for(lambda: self._closed, seconds)
        return not self._closed

    def _drop(self, why: str) -> int:
        log.warning("closing add connection from %s: %s", self._peer, why)
        return -1

    def _finish(self) -> None:
        """Close the socket once no other thread can be writing to it."""
        self._out.close()
        with self._out_lock:
            self._sock.close()

    # ------------------------------------------------------------------ answers (any thread)

    def _reply(self, ok: list[int], failed: list[pb.AddResponse], counted: bool = True) -> None:
        """Collect answers; _send_answers sends them."""
        with self._out_lock:
            if counted:
                self._in_flight -= len(ok) + len(failed)
            self._ok.extend(ok)
            self._failed.extend(failed)

    def _send_answers(self) -> None:
        """Send the collected answers as one frame, without blocking: what the socket does not take
        now goes after what already waits, by the writer thread."""
        with self._out_lock:
            ok, failed = self._ok, self._failed
            if self._closed or not (ok or failed):
                return
            self._ok, self._failed = [], []
            self._out.send_locked(frame(pb.AddBatchResponse(ok_request_ids=ok, responses=failed).SerializeToString()))

    def close(self) -> None:
        """Send what is already answered, then stop serving (the bookie is stopping): the client
        sees the connection end at once instead of waiting out its add timeout."""
        self._send_answers()
        self._out.close(join=False)
