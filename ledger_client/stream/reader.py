"""Reading a stream (DistributedLog's ReadAheadEntryReader + BKAsyncLogReader, DESIGN §4.5).

A read-ahead thread walks the segments in order: sealed ones by range reads up to their last
entry, the one in progress up to its LAC, moving on when a segment is sealed; it puts what it
read on a bounded queue, and the reader's caller takes records from there (decoding them). At the
tail it hands the segment over to the caller, whose reads then long-poll it themselves (never past
what the writer was told is durable, and never fencing it): see tail.py. Records before the
truncation point are never returned, whatever position the reader was asked to start from.

A reader of a subscription (DESIGN §4.11) starts after its committed position (a new one at
``start``) and commits positions through a Committer (commits.py: batched, forward only).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

from metadata.streams import SegmentMeta, SegmentState, StreamView

from .. import errors
from ..metadata_errors import metadata_errors
from .chunks import Chunk, arrow_to_records, records_to_arrow
from .commits import COMMIT_INTERVAL_MS, Committer
from .dlsn import DLSN, LogRecord
from .meta import check_names
from .subscriptions import as_position, check_subscription, open_position
from .tail import Tail
from .tiered import read_tiered_batch, step_entries

if TYPE_CHECKING:
    import pyarrow as pa

    from ..read_handle import ReadHandle
    from .namespace import Namespace

log = logging.getLogger(__name__)

READ_AHEAD_BATCHES = 8          # decoded batches waiting for the caller (each up to CHUNK_ENTRIES entries)
CHUNK_ENTRIES = 16              # entries per range read (record sets of up to output_buffer_bytes each)
LONG_POLL_MS = 200              # how long a poll at the tail waits before the metadata is read again
IDLE_POLL_S = (0.005, 0.2)      # waiting for a new segment: from, up to (doubling)
ERRORS_MAX = 5                  # read failures in a row before the reader gives up
VIEW_MAX_AGE_S = 0.1            # the stream's metadata is read again at least this often while reading


class _End:
    pass


_END = _End()


class StreamReader:
    """Thread-safe for one consumer. An iterator (ends at end of stream) and a context manager."""

    def __init__(self, ns: Namespace, name: str, start: DLSN | str = DLSN.INITIAL,
                 start_txid: int | None = None, *, subscription: str | None = None,
                 commit_interval_ms: int = COMMIT_INTERVAL_MS) -> None:
        check_names((name, "stream"))
        if subscription is not None:
            check_subscription(subscription)
        self.ns, self.name = ns, name
        self._metrics = ns.client.metrics
        view = ns.view(name)
        self._handles: dict[int, ReadHandle] = {}
        self._min_txid = None if start_txid is None else int(start_txid)
        self._pos = self._start_position(view, start, start_txid)
        self._committer: Committer | None = None
        if subscription is not None:
            resume, committed = open_position(ns, name, subscription, view, self._pos)
            if resume != self._pos:
                self._min_txid = None   # an existing subscription's position rules, not start_txid
            tb = view.meta.truncated_before
            self._pos = max(resume, DLSN(*tb)) if tb else resume
            self._committer = Committer(ns, name, subscription, committed, commit_interval_ms)
        # Chunks of entries (decoded by the caller, into records or Arrow), a tiered segment's records.
        self._queue: queue.Queue[Chunk | pa.RecordBatch | Tail | BaseException | _End] = queue.Queue(READ_AHEAD_BATCHES)
        self._tailing: Tail | None = None   # the segment in progress, while this reader's caller polls it
        self._handed: Tail | None = None    # the read-ahead thread's side: the tail it waits to get back
        self._batch: list[LogRecord] | pa.RecordBatch = []
        self._index = 0
        self._ended = False
        self._stop = threading.Event()
        self._stale = True                 # the read-ahead thread reads the metadata again before its next step
        self._thread = threading.Thread(target=self._run, args=(self._pos,), daemon=True,
                                        name=f"stream-read-ahead-{ns.name}/{name}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"StreamReader({self.ns.name}/{self.name} at {self._pos})"

    def _start_position(self, view: StreamView, start: DLSN | str, start_txid: int | None) -> DLSN:
        if start_txid is not None:
            if not isinstance(start_txid, int) or isinstance(start_txid, bool):
                raise errors.IncorrectParameterError(f"start_txid must be an int, not {start_txid!r}")
            seg = next((s for s in view.ordered() if not s.is_sealed or s.last_txid >= start_txid), None)
            pos = DLSN(seg.sequence, 0, 0) if seg else DLSN(view.meta.next_sequence, 0, 0)
        elif start == "latest":
            pos = self._tail_position(view)
        elif isinstance(start, tuple) and len(start) == 3:
            pos = DLSN.of(*start)
        else:
            raise errors.IncorrectParameterError(f"start must be a DLSN or 'latest', not {start!r}")
        tb = view.meta.truncated_before
        return max(pos, DLSN(*tb)) if tb else pos

    def _tail_position(self, view: StreamView) -> DLSN:
        seg = view.in_progress
        if seg is None or seg.ledger_id is None:
            return DLSN(view.meta.next_sequence, 0, 0)
        h = self._handle(seg)
        return DLSN(seg.sequence, h.read_last_add_confirmed() + 1, 0)

    # ------------------------------------------------------------------ the caller's side

    @property
    def position(self) -> DLSN:
        """Where the next record returned will be at or after."""
        return self._pos

    # ------------------------------------------------------------------ the subscription's commits

    @property
    def subscription(self) -> str | None:
        return None if self._committer is None else self._committer.name

    def _commits(self) -> Committer:
        if self._committer is None:
            raise errors.IncorrectParameterError(f"{self!r} reads without a subscription: nothing to commit")
        return self._committer

    def commit(self, dlsn: DLSN, *, sync: bool = False) -> None:
        """Record ``dlsn`` as consumed: written with the reader's next commit (at most one ZooKeeper
        write per ``commit_interval_ms``), at once with ``sync``. A position at or below the last
        one committed is ignored; past the stream's end, PositionPastEndError."""
        self._commits().commit(as_position(dlsn, "commit position"), self._pos, sync=sync)

    def commit_async(self, dlsn: DLSN) -> Future[None]:
        """``commit``, with a future done once a write carried the position."""
        return self._commits().commit(as_position(dlsn, "commit position"), self._pos)

    def flush_commits(self) -> None:
        """Write the last position committed now."""
        self._commits().flush()

    def read_next(self, timeout_ms: int = 1_000) -> LogRecord | None:
        """The next record; None if none arrived within ``timeout_ms``; EndOfStreamError once the
        stream has ended and every record was returned."""
        got = self.read_batch(1, timeout_ms)
        return got[0] if got else None

    def read_batch(self, max_records: int = 10_000, timeout_ms: int = 100) -> list[LogRecord]:
        """Up to ``max_records`` records that are ready, waiting up to ``timeout_ms`` for the first."""
        if not isinstance(max_records, int) or max_records < 1:
            raise errors.IncorrectParameterError(f"max_records must be a positive int, not {max_records!r}")
        if self._stop.is_set():
            raise errors.StreamClosedError(f"{self!r} is closed")
        out: list[LogRecord] = []
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while len(out) < max_records:
            if self._index >= len(self._batch) and not self._next_batch(deadline if not out else 0.0, arrow=False):
                break
            cur = self._batch
            if isinstance(cur, list):
                take = cur[self._index:self._index + max_records - len(out)]
            else:   # Arrow (a tiered segment's rows, or what read_arrow_batch left): only what is taken
                take = arrow_to_records(cur.slice(self._index, max_records - len(out)))
            self._index += len(take)
            out += take
        if out:
            last = out[-1].dlsn
            self._pos = DLSN(last.segment, last.entry_id, last.slot + 1)
            if self._metrics is not None:
                self._metrics.stream_records_read.inc(len(out))
        elif self._ended:
            raise errors.EndOfStreamError(f"stream {self.ns.name}/{self.name} has ended")
        return out

    def read_arrow_batch(self, max_records: int = 65_536, timeout_ms: int = 100) -> pa.RecordBatch | None:
        """Up to ``max_records`` records that are ready as one Arrow batch (``segment``, ``entry_id``,
        ``slot``, ``txid``, ``payload``), waiting up to ``timeout_ms`` for the first; None when none
        came. The same records, order and end as ``read_batch``, without a Python object per record."""
        import pyarrow as pa

        if not isinstance(max_records, int) or max_records < 1:
            raise errors.IncorrectParameterError(f"max_records must be a positive int, not {max_records!r}")
        if self._stop.is_set():
            raise errors.StreamClosedError(f"{self!r} is closed")
        parts: list[pa.RecordBatch] = []
        got = 0
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while got < max_records:
            if self._index >= len(self._batch) and not self._next_batch(deadline if not parts else 0.0, arrow=True):
                break
            cur = self._batch
            if isinstance(cur, list):   # a tiered segment's records, or what read_batch left
                cur, self._index = records_to_arrow(cur[self._index:]), 0
                self._batch = cur
            take = cur.slice(self._index, max_records - got)
            self._index += take.num_rows
            got += take.num_rows
            parts.append(take)
        if not parts:
            if self._ended:
                raise errors.EndOfStreamError(f"stream {self.ns.name}/{self.name} has ended")
            return None
        rb = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        last = [rb.column(i)[got - 1].as_py() for i in range(3)]
        self._pos = DLSN(last[0], last[1], last[2] + 1)
        if self._metrics is not None:
            self._metrics.stream_records_read.inc(got)
        return rb

    def _next_batch(self, deadline: float, arrow: bool) -> bool:
        """The next item of the read-ahead queue decoded (into records, or Arrow) as the current
        batch; False when none came by ``deadline`` (0: only what is there now) or at the end."""
        while not self._ended:
            if self._tailing is not None:
                if not deadline or self._stop.is_set():
                    return False   # no poll for "only what is there now" (a round trip each), nor once closed
                got = self._poll_tail(self._tailing, deadline, arrow)
                if got is not None and len(got):
                    self._batch, self._index = got, 0
                    return True
                if self._tailing is not None:
                    if time.monotonic() >= deadline:
                        return False
                    continue
            try:
                if deadline:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if isinstance(item, Tail):
                self._tailing = item
                continue
            if isinstance(item, _End):
                self._ended = True
                return False
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            try:
                batch = self._decoded(item, arrow)
            except errors.CorruptRecordSetError:
                self._ended = True
                raise
            if len(batch):
                self._batch, self._index = batch, 0
                return True
        return False

    def _poll_tail(self, t: Tail, deadline: float, arrow: bool) -> list[LogRecord] | pa.RecordBatch | None:
        """One long poll of the tail by the caller, up to ``deadline``: what came, decoded; None
        when nothing did. The tail goes back to the read-ahead thread when the stream's metadata
        is due to be read again (VIEW_MAX_AGE_S while records come, LONG_POLL_MS while none do)
        or the poll failed (the read-ahead thread retries, counting failures as for its own)."""
        now = time.monotonic()
        age_max = VIEW_MAX_AGE_S if t.moved else LONG_POLL_MS / 1000
        left_s = min(deadline - now, age_max - (now - t.since))
        if left_s <= 0 and now - t.since >= age_max:
            self._tailing = None
            t.give_back()
            return None
        try:
            chunk = t.poll(max(0, int(left_s * 1000)), self._stop)
        except errors.LedgerError as e:   # the read-ahead thread meets it: retried, or the reader's end
            self._tailing = None
            t.give_back(e)
            return None
        return None if chunk is None else self._decoded(chunk, arrow)

    def _decoded(self, item: Chunk | pa.RecordBatch, arrow: bool) -> list[LogRecord] | pa.RecordBatch:
        """An item past the txid floor of ``start_txid`` (txids never decrease: the floor holds
        until the first record that passes it): entries read from a ledger decoded in the form
        asked; a tiered segment's rows as they are, Arrow, of which read_batch turns into records
        only the part it returns (a step of tiered.step_entries entries comes at once)."""
        batch = (item.arrow() if arrow else item.records()) if isinstance(item, Chunk) else item
        floor = self._min_txid
        if floor is None or not len(batch):
            return batch
        if isinstance(batch, list):
            keep = next((i for i, r in enumerate(batch) if r.txid >= floor), None)
        else:
            import numpy as np

            passed = np.flatnonzero(batch.column(3).to_numpy() >= floor)
            keep = int(passed[0]) if len(passed) else None
        if keep is None:
            return batch[:0]
        self._min_txid = None
        return batch[keep:]

    def __iter__(self) -> Iterator[LogRecord]:
        while True:
            try:
                yield from self.read_batch(10_000, 1_000)
            except errors.EndOfStreamError:
                return

    def close(self) -> None:
        """Stops reading; a subscription's last commit is written first."""
        if self._committer is not None:
            self._committer.close()
        self._stop.set()
        handed = self._handed
        if handed is not None:   # the read-ahead thread waits for the tail: it need not
            handed.give_back()
        while True:  # unblock the read-ahead thread if it waits for room
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ read-ahead thread

    def _put(self, item: Chunk | pa.RecordBatch | Tail | BaseException | _End) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fresh_view(self, view: StreamView | None) -> StreamView:
        """The stream as it is now: one read of its node, and of every segment only when that moved."""
        with metadata_errors(f"read stream {self.ns.name}/{self.name}"):
            head = self.ns.client.store.streams.read_stream_meta(self.ns.name, self.name)
        if head is None:
            raise errors.NoSuchStreamError(f"stream {self.ns.name}/{self.name} was deleted")
        if view is not None and view.version == head[1]:
            return view
        return self.ns.view(self.name)

    def _run(self, pos: DLSN) -> None:
        failures = 0
        idle = IDLE_POLL_S[0]
        view: StreamView | None = None
        read_at = 0.0
        while not self._stop.is_set():
            try:
                # The metadata is read again when the tail had nothing new (sealed? rolled?), when
                # there was no segment to read, and at least every VIEW_MAX_AGE_S (truncations);
                # not per batch: at 1,000 entries/s a read per entry would hold the reader back.
                now = time.monotonic()
                if view is None or self._stale or now - read_at > VIEW_MAX_AGE_S:
                    view, read_at, self._stale = self._fresh_view(view), now, False
                pos, progressed, done = self._step(view, pos)
                failures = 0
            except errors.LedgerError as e:
                failures += 1
                log.warning("%r: read failed (%d in a row): %s", self, failures, e)
                if failures >= ERRORS_MAX or isinstance(e, errors.NoSuchStreamError | errors.CorruptRecordSetError
                                                                | errors.UnauthorizedAccessError):
                    self._put(e)
                    return
                self._stop.wait(min(1.0, 0.05 * 2 ** failures))
                continue
            if done:
                self._put(_END)
                return
            if progressed:
                idle = IDLE_POLL_S[0]
            else:
                self._stop.wait(idle)
                idle = min(IDLE_POLL_S[1], idle * 2)

    def _step(self, view: StreamView, pos: DLSN) -> tuple[DLSN, bool, bool]:
        """One move from ``pos``: (new position, whether anything was read, whether the stream ended)."""
        tb = view.meta.truncated_before
        if tb and pos < DLSN(*tb):
            pos = DLSN(*tb)
        seg = next((s for s in view.ordered() if s.sequence >= pos.segment), None)
        if seg is None:
            self._stale = True
            return pos, False, view.meta.end_of_stream
        if seg.sequence > pos.segment:
            pos = DLSN(seg.sequence, 0, 0)
        if seg.state is SegmentState.TIERED:
            return self._deliver_tiered(seg, pos, tb)
        if seg.is_sealed:
            if pos.entry_id > seg.last_entry_id:
                return DLSN(seg.sequence + 1, 0, 0), True, False
            last = min(seg.last_entry_id, pos.entry_id + CHUNK_ENTRIES - 1)
            return self._deliver(seg, pos, last, tb), True, False
        return self._tail(seg, pos, tb)

    def _tail(self, seg: SegmentMeta, pos: DLSN, tb: tuple[int, int, int] | None) -> tuple[DLSN, bool, bool]:
        """The segment in progress: up to its LAC, then over to the caller until it gives it back."""
        h = self._handle(seg)
        if pos.entry_id <= h.last_add_confirmed:
            return self._deliver(seg, pos, min(h.last_add_confirmed, pos.entry_id + CHUNK_ENTRIES - 1), tb), True, False
        t = Tail(seg, pos, DLSN(*tb) if tb else DLSN.INITIAL, h, f"stream {self.ns.name}/{self.name}", CHUNK_ENTRIES)
        self._handed = t
        if not self._put(t):
            return pos, False, False
        try:
            back = t.wait_back(self._stop)
        finally:
            self._handed = None
            self._stale = True        # read the metadata again (sealed? rolled? truncated?) at once
        return (pos if back is None else back), back is not None, False

    def _deliver(self, seg: SegmentMeta, pos: DLSN, last: int, tb: tuple[int, int, int] | None) -> DLSN:
        self._put(self._chunk(seg, self._handle(seg).read(pos.entry_id, last), pos, tb))
        return DLSN(seg.sequence, last + 1, 0)

    def _chunk(self, seg: SegmentMeta, entries: list, pos: DLSN, tb: tuple[int, int, int] | None) -> Chunk:
        """Entries as read, decoded by the caller (records before ``pos`` or the truncation point are
        left out there)."""
        start = max(pos, DLSN(*tb)) if tb else pos
        return Chunk(seg.sequence, seg.first_txid, [(e.entry_id, e.data) for e in entries], start,
                     f"stream {self.ns.name}/{self.name}")

    def _deliver_tiered(self, seg: SegmentMeta, pos: DLSN, tb: tuple[int, int, int] | None) -> tuple[DLSN, bool, bool]:
        """A segment in Delta, one scan of tiered.step_entries entries per step."""
        if pos.entry_id > seg.last_entry_id:
            return DLSN(seg.sequence + 1, 0, 0), True, False
        last = min(seg.last_entry_id, pos.entry_id + step_entries(seg) - 1)
        start = max(pos, DLSN(*tb)) if tb else pos
        batch = read_tiered_batch(seg, self.ns.name, self.name, start, last)
        if batch.num_rows and not self._put(batch):
            return pos, False, False
        return DLSN(seg.sequence, last + 1, 0), True, False

    def _handle(self, seg: SegmentMeta) -> ReadHandle:
        lid = seg.ledger_id
        if lid is None:
            raise errors.MetadataServiceError(f"segment {seg.sequence} has no ledger")
        h = self._handles.get(lid)
        if h is None or (seg.is_sealed and not h.is_closed):
            h = self.ns.client.open_ledger(lid, self.ns.settings.ledger_password, recovery=False)
            self._handles = {k: v for k, v in self._handles.items() if k >= lid}  # older segments are done
            self._handles[lid] = h
        return h
