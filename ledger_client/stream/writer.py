"""The single writer of a stream (DistributedLog's BKAsyncLogWriter, DESIGN §4.5).

What is sent when is decided by machines/stream_write.py (StreamWriteState): records packed into
record sets, one ledger entry each, an entry sent at once when nothing is in flight and full ones
while entries are in flight; segments started and rolled; the LAC announced to the bookies once the
last entry completes (pb.LedgerAdds.lac_body: a tailing reader sees an idle writer's last records at
once); txids; records completing in write order, and a failed entry
failing the writer and every record after it. This module does the I/O around it: appends to the
segment's ledger, segment transitions through the metadata, the stream's lock, record futures.

Segment transitions (start, roll, seal) change the metadata, so they run on the client's worker
threads, never on a caller's or on the thread reading bookie answers; records written meanwhile
wait in the buffer. A roll starts once the old segment's entries are all acknowledged, closes its
ledger, then seals it and starts the next in one multi-op; the next ledger is created before, so
the writes wait about two metadata round trips.

Threads and the lock. One lock (``_mutex``) guards the machine, the segment's ledger handle and
the writer's state; ``_changed``, a condition on it, wakes flush and close whenever an entry
completes, a transition ends or the writer fails. Entries are appended under the lock, so they
reach the ledger in the machine's order; their completion callbacks are attached after the lock is
let go, so a callback that runs at once (its entry already acknowledged) takes the lock like any
other and never finds its own thread holding it. Record futures are settled outside the lock, in
order, one thread at a time (completer.py): user callbacks never run under the lock. Nothing
waits by polling: flush and close wait on ``_changed``, and a transition is started only once
nothing is in flight, so it never waits for entries.

Opening a writer takes the stream's ZooKeeper lock and recovers a dead writer's segment with
fencing first (invariant 9); every metadata change it makes checks that it still holds the lock.

The namespace's storage quota (DESIGN §4.10, quota.py) is checked before a record enters the
machine, under the lock, against figures the writer keeps (no I/O on the fast path): a refused
record gets a failed future (QuotaExceededError), takes no txid and leaves the writer as it was.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from metadata.streams import SegmentEnd, StreamLockInfo
from metadata.streams import transitions as tr

from .. import errors
from ..completer import InOrderCompleter
from ..futures import AppendFuture
from ..machines.stream_write import Actions, Done, Entry, Failed, Limits, Segment, StreamWriteState
from ..metadata_errors import metadata_errors
from .dlsn import DLSN
from .meta import check_names, now_ms
from .quota import SyncPlan, Verdict, WriterQuota, fail_after
from .records import RECORD_OVERHEAD_BYTES, encode
from .segments import apply_retention, commit, recover_segment

if TYPE_CHECKING:
    from ..write_handle import WriteHandle
    from .namespace import Namespace
    from .settings import NamespaceSettings

log = logging.getLogger(__name__)

_Record = Future[DLSN]
_Settle = Done[_Record] | Failed[_Record]
_NEW_DLSN = partial(tuple.__new__, DLSN)   # DLSN(...) without NamedTuple's Python-level __new__


class _Act(NamedTuple):
    """What a step left to do once the lock is let go."""

    posted: list[tuple[Entry[_Record], Future[int]]]   # entries appended: their callbacks to attach
    claimed: list[_Settle] | None                       # records to settle, by this thread (the completer's)
    announce: WriteHandle | None = None                 # the ledger whose LAC to announce (the writer is idle)


_NOTHING = _Act([], None)


def _same(batch: list[_Settle]) -> list[_Settle]:
    """The completer's ``take``: the writer has no bookkeeping to do when records are settled."""
    return batch


def _limits(s: NamespaceSettings) -> Limits:
    interval = s.segment_rolling_interval_ms
    return Limits(s.output_buffer_bytes, s.segment_rolling_bytes, None if interval is None else interval / 1000)


class StreamWriter:
    """Thread-safe. Also a context manager (``close`` on exit)."""

    def __init__(self, ns: Namespace, name: str, lock_timeout_ms: int = 30_000) -> None:
        check_names((name, "stream"))
        if not isinstance(lock_timeout_ms, int) or lock_timeout_ms < 0:
            raise errors.IncorrectParameterError(f"lock_timeout_ms must be a non-negative int, not {lock_timeout_ms!r}")
        self.ns, self.name = ns, name
        self._client = ns.client
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._completer: InOrderCompleter[_Settle, list[_Settle]] = InOrderCompleter(self._mutex, _same, self._settle)
        self._handle: WriteHandle | None = None   # the ledger of the segment in progress
        self._record_max = ns.settings.record_size_bytes_max   # re-read at each new segment
        self._taken_by: str | None = None   # who took the stream over, once a write after it asked
        self._closed = False
        self._ended = False
        ns.ensure_stream(name)
        owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        with metadata_errors(f"lock stream {ns.name}/{name}"):
            self._stream_lock: StreamLockInfo = self._client.store.streams.lock_stream(ns.name, name, owner,
                                                                                       lock_timeout_ms / 1000)
        try:
            last_txid = self._recover()
        except BaseException:
            self._release_lock()
            raise
        self._sm: StreamWriteState[_Record] = StreamWriteState(last_txid, _limits(ns.settings), RECORD_OVERHEAD_BYTES)
        # The storage quota (quota.py), the bytes appended to the segment in progress (counted by
        # _append), and the last record written or refused (a refusal fails after it).
        self._seg_bytes = 0
        self._last_fut: Future[DLSN] | None = None
        self._quota = WriterQuota(ns, name, self._stream_lock, self._mutex, lambda: self._seg_bytes)

    def _recover(self) -> int:
        """Seal what a dead writer left in progress (fencing its ledger); returns the last txid."""
        view = self.ns.view(self.name)
        seg = view.in_progress
        if seg is not None:
            recover_segment(self.ns, self.name, seg, self._stream_lock)
            view = self.ns.view(self.name)
        self._ended = view.meta.end_of_stream
        return view.meta.max_txid

    def __repr__(self) -> str:
        return f"StreamWriter({self.ns.name}/{self.name})"

    @property
    def last_txid(self) -> int:
        with self._mutex:
            return self._sm.last_txid

    # ------------------------------------------------------------------ writing

    def write(self, payload: bytes, txid: int | None = None) -> DLSN:
        """Durable (Qa bookies) when it returns; the record's position."""
        return self.write_async(payload, txid).result(timeout=self._client.config.operation_timeout_ms / 1000)

    def write_async(self, payload: bytes, txid: int | None = None) -> Future[DLSN]:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise errors.IncorrectParameterError(f"a record is bytes, not {type(payload).__name__}")
        data = bytes(payload)
        if txid is not None and (not isinstance(txid, int) or isinstance(txid, bool)):
            raise errors.IncorrectParameterError(f"txid must be an int, not {txid!r}")
        return self._write(data, txid)

    def _write(self, data: bytes, txid: int | None) -> Future[DLSN]:
        """One record through the quota's gate into the machine. A record the quota refuses gets a
        future that fails (QuotaExceededError) once the one written before it settled; a refusal on
        an old read of the usage reads it first (RECHECK, at most every REFUSED_REFRESH_S)."""
        fut: Future[DLSN] = AppendFuture()   # settled once, by the completer
        act = _NOTHING
        sm, gate = self._sm, self._quota.gate
        before = None
        verdict = Verdict.ADMIT
        with self._mutex:
            if len(data) > self._record_max:
                raise errors.RecordTooLargeError(
                    f"a record of {len(data)} bytes is over record_size_bytes_max ({self._record_max})")
            failed = sm.error
            if failed is None:
                if self._ended or self._closed:
                    self._check_open()
                now = time.monotonic()
                if gate.checking:
                    cost, held = len(data) + RECORD_OVERHEAD_BYTES, self._seg_bytes + sm.buffered_bytes
                    verdict = gate.check(cost, held, now)
                if verdict is Verdict.ADMIT:
                    if sm.add(txid, data, fut):
                        act = self._act(sm.step(now))
                    self._last_fut = fut
                    if now >= gate.next_at or self._seg_bytes >= gate.next_bytes:
                        self._quota.admitted(now)
                elif verdict is Verdict.REFUSE:
                    before, self._last_fut = self._last_fut, fut
                    refused = gate.refusal(held, cost, f"stream {self.ns.name}/{self.name}")
        if failed is not None:
            raise self._failed_error(failed)   # outside the lock: naming who took the stream over reads ZooKeeper
        if act is not _NOTHING:
            self._after(act)
        if verdict is Verdict.RECHECK:
            self._quota.sync(SyncPlan(None, 0))
            return self._write(data, txid)   # checked on the fresh read (no second RECHECK: it is new)
        if verdict is Verdict.REFUSE:
            fail_after(fut, before, refused)
        return fut

    def _check_open(self) -> None:
        """Under the lock: EndOfStreamError or StreamClosedError unless the writer takes writes."""
        if self._ended:
            raise errors.EndOfStreamError(f"stream {self.ns.name}/{self.name} has ended")
        if self._closed:
            raise errors.StreamClosedError(f"{self!r} is closed")

    def _failed_error(self, error: errors.LedgerError) -> errors.LedgerError:
        """What a write, flush or truncation gets once the writer failed with ``error`` (chained):
        after a takeover (the segment fenced) StreamFencedError, a LedgerFencedError naming the
        writer that took the stream over (its lock node read once, never under the lock);
        otherwise StreamClosedError."""
        if not isinstance(error, errors.LedgerFencedError):
            failed: errors.LedgerError = errors.StreamClosedError(f"{self!r} failed: {error}")
        else:
            with self._mutex:
                taken_by = self._taken_by
            if taken_by is None:
                taken_by = self._new_owner()
                with self._mutex:
                    self._taken_by = taken_by
            failed = errors.StreamFencedError(
                f"stream {self.ns.name}/{self.name} was taken over by {taken_by}, which "
                "fenced this writer's segment: this writer can write no more")
        failed.__cause__ = error
        return failed

    def _new_owner(self) -> str:
        """The writer that holds the stream now, from its lock node ("another writer" if none does
        or ZooKeeper cannot say)."""
        try:
            with metadata_errors(f"read the lock of {self.ns.name}/{self.name}"):
                holder = self._client.store.streams.stream_lock_holder(self.ns.name, self.name)
        except errors.LedgerError as e:
            log.info("%r: who took the stream over is unknown: %s", self, e)
            return "another writer"
        return f"writer {holder}" if holder and holder != self._stream_lock.owner else "another writer"

    # ------------------------------------------------------------------ carrying out the machine's steps

    def _act(self, actions: Actions[_Record]) -> _Act:
        """Under the lock: append the entries the machine sent (in its order), queue the records it
        settled, start a due transition; what is left for after the lock (``_after``)."""
        posted = []
        for entry in actions.send:
            appended = self._append(entry, actions)
            if appended is None:
                if self._sm.error is not None:
                    break   # the writer failed: the entries after this one were failed with it
                continue
            posted.append((entry, appended))
        if actions.transition:
            self._client.run_soon(self._transition)
        announce = self._handle if actions.announce else None
        if not actions.settle:
            return _Act(posted, None, announce)
        self._completer.add(actions.settle)
        return _Act(posted, self._completer.claim(), announce)

    def _append(self, entry: Entry[_Record], actions: Actions[_Record]) -> Future[int] | None:
        """Under the lock: one entry to the segment's ledger; None when the ledger refused it at once
        (the writer then fails, its failures put in ``actions``)."""
        handle = self._handle
        body = encode(entry.txids, entry.payloads, entry.records_before)
        try:
            if handle is None:
                raise errors.StreamClosedError(f"{self!r}: an entry with no segment ledger")
            appended = handle.append_async(body)
            self._seg_bytes += len(body)
            return appended
        except errors.LedgerError as e:
            was_ok = self._sm.error is None
            actions.settle += self._sm.fail(self._writer_error(e)).settle
            self._log_failure(was_ok)
            self._changed.notify_all()   # a flush waiting for these records: they failed
            return None

    def _after(self, act: _Act) -> None:
        """After the lock: announce the LAC (before anything else, so readers see the records
        sooner), attach the appended entries' callbacks, then settle what completed."""
        if act.announce is not None:
            act.announce.send_explicit_lac(journaled=False)
        for entry, appended in act.posted:
            appended.add_done_callback(partial(self._on_entry, entry))
        if act.claimed is not None:
            self._completer.deliver(act.claimed)

    def _on_entry(self, entry: Entry[_Record], f: Future[int]) -> None:
        """An entry completed (on the thread draining the ledger's acks, or on the appending thread
        if it was done when its callback was attached): the machine takes it, in order."""
        exc = f.exception()
        outcome = f.result() if exc is None else self._writer_error(exc)
        with self._mutex:
            was_ok = self._sm.error is None
            act = self._act(self._sm.settled(entry, outcome, time.monotonic()))
            self._log_failure(was_ok)
            self._changed.notify_all()
        self._after(act)

    def _settle(self, batch: list[_Settle]) -> None:
        """Outside the lock, one thread at a time (the completer): the records' futures, in order."""
        acked = 0
        for item in batch:
            if isinstance(item, Done):
                seq, eid, futures = item
                for slot, fut in enumerate(futures):
                    fut.set_result(_NEW_DLSN((seq, eid, slot)))
                acked += len(futures)
            else:
                for fut in item.tokens:
                    if not fut.done():
                        fut.set_exception(item.error)
        if acked and self._client.metrics is not None:
            self._client.metrics.stream_records_written.inc(acked)

    def _writer_error(self, exc: BaseException) -> errors.LedgerError:
        """An append's failure as the writer's: a fenced segment means another writer took over."""
        if not isinstance(exc, errors.LedgerError):
            return errors.WriteError(f"append failed: {exc!r}")
        if isinstance(exc, errors.LedgerFencedError) and not isinstance(exc, errors.StreamFencedError):
            fenced = errors.StreamFencedError(f"stream {self.ns.name}/{self.name} was taken over by another "
                                              f"writer, which recovered this writer's segment: {exc}")
            fenced.__cause__ = exc
            return fenced
        return exc

    def _log_failure(self, was_ok: bool) -> None:
        """Under the lock: say once that the writer failed."""
        if was_ok and self._sm.error is not None:
            log.warning("%r failed: %s", self, self._sm.error)

    def _fail(self, error: errors.LedgerError) -> None:
        with self._mutex:
            was_ok = self._sm.error is None
            act = self._act(self._sm.fail(self._writer_error(error)))
            self._log_failure(was_ok)
            self._changed.notify_all()
        self._after(act)

    # ------------------------------------------------------------------ segment transitions

    def _transition(self) -> None:
        """Worker thread, started by the machine once nothing is in flight: start the first segment,
        or roll the current one, then send what waits."""
        try:
            with self._mutex:
                if self._sm.error is not None:
                    return
                old, handle, first_txid = self._sm.segment, self._handle, self._sm.first_buffered_txid()
                old_end = _end_of(old) if old is not None else None
            settings = self.ns.refresh()
            w = self._client.create_ledger(settings.ensemble_size, settings.write_quorum_size,
                                           settings.ack_quorum_size, settings.digest, settings.ledger_password,
                                           custom_metadata={"stream": f"{self.ns.name}/{self.name}".encode()},
                                           namespace=self.ns.name, bookie_groups=settings.bookie_groups,
                                           bookie_groups_secondary=settings.bookie_groups_secondary)
            try:
                seq, sealed_bytes, version = self._commit_start(old, handle, old_end, w.ledger_id, first_txid)
            except BaseException:
                self._client.delete_ledger(w.ledger_id)
                raise
            with self._mutex:
                self._seg_bytes = 0   # the old segment's bytes are in sealed_bytes now
                self._quota.gate.committed(sealed_bytes, version)
                self._quota.gate.segment_started(seq, time.monotonic())
                self._handle = w
                self._record_max = settings.record_size_bytes_max
                act = self._act(self._sm.segment_started(seq, first_txid, time.monotonic(), _limits(settings)))
                self._changed.notify_all()
            self._after(act)
            if old is not None:
                if self._client.metrics is not None:
                    self._client.metrics.stream_segments_rolled.inc()
                self._retention()
        except errors.LedgerError as e:
            self._fail(e)
        except Exception as e:  # a bug must still fail the writer, not leave records waiting forever
            log.exception("%r: segment transition failed", self)
            self._fail(errors.StreamClosedError(f"segment transition failed: {e!r}"))

    def _commit_start(self, old: Segment | None, handle: WriteHandle | None, old_end: _SegmentEnd | None,
                      ledger_id: int, first_txid: int) -> tuple[int, int | None, int]:
        """Commit the new segment (sealing ``old`` in the same multi-op): its sequence number, and
        the stream's sealed bytes with the version of the stream node that holds them."""
        if old is None or handle is None or old_end is None:
            view, change = commit(self.ns, self.name,
                                  lambda v: tr.start_segment(v, ledger_id, first_txid, now_ms()), self._stream_lock)
        else:
            end = _close_segment(handle, old_end)
            view, change = commit(self.ns, self.name,
                                  lambda v: tr.roll(v, old.sequence, end, ledger_id, first_txid, now_ms()),
                                  self._stream_lock)
        if change is None or not change.create:
            raise errors.MetadataServiceError(f"{self!r}: no segment was started")
        return change.create[0].sequence, change.meta.sealed_bytes, view.version + 1

    def _retention(self) -> None:
        try:
            apply_retention(self.ns, self.name)
        except errors.LedgerError as e:
            log.warning("%r: retention after a roll failed (the next roll retries): %s", self, e)

    # ------------------------------------------------------------------ flush, close, end

    def flush(self) -> None:
        """Send everything buffered now and wait until it is acknowledged (or the writer failed)
        and every record's future is settled, its callbacks run (but those of the thread calling
        from inside such a callback)."""
        timeout_ms = self._client.config.operation_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._mutex:
                act = self._act(self._sm.step(time.monotonic(), flush=True))
                if not act.posted and act.claimed is None:
                    idle = self._sm.idle
                    if idle and self._completer.settled():
                        failed = self._sm.error
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise errors.LedgerTimeoutError(f"{self!r}: records still unacknowledged after {timeout_ms} ms")
                    # an entry completed, a transition ended or the writer failed; or futures were settled
                    (self._completer.idle if idle else self._changed).wait(left)
                    continue
            self._after(act)
        if failed is not None:
            raise self._failed_error(failed)

    def truncate(self, dlsn: DLSN) -> None:
        """No reader returns a record before ``dlsn`` from now on; whole segments before it go."""
        if not isinstance(dlsn, tuple) or len(dlsn) != 3:
            raise errors.IncorrectParameterError(f"truncate takes a DLSN, not {dlsn!r}")
        point = DLSN.of(*dlsn)
        with self._mutex:
            failed = self._sm.error
            if failed is None:
                self._check_open()
        if failed is not None:
            raise self._failed_error(failed)
        at = (point.segment, point.entry_id, point.slot)
        view, change = commit(self.ns, self.name, lambda v: tr.truncate(v, at), self._stream_lock)
        if change is not None:
            with self._mutex:   # the space it freed counts for this writer's next write at once
                self._quota.gate.committed(change.meta.sealed_bytes, view.version + 1)
        if self._client.metrics is not None:
            self._client.metrics.stream_truncations.inc()

    def mark_end_of_stream(self) -> None:
        """Seal the stream: later writes fail with EndOfStreamError and readers stop at the end."""
        self._finish(end=True)

    def close(self) -> None:
        """Send and wait for what is buffered, seal the segment, release the stream. Idempotent."""
        self._finish(end=False)

    def _finish(self, end: bool) -> None:
        with self._mutex:
            if self._closed:
                if end:
                    raise errors.StreamClosedError(f"{self!r} is closed")
                return
            failed = self._sm.error
            if end and failed is None:
                self._check_open()
            if not end or failed is None:
                self._closed = True  # no new writes from here; what is buffered still goes out
        if end and failed is not None:
            raise self._failed_error(failed)
        try:
            if failed is None:
                self.flush()
                self._seal(end)
        finally:
            with self._mutex:
                self._ended = self._ended or end
                self._quota.close()
            self._release_lock()

    def _seal(self, end: bool) -> None:
        with self._mutex:
            seg, handle = self._sm.segment, self._handle
            seg_end = _end_of(seg) if seg is not None else None
        if seg is not None and handle is not None and seg_end is not None:
            sealed = _close_segment(handle, seg_end)
            commit(self.ns, self.name, lambda v: _seal_and_maybe_end(v, seg.sequence, sealed, end), self._stream_lock)
            with self._mutex:
                self._sm.segment_sealed()
        elif end:
            commit(self.ns, self.name, lambda v: None if v.meta.end_of_stream else tr.end_stream(v),
                   self._stream_lock)

    def _release_lock(self) -> None:
        try:
            with metadata_errors(f"unlock {self.ns.name}/{self.name}"):
                self._client.store.streams.unlock_stream(self._stream_lock)
        except errors.LedgerError as e:
            log.warning("%r: releasing the lock failed (it goes with the session): %s", self, e)

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SegmentEnd(NamedTuple):
    """A segment's counters, read under the lock, for sealing it outside."""

    last_data_entry: int
    last_slot: int
    records: int
    last_txid: int


def _end_of(seg: Segment) -> _SegmentEnd:
    return _SegmentEnd(seg.last_data_entry, seg.last_slot if seg.records else -1, seg.records, seg.last_txid)


def _close_segment(h: WriteHandle, end: _SegmentEnd) -> SegmentEnd:
    """Close the segment's ledger (its entries are all acknowledged) and say where it ends: at its
    last records (a ledger written before LACs were announced may end with a control entry)."""
    h.close()
    return SegmentEnd(last_entry_id=end.last_data_entry, last_slot=end.last_slot, record_count=end.records,
                      nbytes=h.length, last_txid=end.last_txid)


def _seal_and_maybe_end(view: tr.StreamView, sequence: int, end: SegmentEnd, and_end: bool) -> tr.Change:
    sealing = tr.seal_segment(view, sequence, end, now_ms())
    if not and_end:
        return sealing
    return tr.Change(replace(sealing.meta, end_of_stream=True), update=sealing.update)
