"""The stream writer's decisions, without I/O: buffering records into entries, rolling segments,
announcing the LAC, txids, and the in-order settling of what the entries carried.

DistributedLog's BKLogSegmentWriter, as a machine the writer (stream/writer.py) drives under its
lock: it hands each record to ``add``, each entry's outcome to ``settled``, a finished segment
transition to ``segment_started``, and carries out the ``Actions`` they return (append these
entries, start a transition on a worker thread, settle these records' futures). Times are
arguments (monotonic seconds), so tests drive it with any clock.

Rules:
- txids never go down: a record without one gets the last one + 1, one below the last is refused;
- an entry is sent at once when nothing is in flight (one record alone is fast); while entries are
  in flight, records gather until they fill an entry (``Limits.buffer_bytes``) or the one in flight
  completes (many records are cheap); an entry holds at least one record and, past the first,
  only records that keep it within the limit;
- entries complete in the order they were sent, so records do: an outcome is taken only once every
  entry before it has one; the first failure fails every record not yet acknowledged (in flight or
  buffered), and the machine accepts no more;
- a segment is started before the first entry and rolled once it holds ``roll_bytes`` of records
  or is ``roll_interval_s`` old; a start or roll waits until nothing is in flight (the old segment's
  ledger is closed at its last entry), and records written meanwhile wait in the buffer for the
  next segment, as does a backlog found to be due for a roll;
- after an entry holding records completes and nothing is left to send or in flight, the writer
  announces the LAC (``Actions.announce``): no entry would carry it, and tailing readers see only
  up to it. DistributedLog sends a control record for this; an entry costs the bookies a journal
  sync, which the next record then waited behind, where the announcement costs none.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, NamedTuple, TypeVar

from ..errors import LedgerError, TransactionIdOutOfOrderError
from ..protocol.checks import invariant

T = TypeVar("T")   # a record's token: the writer's future for it


class Limits(NamedTuple):
    """The namespace's settings a segment is written with (read again at each transition)."""

    buffer_bytes: int               # output_buffer_bytes: records packed into one entry, up to this
    roll_bytes: int | None          # segment_rolling_bytes: roll once a segment holds this much
    roll_interval_s: float | None   # segment_rolling_interval_ms / 1000: ... or is this old


class Segment:
    """The segment in progress as this writer filled it: what sealing it records."""

    __slots__ = ("last_data_entry", "last_slot", "last_txid", "payload_bytes", "records", "sequence", "started")

    def __init__(self, sequence: int, started: float, first_txid: int) -> None:
        self.sequence = sequence
        self.started = started           # monotonic seconds
        self.records = 0                 # records sent to it so far (a record set's "records before")
        self.payload_bytes = 0
        self.last_txid = first_txid
        self.last_slot = -1
        self.last_data_entry = -1        # the last entry holding records


class Entry(Generic[T]):
    """One ledger entry: a record set of ``txids`` and ``payloads`` whose records' ``tokens``
    complete with it. ``outcome``: its entry id, or the error."""

    __slots__ = ("outcome", "payloads", "records_before", "segment", "tokens", "txids")

    def __init__(self, segment: Segment, txids: list[int], payloads: list[bytes], tokens: list[T]) -> None:
        self.segment = segment
        self.txids, self.payloads, self.tokens = txids, payloads, tokens
        self.records_before = segment.records
        self.outcome: int | LedgerError | None = None


class Done(NamedTuple, Generic[T]):
    """Records acknowledged: slot i of entry ``entry_id`` of segment ``sequence`` is ``tokens[i]``."""

    sequence: int
    entry_id: int
    tokens: list[T]


class Failed(NamedTuple, Generic[T]):
    """Records that will never be acknowledged, and why."""

    tokens: list[T]
    error: LedgerError


class Actions(Generic[T]):
    """What the writer does after a step, in this order: append ``send`` (in order) to the segment's
    ledger; settle ``settle`` (in order, after everything settled before); start a segment
    transition on a worker thread if ``transition``; tell the bookies the LAC if ``announce``."""

    __slots__ = ("announce", "send", "settle", "transition")

    def __init__(self) -> None:
        self.send: list[Entry[T]] = []
        self.settle: list[Done[T] | Failed[T]] = []
        self.transition = False
        self.announce = False


class StreamWriteState(Generic[T]):
    """One stream writer's buffer, entries in flight and segment. Not thread-safe: the writer
    calls it under its lock."""

    __slots__ = ("_buffer", "_buffer_bytes", "_in_flight", "_limit", "_overhead", "_transition", "error",
                 "last_txid", "limits", "segment")

    def __init__(self, last_txid: int, limits: Limits, record_overhead_bytes: int) -> None:
        """``record_overhead_bytes``: what a record costs in an entry beside its payload (the record
        set format's, stream/records.py)."""
        self.last_txid = last_txid
        self._overhead = record_overhead_bytes
        self.limits = limits
        self._limit = limits.buffer_bytes   # read per record: a plain attribute is the cheapest
        self.segment: Segment | None = None
        self.error: LedgerError | None = None
        self._buffer: deque[tuple[int, bytes, T]] = deque()
        self._buffer_bytes = 0
        self._in_flight: deque[Entry[T]] = deque()
        self._transition = False        # a segment start or roll is due or running: nothing is sent

    # ------------------------------------------------------------------ queries

    @property
    def idle(self) -> bool:
        """Nothing buffered, in flight or waiting for a segment (or failed: nothing ever will be)."""
        return self.error is not None or not (self._buffer or self._in_flight or self._transition)

    @property
    def buffered_bytes(self) -> int:
        """What the records waiting to be sent cost (payloads and per-record overhead)."""
        return self._buffer_bytes

    @property
    def transitioning(self) -> bool:
        return self._transition

    def first_buffered_txid(self) -> int:
        """The first txid of the next segment: its first record's, or the last one if none waits."""
        return self._buffer[0][0] if self._buffer else self.last_txid

    # ------------------------------------------------------------------ records

    def add(self, txid: int | None, payload: bytes, token: T) -> bool:
        """Buffer one record (its txid checked or assigned); True when ``step`` should run now (nothing
        in flight, or an entry's worth waits). The caller checked that the writer is writable."""
        last = self.last_txid
        if txid is None:
            txid = last + 1
        elif txid < last:
            raise TransactionIdOutOfOrderError(f"txid {txid} is below the stream's last txid {last}")
        self.last_txid = txid
        self._buffer.append((txid, payload, token))
        self._buffer_bytes += len(payload) + self._overhead
        return not self._transition and (not self._in_flight or self._buffer_bytes >= self._limit)

    def step(self, now: float, flush: bool = False) -> Actions[T]:
        """Send what is due: one entry even if not full when nothing is in flight (or ``flush``),
        then every full one; or, when the segment is missing or due to roll, a transition."""
        out: Actions[T] = Actions()
        self._pump(now, flush or not self._in_flight, out)
        return out

    def _pump(self, now: float, eager: bool, out: Actions[T]) -> None:
        if self._transition or not self._buffer or self.error is not None:
            return
        seg, limit = self.segment, self._limit
        while self._buffer and (eager or self._buffer_bytes >= limit):
            if seg is None or self._roll_due(seg, now):   # a backlog goes to the next segment
                self._transition = True
                out.transition = not self._in_flight      # else the last completion starts it
                return
            out.send.append(self._next_entry(seg, limit))
            eager = False

    def _roll_due(self, seg: Segment, now: float) -> bool:
        lim = self.limits
        return ((lim.roll_bytes is not None and seg.payload_bytes >= lim.roll_bytes)
                or (lim.roll_interval_s is not None and now - seg.started >= lim.roll_interval_s))

    def _next_entry(self, seg: Segment, limit: int) -> Entry[T]:
        buf = self._buffer
        txids: list[int] = []
        payloads: list[bytes] = []
        tokens: list[T] = []
        size, overhead = 0, self._overhead
        while buf:
            cost = len(buf[0][1]) + overhead
            if payloads and size + cost > limit:
                break
            txid, payload, token = buf.popleft()
            txids.append(txid)
            payloads.append(payload)
            tokens.append(token)
            size += cost
        self._buffer_bytes -= size
        entry = Entry(seg, txids, payloads, tokens)
        seg.records += len(payloads)
        seg.payload_bytes += size
        seg.last_txid, seg.last_slot = txids[-1], len(payloads) - 1
        self._in_flight.append(entry)
        return entry

    # ------------------------------------------------------------------ outcomes

    def settled(self, entry: Entry[T], outcome: int | LedgerError, now: float) -> Actions[T]:
        """Entry ``entry`` got its entry id, or failed. Outcomes are taken in the order the entries
        were sent; then whatever that frees is sent (or the due transition starts, or the writer,
        now idle, announces the LAC)."""
        out: Actions[T] = Actions()
        entry.outcome = outcome
        flight = self._in_flight
        popped = False
        while flight:
            got = flight[0].outcome
            if got is None:
                break
            head = flight.popleft()
            popped = True
            if isinstance(got, LedgerError):
                self._fail(got, out, head)
                return out
            seg = head.segment
            seg.last_data_entry = max(seg.last_data_entry, got)
            out.settle.append(Done(seg.sequence, got, head.tokens))
        if popped and self.error is None:
            if flight:
                self._pump(now, False, out)
            else:
                self._after_drained(now, out)
        return out

    def _after_drained(self, now: float, out: Actions[T]) -> None:
        """Nothing in flight: start a due transition, send what waits, or go idle announcing the LAC."""
        if self._transition:
            out.transition = True
            return
        self._pump(now, True, out)
        out.announce = not out.send and not out.transition and self.segment is not None

    def fail(self, error: LedgerError) -> Actions[T]:
        """The writer is broken (an append refused, a transition failed): every record not yet
        acknowledged fails with the first error; nothing more is accepted or sent."""
        out: Actions[T] = Actions()
        self._fail(error, out, None)
        return out

    def _fail(self, error: LedgerError, out: Actions[T], head: Entry[T] | None) -> None:
        if self.error is None:
            self.error = error
        tokens: list[T] = list(head.tokens) if head is not None else []
        for e in self._in_flight:
            tokens += e.tokens
        tokens += [t for _txid, _payload, t in self._buffer]
        self._in_flight.clear()
        self._buffer.clear()
        self._buffer_bytes = 0
        if tokens:
            out.settle.append(Failed(tokens, self.error))

    # ------------------------------------------------------------------ segments

    def segment_started(self, sequence: int, first_txid: int, now: float, limits: Limits) -> Actions[T]:
        """The transition committed segment ``sequence`` (the old one, if any, sealed): send what waits
        (nothing, if the writer failed meanwhile)."""
        invariant(self._transition and not self._in_flight,
                  "a segment starts only in a transition, with nothing in flight")
        self.segment = Segment(sequence, now, first_txid)
        self.limits, self._limit = limits, limits.buffer_bytes
        self._transition = False
        out: Actions[T] = Actions()
        self._pump(now, True, out)
        return out

    def segment_sealed(self) -> Segment | None:
        """The writer sealed the segment in progress (closing): there is none now; the one it was."""
        invariant(not self._in_flight and not self._buffer, "a segment is sealed with nothing left to send")
        seg, self.segment = self.segment, None
        return seg
