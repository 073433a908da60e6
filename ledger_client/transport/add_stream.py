"""The adds in flight to one bookie, whatever carries them (a gRPC call or the TCP add port).

AddStream queues adds and its request generator drains whatever is queued into one AddBatch
message, so batching follows load. The connection-owning subclasses live beside their transport
(bookie_client.GrpcAddStream, socket_stream.SocketAddStream); both build on this module, and it
on neither.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from .. import errors
from ..protocol import bookkeeper_pb2 as pb
from ..protocol.tcp_framing import AddColumns, Lac

TRANSPORT_FAILURE = -1  # the status reported for adds whose stream to the bookie broke


class AddSink(Protocol):
    """Receives add results in batches: one call per stream message per sink, not one per entry,
    because per-entry callbacks were most of a writer's CPU."""

    def on_add_results(self, bookie: str, ok: list[int], failed: list[tuple[int, int, str]]) -> None:
        """`ok`: entry ids now durable on `bookie`; `failed`: (entry id, status, detail)."""


_STOP = object()
LAC_ITEM = -1   # an item's flag for an announced LAC: (ledger id, -1, key, framed LAC, LAC_ITEM, 0), unanswered


@dataclass(frozen=True)
class StreamLimits:
    """Bounds of one add stream.

    With Qa < Qw an entry completes before its slowest replica answers, so a writer's own bound
    (outstanding_adds_max) does not bound what one lagging bookie has to absorb. in_flight_adds_max
    keeps what was sent and not answered under the bookie's in_flight_adds_per_stream_max (else the
    bookie answers ETOOMANYREQUESTS and gets replaced for being merely behind); the rest waits
    here, up to backlog_adds_max, beyond which the bookie is too slow to keep and the add fails
    (BookieUnavailableError: the writer replaces it, as BookKeeper does with a slow bookie).

    messages_in_flight_max: while this many messages are unanswered and the newest carried fewer
    than window_bypass_adds adds, the next one waits for an answer (0 = never wait). A message
    costs each side a few hundred microseconds of CPU whatever it carries; at a few thousand
    appends/s, sending each add on its own kept two cores ~80% busy and the queueing made the
    p99; waiting for the answer turns the adds that arrive meanwhile into one message, while a
    busy writer's big batches still leave back to back.
    """

    batch_entries_max: int = 512
    batch_bytes_max: int = 4 << 20
    in_flight_adds_max: int = 10_000
    backlog_adds_max: int = 200_000
    messages_in_flight_max: int = 1
    window_bypass_adds: int = 16
    add_transport: str = "tcp"  # "tcp": the bookie's TCP add listener; "grpc": the AddStream call


class AddStream:
    """Adds in flight to one bookie and the sinks waiting on them, over some connection.

    A subclass owns the connection: it sends the batches `_batches()` yields and hands every
    answer to `_on_response`; when the connection ends it calls `_fail`.
    """

    def __init__(self, limits: StreamLimits, address: str) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: dict[int, tuple[AddSink, int]] = {}
        self._lock = threading.Lock()
        self._batch_entries_max = limits.batch_entries_max
        self._batch_bytes_max = limits.batch_bytes_max
        self._in_flight_max = limits.in_flight_adds_max
        self._backlog_max = limits.backlog_adds_max
        self._sent = 0                       # adds sent and not yet answered
        self._msgs_max = limits.messages_in_flight_max
        self._bypass = limits.window_bypass_adds
        self._msgs: deque[int] = deque()     # unanswered adds of each message sent, oldest first
        self._last_size = 0                  # adds in the newest message sent
        self._room = threading.Condition()   # the sender waits here while _sent is at the bound
        self._address = address
        self.broken: BaseException | None = None

    def _requests(self) -> Iterator[pb.AddBatch]:
        """The messages to send, as protobuf objects (see `_batches`)."""
        for items in self._batches():
            yield self._message(items)

    def _batches(self) -> Iterator[list[tuple[int, int, bytes, bytes, int, int]]]:
        """Drain whatever is queued into one batch (see `_columns`)."""
        get, get_nowait = self._q.get, self._q.get_nowait
        bytes_max = self._batch_bytes_max
        while True:
            entries_max = self._wait_for_room()
            item = get()
            if item is _STOP:
                return
            items = [item]
            size, stop = len(item[3]), False
            while len(items) < entries_max and size < bytes_max:
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                items.append(item)
                size += len(item[3])
            yield items
            if stop:
                return

    def _columns(self, items: list[tuple[int, int, bytes, bytes, int, int]]) -> tuple[list[AddColumns], list[Lac]]:
        """One message's adds, counted as sent, column-wise per ledger (pb.LedgerAdds): a few list
        appends per entry here, and the message is built in C (or by add_batch_frame) from the lists;
        and the LACs it announces (LAC_ITEM items: not counted, as nothing answers them)."""
        groups: dict[tuple[int, int, bytes], tuple[list[int], list[int], list[bytes]]] = {}
        lacs: list[Lac] = []
        for lid, eid, key, body, flag, rid in items:
            if flag == LAC_ITEM:
                lacs.append((lid, key, body))
                continue
            g = groups.get((lid, flag, key))
            if g is None:
                g = groups[(lid, flag, key)] = ([], [], [])
            g[0].append(eid)
            g[1].append(rid)
            g[2].append(body)
        n = len(items) - len(lacs)
        if n:
            with self._room:
                self._sent += n
                self._msgs.append(n)
                self._last_size = n
        return [(lid, flag, key, eids, rids, bodies) for (lid, flag, key), (eids, rids, bodies) in groups.items()], lacs

    def _message(self, items: list[tuple[int, int, bytes, bytes, int, int]]) -> pb.AddBatch:
        """`_columns` as a protobuf object (the gRPC stream sends objects)."""
        columns, lacs = self._columns(items)
        return pb.AddBatch(ledger_adds=[
            pb.LedgerAdds(ledger_id=lid, flag=cast(pb.AddFlag, flag), master_key=key, entry_ids=eids,
                          request_ids=rids, bodies=bodies)
            for lid, flag, key, eids, rids, bodies in columns] + [
            pb.LedgerAdds(ledger_id=lid, master_key=key, lac_body=body) for lid, key, body in lacs])

    def _wait_for_room(self) -> int:
        """Block while the bookie holds in_flight_adds_max of ours or the message window is full
        (see StreamLimits); then how many adds may go now."""
        with self._room:
            while (self._sent >= self._in_flight_max or self._window_full()) and self.broken is None:
                self._room.wait(1.0)
            return max(1, min(self._batch_entries_max, self._in_flight_max - self._sent))

    def _held(self) -> bool:
        """An add queued now would wait (what _wait_for_room waits for); read without the lock, as a hint."""
        return self._sent >= self._in_flight_max or self._window_full()

    def _window_full(self) -> bool:
        """messages_in_flight_max messages are unanswered and the newest of them was small (fewer
        than window_bypass_adds adds): the writer is not busy, so gathering costs at most one
        round trip. A busy writer's messages are big, and the next one goes at once."""
        return 0 < self._msgs_max <= len(self._msgs) and self._last_size < self._bypass

    def _answered(self, n: int) -> None:
        with self._room:
            self._sent -= n
            msgs = self._msgs
            while n and msgs:
                k = min(n, msgs[0])
                n -= k
                if k == msgs[0]:
                    msgs.popleft()
                else:
                    msgs[0] -= k
            self._room.notify()

    def _on_response(self, resp: pb.AddBatchResponse) -> None:
        """Hand one answer message's results to their sinks, one call per sink."""
        pending = self._pending
        self._answered(len(resp.ok_request_ids) + len(resp.responses))
        groups: dict[AddSink, tuple[list[int], list[tuple[int, int, str]]]] = {}
        for rid in resp.ok_request_ids:
            t = pending.pop(rid, None)
            if t is not None:
                g = groups.get(t[0])
                if g is None:
                    g = groups[t[0]] = ([], [])
                g[0].append(t[1])
        for r in resp.responses:
            t = pending.pop(r.request_id, None)
            if t is not None:
                groups.setdefault(t[0], ([], []))[1].append((t[1], r.status, r.detail))
        for sink, (ok, failed) in groups.items():
            sink.on_add_results(self._address, ok, failed)

    def _fail(self, detail: str, status: int = TRANSPORT_FAILURE) -> None:
        """Fail every pending add: TRANSPORT_FAILURE (the bookie is unreachable: replace it), or
        EUA when the bookie refused our credentials (replacing it would not help)."""
        with self._lock:
            self.broken = (errors.UnauthorizedAccessError(detail) if status == pb.EUA
                           else errors.BookieUnavailableError(detail))
            pending, self._pending = self._pending, {}
        groups: dict[AddSink, list[tuple[int, int, str]]] = {}
        for sink, eid in pending.values():
            groups.setdefault(sink, []).append((eid, status, detail))
        for sink, failed in groups.items():
            sink.on_add_results(self._address, [], failed)
        with self._room:
            self._room.notify_all()

    def dispatch(self, item: tuple[int, int, bytes, bytes, int, int]) -> None:
        """Send an add `_register` noted, or a LAC_ITEM (any thread; never raises for the connection's state)."""
        self._q.put(item)

    def _register(self, item: tuple[int, int, bytes, bytes, int, int], sink: AddSink) -> bool:
        """Note the add as pending; False when the stream broke meanwhile and its sink was told."""
        if len(self._pending) >= self._backlog_max:
            raise errors.BookieUnavailableError(
                f"{self._address}: {len(self._pending)} adds waiting for this bookie (backlog_adds_max); "
                "it is too far behind the others")
        rid = item[5]
        self._pending[rid] = (sink, item[1])
        if self.broken is not None:  # lost a race with _fail: whoever removes the callback calls it
            if self._pending.pop(rid, None) is not None:
                raise self.broken
            return False
        return True

    def close(self) -> None:
        self._q.put(_STOP)


