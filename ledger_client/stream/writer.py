"""The single writer of a stream (DistributedLog's BKAsyncLogWriter, DESIGN §4.5).

Records are buffered and packed into record sets, one ledger entry each: an entry is sent at once
when nothing is in flight (one record alone is fast), while entries are in flight records gather
until the buffer reaches ``output_buffer_bytes`` or the in-flight entry completes (many records
are cheap). Entries complete in order, so record futures do too; a failed entry fails the writer
and every record after it.

Segment transitions (start, roll, seal) change the metadata, so they run on the client's worker
threads, never on a caller's or on the thread reading bookie answers; records written meanwhile
wait in the buffer. A roll waits for the old segment's entries, closes its ledger, then seals it
and starts the next in one multi-op; the next ledger is created before, so the writes wait about
two metadata round trips. After the last entry completes and nothing is buffered, the writer
writes a control record (an entry without records), whose piggybacked LAC lets a tailing reader
see the last records of an idle writer at once.

Opening a writer takes the stream's ZooKeeper lock and recovers a dead writer's segment with
fencing first (invariant 9); every metadata change it makes checks that it still holds the lock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from metadata.streams import SegmentEnd, StreamLockInfo
from metadata.streams import transitions as tr

from .. import errors
from ..futures import AppendFuture
from ..metadata_errors import metadata_errors
from .dlsn import DLSN
from .meta import check_names, now_ms
from .records import FLAG_CONTROL, RECORD_OVERHEAD_BYTES, encode
from .segments import apply_retention, commit, recover_segment

if TYPE_CHECKING:
    from ..write_handle import WriteHandle
    from .namespace import Namespace

log = logging.getLogger(__name__)

_Pending = tuple[int, bytes, "Future[DLSN]"]   # (txid, payload, future)
# (records done with their DLSNs, records failed, their error)
_Ready = tuple[list[tuple["Future[DLSN]", DLSN]], list["Future[DLSN]"], "errors.LedgerError"]


@dataclass
class _Segment:
    sequence: int
    handle: WriteHandle
    started: float                    # monotonic
    records: int = 0                  # records sent to it so far (a record set's "records before")
    payload_bytes: int = 0
    last_txid: int = -1
    last_slot: int = -1
    last_data_entry: int = -1         # the last entry holding records (a control entry may follow it)


@dataclass
class _Entry:
    segment: _Segment
    futures: list[Future[DLSN]] = field(default_factory=list)
    outcome: Future[int] | None = None   # set by the append's callback
    control: bool = False                # a control record set: no records, it carries the LAC


class StreamWriter:
    """Thread-safe. Also a context manager (``close`` on exit)."""

    def __init__(self, ns: Namespace, name: str, lock_timeout_ms: int = 30_000) -> None:
        check_names((name, "stream"))
        if not isinstance(lock_timeout_ms, int) or lock_timeout_ms < 0:
            raise errors.IncorrectParameterError(f"lock_timeout_ms must be a non-negative int, not {lock_timeout_ms!r}")
        self.ns, self.name = ns, name
        self._client = ns.client
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._buffer: deque[_Pending] = deque()
        self._buffer_bytes = 0
        self._in_flight: deque[_Entry] = deque()
        self._seg: _Segment | None = None
        self._busy = False                 # a segment transition is running
        self._ready: deque[_Ready] = deque()  # completions to resolve, in order (see _drain_ready)
        self._draining = False
        self._missed = False               # a completion came while the mutex was held
        self._error: errors.LedgerError | None = None
        self._taken_by: str | None = None  # who took the stream over, once a write after it asked
        self._closed = False
        self._ended = False
        ns.ensure_stream(name)
        self._settings_cached()
        owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        with metadata_errors(f"lock stream {ns.name}/{name}"):
            self._lock: StreamLockInfo = self._client.store.lock_stream(ns.name, name, owner, lock_timeout_ms / 1000)
        try:
            self._last_txid = self._recover()
        except BaseException:
            self._release_lock()
            raise

    def _settings_cached(self) -> None:
        """The namespace's limits this writer checks per record (re-read at each new segment)."""
        s = self.ns.settings
        self._out_max, self._record_max = s.output_buffer_bytes, s.record_size_bytes_max

    def _recover(self) -> int:
        """Seal what a dead writer left in progress (fencing its ledger); returns the last txid."""
        view = self.ns.view(self.name)
        seg = view.in_progress
        if seg is not None:
            recover_segment(self.ns, self.name, seg, self._lock)
            view = self.ns.view(self.name)
        self._ended = view.meta.end_of_stream
        return view.meta.max_txid

    def __repr__(self) -> str:
        return f"StreamWriter({self.ns.name}/{self.name})"

    @property
    def last_txid(self) -> int:
        return self._last_txid

    # ------------------------------------------------------------------ writing

    def write(self, payload: bytes, txid: int | None = None) -> DLSN:
        """Durable (Qa bookies) when it returns; the record's position."""
        return self.write_async(payload, txid).result(timeout=self._client.config.operation_timeout_ms / 1000)

    def write_async(self, payload: bytes, txid: int | None = None) -> Future[DLSN]:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise errors.IncorrectParameterError(f"a record is bytes, not {type(payload).__name__}")
        data = bytes(payload)
        limit = self._record_max
        if len(data) > limit:
            raise errors.RecordTooLargeError(f"a record of {len(data)} bytes is over record_size_bytes_max ({limit})")
        if txid is not None and (not isinstance(txid, int) or isinstance(txid, bool)):
            raise errors.IncorrectParameterError(f"txid must be an int, not {txid!r}")
        if self._error is not None:  # before the mutex: naming who took the stream over reads ZooKeeper
            raise self._failed_error()
        fut: Future[DLSN] = AppendFuture()   # settled once, by the completion drainer
        try:
            with self._mutex:   # not _locked(): a context manager per record cost ~1 us; `finally` is its exit
                self._check_writable()
                if txid is None:
                    txid = self._last_txid + 1
                elif txid < self._last_txid:
                    raise errors.TransactionIdOutOfOrderError(
                        f"txid {txid} is below the stream's last txid {self._last_txid}")
                self._last_txid = txid
                self._buffer.append((txid, data, fut))
                self._buffer_bytes += len(data) + RECORD_OVERHEAD_BYTES
                if not self._in_flight or self._buffer_bytes >= self._out_max:
                    self._pump_locked(full_only=bool(self._in_flight))
        finally:
            if self._missed:
                self._process_completions()
        return fut

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._failed_error(look_up=False)
        if self._ended:
            raise errors.EndOfStreamError(f"stream {self.ns.name}/{self.name} has ended")
        if self._closed:
            raise errors.StreamClosedError(f"{self!r} is closed")

    def _failed_error(self, look_up: bool = True) -> errors.LedgerError:
        """What a write, flush or truncation gets once the writer failed, its failure chained: after
        a takeover (the segment fenced) StreamFencedError, a LedgerFencedError naming the writer that
        took the stream over (``look_up``: read its lock node, once; never under the mutex);
        otherwise StreamClosedError."""
        error = self._error
        if not isinstance(error, errors.LedgerFencedError):
            failed: errors.LedgerError = errors.StreamClosedError(f"{self!r} failed: {error}")
        else:
            if look_up and self._taken_by is None:
                self._taken_by = self._new_owner()
            failed = errors.StreamFencedError(
                f"stream {self.ns.name}/{self.name} was taken over by {self._taken_by or 'another writer'}, which "
                "fenced this writer's segment: this writer can write no more")
        failed.__cause__ = error
        return failed

    def _new_owner(self) -> str:
        """The writer that holds the stream now, from its lock node ("another writer" if none does
        or ZooKeeper cannot say)."""
        try:
            with metadata_errors(f"read the lock of {self.ns.name}/{self.name}"):
                holder = self._client.store.stream_lock_holder(self.ns.name, self.name)
        except errors.LedgerError as e:
            log.info("%r: who took the stream over is unknown: %s", self, e)
            return "another writer"
        return f"writer {holder}" if holder and holder != self._lock.owner else "another writer"

    def _pump_locked(self, full_only: bool) -> None:
        """Under the mutex: send buffered records as entries (only full ones with ``full_only``),
        or hand a due segment transition to a worker thread."""
        if self._busy or not self._buffer or self._error is not None:
            return
        seg = self._seg
        if seg is None or self._roll_due(seg):
            self._busy = True
            self._client.run_soon(self._transition)
            return
        out_max = self._out_max
        while self._buffer and (not full_only or self._buffer_bytes >= out_max):
            if self._roll_due(seg):  # a backlog goes to the next segment, not all into this one
                self._busy = True
                self._client.run_soon(self._transition)
                return
            self._send_entry_locked(seg, out_max)
            full_only = True

    def _roll_due(self, seg: _Segment) -> bool:
        s = self.ns.settings
        return ((s.segment_rolling_bytes is not None and seg.payload_bytes >= s.segment_rolling_bytes)
                or (s.segment_rolling_interval_ms is not None
                    and (time.monotonic() - seg.started) * 1000 >= s.segment_rolling_interval_ms))

    def _send_entry_locked(self, seg: _Segment, out_max: int) -> None:
        txids: list[int] = []
        payloads: list[bytes] = []
        entry = _Entry(seg)
        size = 0
        while self._buffer and (not payloads or size + len(self._buffer[0][1]) + RECORD_OVERHEAD_BYTES <= out_max):
            txid, data, fut = self._buffer.popleft()
            txids.append(txid)
            payloads.append(data)
            entry.futures.append(fut)
            size += len(data) + RECORD_OVERHEAD_BYTES
        self._buffer_bytes -= size
        body = encode(txids, payloads, seg.records)
        seg.records += len(payloads)
        seg.payload_bytes += size
        seg.last_txid, seg.last_slot = txids[-1], len(payloads) - 1
        self._in_flight.append(entry)
        try:
            appended = seg.handle.append_async(body)
        except errors.LedgerError as e:
            self._in_flight.pop()
            self._ready.append(([], self._fail_locked(e, entry.futures), self._error or e))
            self._missed = True
            return  # resolved when the mutex is let go (user callbacks never run under it)
        appended.add_done_callback(partial(self._on_entry, entry))

    def _on_entry(self, entry: _Entry, f: Future[int]) -> None:
        """An entry completed (on the thread draining the ledger's acks, or on ours at once if it
        was done when its callback was added: then we hold the mutex, and whoever holds it takes
        the completion when it lets go)."""
        entry.outcome = f
        self._process_completions()

    def _process_completions(self) -> None:
        """Move completed entries to the ready queue and resolve their records, strictly in entry
        order, by one thread at a time, never under the mutex (user callbacks run there), and
        without ever waiting for the mutex here (this may run inside a callback under it)."""
        self._missed = True   # first: whoever holds the mutex sees it once they let go
        while self._missed:   # set again while we held the mutex: a completion that found it taken
            if not self._mutex.acquire(blocking=False):
                return  # its holder calls this again once it lets go
            try:
                self._missed = False
                self._absorb_locked()
                drain = not self._draining and bool(self._ready)
                if drain:
                    self._draining = True
            finally:
                self._mutex.release()
            if drain:
                self._drain_ready()

    def _drain_ready(self) -> None:
        while True:
            with self._mutex:
                self._absorb_locked()
                if not self._ready:
                    self._draining = False
                    return
                work = list(self._ready)
                self._ready.clear()
            acked = 0
            for done, failed, error in work:
                for fut, dlsn in done:
                    fut.set_result(dlsn)
                acked += len(done)
                _fail_all(failed, error)
            if acked and self._client.metrics is not None:
                self._client.metrics.stream_records_written.inc(acked)

    def _absorb_locked(self) -> None:
        """Under the mutex: take completed entries off the head of the in-flight queue, in order."""
        done: list[tuple[Future[DLSN], DLSN]] = []
        failed: list[Future[DLSN]] = []
        last: _Entry | None = None
        popped = False
        while self._in_flight and self._in_flight[0].outcome is not None:
            entry = self._in_flight.popleft()
            popped = True
            f = entry.outcome
            exc = f.exception() if f is not None else None
            if exc is not None or f is None:
                failed = self._fail_locked(_as_ledger_error(exc or RuntimeError("no outcome")), entry.futures)
                break
            if entry.control:
                continue
            eid = f.result()
            seq = entry.segment.sequence
            done += [(fut, DLSN(seq, eid, i)) for i, fut in enumerate(entry.futures)]
            entry.segment.last_data_entry = max(entry.segment.last_data_entry, eid)
            last = entry
        if not popped:
            return
        if self._error is None:   # a control entry's completion also frees the way for the buffer
            self._pump_locked(full_only=bool(self._in_flight))
            if not self._in_flight and not self._buffer and not self._busy and last is not None:
                self._send_control_locked(last.segment)
        if done or failed:
            error = self._error or errors.StreamClosedError("writer failed")
            self._ready.append((done, failed, error))
            self._missed = True   # resolved when the mutex is let go
        self._cond.notify_all()

    def _send_control_locked(self, seg: _Segment) -> None:
        """The writer went idle: an entry without records, whose piggybacked LAC covers the last
        data entry, so tailing readers see the last records now, not when the next write comes
        (DistributedLog's control records). Cheaper than an explicit LAC (three gRPC calls): it
        travels on the add connections like any entry."""
        entry = _Entry(seg, control=True)
        self._in_flight.append(entry)
        try:
            appended = seg.handle.append_async(encode([], [], seg.records, FLAG_CONTROL))
        except errors.LedgerError as e:
            self._in_flight.pop()
            log.debug("%r: control record not sent: %s", self, e)
            return
        appended.add_done_callback(partial(self._on_entry, entry))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The mutex, and on letting go the completions that arrived while it was held."""
        with self._mutex:
            yield
        if self._missed:
            self._process_completions()

    def _fail_locked(self, error: errors.LedgerError, also: list[Future[DLSN]] | None = None) -> list[Future[DLSN]]:
        """Under the mutex: the writer is broken; every record not yet acknowledged fails."""
        if self._error is None:
            if isinstance(error, errors.LedgerFencedError):
                error = errors.StreamFencedError(f"stream {self.ns.name}/{self.name} was taken over by another "
                                                 f"writer, which recovered this writer's segment: {error}")
            self._error = error
            log.warning("%r failed: %s", self, error)
        futs = list(also or [])
        for e in self._in_flight:
            futs += e.futures
        futs += [p[2] for p in self._buffer]
        self._in_flight.clear()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._cond.notify_all()
        return futs

    def _fail(self, error: errors.LedgerError) -> None:
        with self._locked():  # the failed records are resolved, in order, when it lets go
            self._ready.append(([], self._fail_locked(error), self._error or error))
            self._missed = True
            self._busy = False

    # ------------------------------------------------------------------ segment transitions

    def _transition(self) -> None:
        """Worker thread: start the first segment, or roll the current one, then send what waits."""
        try:
            with self._locked():
                while self._in_flight and self._error is None:
                    self._cond.wait(0.05)
                    self._absorb_locked()
                old, first_txid = self._seg, (self._buffer[0][0] if self._buffer else self._last_txid)
            if self._error is not None:
                return
            settings = self.ns.refresh()
            self._settings_cached()
            w = self._client.create_ledger(settings.ensemble_size, settings.write_quorum_size,
                                           settings.ack_quorum_size, settings.digest, settings.ledger_password,
                                           custom_metadata={"stream": f"{self.ns.name}/{self.name}".encode()})
            try:
                seq = self._commit_start(old, w.ledger_id, first_txid)
            except BaseException:
                self._client.delete_ledger(w.ledger_id)
                raise
            with self._locked():
                self._seg = _Segment(seq, w, time.monotonic(), last_txid=first_txid)
                self._busy = False
                self._pump_locked(full_only=False)
                self._cond.notify_all()
            if old is not None:
                if self._client.metrics is not None:
                    self._client.metrics.stream_segments_rolled.inc()
                self._retention()
        except errors.LedgerError as e:
            self._fail(e)
        except Exception as e:  # a bug must still fail the writer, not leave records waiting forever
            log.exception("%r: segment transition failed", self)
            self._fail(errors.StreamClosedError(f"segment transition failed: {e!r}"))

    def _commit_start(self, old: _Segment | None, ledger_id: int, first_txid: int) -> int:
        """Commit the new segment (sealing ``old`` in the same multi-op); its sequence number."""
        if old is None:
            _view, change = commit(self.ns, self.name,
                                   lambda v: tr.start_segment(v, ledger_id, first_txid, now_ms()), self._lock)
        else:
            end = self._close_segment(old)
            _view, change = commit(self.ns, self.name,
                                   lambda v: tr.roll(v, old.sequence, end, ledger_id, first_txid, now_ms()), self._lock)
        if change is None or not change.create:
            raise errors.MetadataServiceError(f"{self!r}: no segment was started")
        return change.create[0].sequence

    def _close_segment(self, seg: _Segment) -> SegmentEnd:
        """Close the segment's ledger (its entries are all acknowledged) and say where it ends."""
        h = seg.handle
        h.close()
        # The ledger may end with a control entry: the segment ends at its last records.
        return SegmentEnd(last_entry_id=seg.last_data_entry, last_slot=seg.last_slot if seg.records else -1,
                          record_count=seg.records, nbytes=h.length, last_txid=seg.last_txid)

    def _retention(self) -> None:
        try:
            apply_retention(self.ns, self.name)
        except errors.LedgerError as e:
            log.warning("%r: retention after a roll failed (the next roll retries): %s", self, e)

    # ------------------------------------------------------------------ flush, close, end

    def flush(self) -> None:
        """Send everything buffered now and wait until it is acknowledged (or the writer failed)."""
        deadline = time.monotonic() + self._client.config.operation_timeout_ms / 1000
        with self._locked():
            self._pump_locked(full_only=False)
            while (self._buffer or self._in_flight or self._busy) and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.LedgerTimeoutError(f"{self!r}: records still unacknowledged after "
                                                    f"{self._client.config.operation_timeout_ms} ms")
                self._cond.wait(min(left, 0.05))
                self._absorb_locked()
                self._pump_locked(full_only=False)
        if self._error is not None:
            raise self._failed_error()

    def truncate(self, dlsn: DLSN) -> None:
        """No reader returns a record before ``dlsn`` from now on; whole segments before it go."""
        if not isinstance(dlsn, tuple) or len(dlsn) != 3:
            raise errors.IncorrectParameterError(f"truncate takes a DLSN, not {dlsn!r}")
        point = DLSN.of(*dlsn)
        if self._error is not None:
            raise self._failed_error()
        with self._locked():
            self._check_writable()
        commit(self.ns, self.name, lambda v: tr.truncate(v, (point.segment, point.entry_id, point.slot)), self._lock)
        if self._client.metrics is not None:
            self._client.metrics.stream_truncations.inc()

    def mark_end_of_stream(self) -> None:
        """Seal the stream: later writes fail with EndOfStreamError and readers stop at the end."""
        self._finish(end=True)

    def close(self) -> None:
        """Send and wait for what is buffered, seal the segment, release the stream. Idempotent."""
        self._finish(end=False)

    def _finish(self, end: bool) -> None:
        with self._locked():
            if self._closed:
                if end:
                    raise errors.StreamClosedError(f"{self!r} is closed")
                return
            if end:
                self._check_writable()
            self._closed = True  # no new writes from here; what is buffered still goes out
        try:
            if self._error is None:
                self.flush()
                self._seal(end)
        finally:
            with self._locked():
                self._ended = self._ended or end
            self._release_lock()

    def _seal(self, end: bool) -> None:
        seg = self._seg
        if seg is not None:
            sealed_end = self._close_segment(seg)
            commit(self.ns, self.name, lambda v: _seal_and_maybe_end(v, seg.sequence, sealed_end, end), self._lock)
            self._seg = None
        elif end:
            commit(self.ns, self.name, lambda v: None if v.meta.end_of_stream else tr.end_stream(v), self._lock)

    def _release_lock(self) -> None:
        try:
            with metadata_errors(f"unlock {self.ns.name}/{self.name}"):
                self._client.store.unlock_stream(self._lock)
        except errors.LedgerError as e:
            log.warning("%r: releasing the lock failed (it goes with the session): %s", self, e)

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seal_and_maybe_end(view: tr.StreamView, sequence: int, end: SegmentEnd, and_end: bool) -> tr.Change:
    sealing = tr.seal_segment(view, sequence, end, now_ms())
    if not and_end:
        return sealing
    return tr.Change(replace(sealing.meta, end_of_stream=True), update=sealing.update)


def _fail_all(futures: list[Future[DLSN]], error: errors.LedgerError) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)


def _as_ledger_error(exc: BaseException) -> errors.LedgerError:
    return exc if isinstance(exc, errors.LedgerError) else errors.WriteError(f"append failed: {exc!r}")
