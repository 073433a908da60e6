"""The bookie's write-ahead journal: durable, group-committed, append-only record files.

An add is acknowledged only after its journal record is on disk (DESIGN.md §5.6), so every add pays
for one fdatasync -- unless many adds share it. That is the journal's whole job: one background
thread writes everything that arrived while the previous fsync ran with one write() and one
fdatasync(), then completes the callbacks in submission order (BookKeeper's Journal.java).

Files live in one directory, named `<file id as 16 hex digits>.txn`. Ids strictly increase and a
process always starts a NEW file, so the journal never appends after bytes an earlier (possibly
crashed) process left behind. Files are preallocated (posix_fallocate) in chunks so that fdatasync
does not also have to persist a growing file size on every group.

Record format (big-endian)::

    u32 length_of_rest | u32 crc32c_of_rest | rest
    rest = u8 type | i64 ledger_id | i64 entry_id | payload

A zero length (preallocated zeros) ends a file. A record that runs past the end of the file, fails
its crc, has an unknown type or a length below the fixed part is a torn or corrupt tail: replay of
that file stops there (with a warning) and continues with the next file. A record is never
half-applied.
"""

from __future__ import annotations

import enum
import logging
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import google_crc32c

from ledger_client.protocol.checks import InvariantViolation, invariant
from spark_bookie.errors import StorageIOError
from spark_bookie.storage.files import fsync_dir
from spark_bookie.storage.flow_queue import FlowQueue

log = logging.getLogger(__name__)

FILE_SUFFIX = ".txn"
# commit_here writes a group on the submitter's thread only up to this size: bigger submits come
# under load, when overlapping the next batch's receipt with this one's fdatasync matters more.
INLINE_GROUP_BYTES_MAX = 32 * 1024
_FILE_RE = re.compile(r"^([0-9a-f]{16})\.txn$")
_HEADER = struct.Struct(">IIBqq")  # length_of_rest, crc32c_of_rest, type, ledger_id, entry_id
_FIXED = struct.Struct(">Bqq")  # the part of `rest` before the payload
_PREFIX_BYTES = 8  # length + crc
FIXED_BYTES = _FIXED.size  # 17

_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


class RecordType(enum.IntEnum):
    ADD = 1  # payload = entry body
    MASTER_KEY = 2  # payload = master key; entry_id = -1
    FENCE = 3  # payload empty; entry_id = -1
    EXPLICIT_LAC = 4  # entry_id = the lac; payload = framed lac body


_TYPES: dict[int, RecordType] = {int(t): t for t in RecordType}


class JournalRecord(NamedTuple):
    """One journaled change. A NamedTuple: one is built per add, and that is cheaper than a
    frozen dataclass."""

    type: RecordType
    ledger_id: int
    entry_id: int
    payload: bytes = b""


@dataclass(frozen=True, order=True)
class JournalPosition:
    """A byte position in the journal; records at or after it are replayed from a checkpoint mark."""

    file_id: int
    offset: int


class JournalStoppedError(StorageIOError):
    """The journal is not running (not started yet, or stopped): nothing more can be made durable."""


def file_name(file_id: int) -> str:
    return f"{file_id:016x}{FILE_SUFFIX}"


def list_journal_files(journal_dir: str | Path) -> list[tuple[int, Path]]:
    """(file id, path) of every journal file in the directory, oldest first; other names are ignored."""
    d = Path(journal_dir)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _FILE_RE.match(p.name)
        if m:
            found.append((int(m.group(1), 16), p))
    found.sort()
    return found


def encode_record(rec: JournalRecord) -> bytes:
    """Serialize one record; the crc covers type, ids and payload so any bit flip is detected."""
    payload = rec.payload
    crc = _crc_extend(_crc_value(_FIXED.pack(rec.type, rec.ledger_id, rec.entry_id)), payload)
    return _HEADER.pack(FIXED_BYTES + len(payload), crc, rec.type, rec.ledger_id, rec.entry_id) + payload


def _encode_batch(records: Sequence[JournalRecord]) -> bytes:
    """encode_record for a whole submit, joined once; kept flat because it runs for every add."""
    fixed_pack = _FIXED.pack
    header_pack = _HEADER.pack
    value = _crc_value
    extend = _crc_extend
    parts: list[bytes] = []
    append = parts.append
    for rec in records:
        t, lid, eid, payload = rec.type, rec.ledger_id, rec.entry_id, rec.payload
        crc = extend(value(fixed_pack(t, lid, eid)), payload)
        append(header_pack(FIXED_BYTES + len(payload), crc, t, lid, eid))
        append(payload)
    return b"".join(parts)


def _bad_tail(path: Path, offset: int, reason: str) -> None:
    log.warning("journal %s: torn or corrupt record at offset %d (%s); ignoring the rest of this file",
                path, offset, reason)


def iter_records(path: str | Path, start_offset: int = 0) -> Iterator[tuple[int, JournalRecord]]:
    """Yield (offset, record) for every complete, valid record from `start_offset` up to the end.

    Stops quietly at a zero length (preallocated space) and with a warning at a torn or corrupt
    record; nothing after that point in this file is yielded.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= start_offset:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from _scan(mm, size, start_offset, path)


def _scan(mm: mmap.mmap, size: int, offset: int, path: Path) -> Iterator[tuple[int, JournalRecord]]:
    unpack_from = _HEADER.unpack_from
    while offset < size:
        if offset + _PREFIX_BYTES > size:
            if any(mm[offset:size]):
                _bad_tail(path, offset, "partial record header at end of file")
            return
        length = int.from_bytes(mm[offset:offset + 4], "big")
        if length == 0:
            return
        end = offset + _PREFIX_BYTES + length
        if length < FIXED_BYTES:
            _bad_tail(path, offset, f"length {length} is below the fixed part")
            return
        if end > size:
            _bad_tail(path, offset, f"length {length} runs past the end of the file ({size} bytes)")
            return
        _, crc, t, ledger_id, entry_id = unpack_from(mm, offset)
        rest = mm[offset + _PREFIX_BYTES:end]
        if _crc_value(rest) != crc:
            _bad_tail(path, offset, "crc mismatch")
            return
        rtype = _TYPES.get(t)
        if rtype is None:
            _bad_tail(path, offset, f"unknown record type {t}")
            return
        yield offset, JournalRecord(rtype, ledger_id, entry_id, rest[FIXED_BYTES:])
        offset = end


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# Called, on the thread that wrote the group (the journal's, or a submitter's in commit_here), with
# None (durable) or the error; may return a function to run after all of its group's callbacks
# (see Journal.submit).
JournalCallback = Callable[[BaseException | None], Callable[[], None] | None]


@dataclass(slots=True)
class _Pending:
    data: bytes
    records: int
    callback: JournalCallback
    enqueued: float
    ledger_id: int | None = None


class _JournalFile:
    """The one file being appended to; only the journal thread touches it after start()."""

    def __init__(self, journal_dir: Path, file_id: int, preallocate_bytes: int) -> None:
        self.file_id = file_id
        self.path = journal_dir / file_name(file_id)
        self.offset = 0
        self.allocated = 0
        self._chunk = max(preallocate_bytes, 0)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(self.path, flags, 0o644)
        try:
            self._preallocate(0)
            os.fsync(self.fd)
            fsync_dir(journal_dir)
        except BaseException:
            os.close(self.fd)
            raise

    def _preallocate(self, needed: int) -> None:
        """Grow the allocation in whole chunks so the next groups' fdatasync do not pay for growth."""
        if self._chunk <= 0:
            return
        want = self.offset + needed
        if self.allocated and want <= self.allocated:
            return
        chunks = max(1, -(-(want - self.allocated) // self._chunk))
        grow = chunks * self._chunk
        os.posix_fallocate(self.fd, self.allocated, grow)
        self.allocated += grow

    def append(self, data: bytes) -> None:
        self._preallocate(len(data))
        _write_all(self.fd, data)
        self.offset += len(data)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self, truncate: bool) -> None:
        """Close; on a clean stop drop the unused preallocated tail (it would only read as zeros)."""
        try:
            if truncate and self.allocated > self.offset:
                os.ftruncate(self.fd, self.offset)
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


class Journal:
    """Group-committing journal over one directory; see the module docstring for the contract.

    Threading: `submit` is thread-safe and encodes in the caller's thread; one background thread
    ("journal-<dir>") writes, syncs and runs the callbacks, so callbacks must be quick and must not
    block on the journal. A submitter may instead commit a small submit itself while the journal
    is idle (`submit(..., wake=False)` then `commit_here()`): one thread wake-up less per group.
    Either way one group is written at a time (`_committing`), in submission order.

    After a failed write or fdatasync the journal is failed for good (the kernel may have dropped
    the dirty pages, so nothing later can be trusted to be durable).
    """

    def __init__(self, journal_dir: str | Path, *, group_commit_wait_ms: float = 2.0,
                 group_commit_bytes_max: int = 4 << 20, file_size_bytes_max: int = 256 << 20,
                 preallocate_bytes: int = 16 << 20, queue_records_max: int = 100_000,
                 fair: bool = False, flow_bytes_max: int = 1 << 20) -> None:
        invariant(group_commit_wait_ms >= 0, f"group_commit_wait_ms {group_commit_wait_ms} < 0")
        invariant(group_commit_bytes_max > 0, f"group_commit_bytes_max {group_commit_bytes_max} <= 0")
        invariant(file_size_bytes_max > 0, f"file_size_bytes_max {file_size_bytes_max} <= 0")
        invariant(preallocate_bytes >= 0, f"preallocate_bytes {preallocate_bytes} < 0")
        invariant(queue_records_max > 0, f"queue_records_max {queue_records_max} <= 0")
        invariant(flow_bytes_max > 0, f"flow_bytes_max {flow_bytes_max} <= 0")
        self.journal_dir = Path(journal_dir)
        self._wait_s = group_commit_wait_ms / 1000.0
        self._group_bytes_max = group_commit_bytes_max
        self._file_size_max = file_size_bytes_max
        self._preallocate = preallocate_bytes
        self._queue_records_max = queue_records_max
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        # Submits waiting for a group; with `fair`, one queue per flow taken in turns (flow_queue.py).
        self._queue: FlowQueue[_Pending] = FlowQueue(fair)
        self._flow_bytes_max = flow_bytes_max
        self._queued_records = 0
        self._state = "new"  # new -> running -> stopping -> stopped
        self._failed: BaseException | None = None
        self._file: _JournalFile | None = None
        self._thread: threading.Thread | None = None
        self._written = JournalPosition(0, 0)
        self._committing = False  # a group is being written (by the journal thread or in commit_here)
        self.groups_synced = 0  # fdatasync calls that completed; for benchmarks and tests
        # Called after each group's write + fdatasync with (seconds, records, bytes): the bookie's
        # metrics (spark_bookie.server.metrics); None costs nothing. Runs on the committing thread.
        self.on_sync: Callable[[float, int, int], None] | None = None

    # ---- before start

    def replay(self, mark: JournalPosition | None, apply: Callable[[JournalRecord], None]) -> int:
        """Apply every complete record at or after `mark` (None = everything), oldest first.

        Must run before start(): the new file start() creates must not be mistaken for history.
        """
        invariant(self._state == "new", "Journal.replay must be called before start()")
        count = 0
        for file_id, path in list_journal_files(self.journal_dir):
            if mark is not None and file_id < mark.file_id:
                continue
            start = mark.offset if mark is not None and file_id == mark.file_id else 0
            for _, rec in iter_records(path, start):
                apply(rec)
                count += 1
        return count

    def start(self) -> None:
        """Open a new file (id = newest existing + 1) and start the group-commit thread."""
        with self._lock:
            invariant(self._state == "new", f"Journal.start called in state {self._state}")
            try:
                self.journal_dir.mkdir(parents=True, exist_ok=True)
                existing = list_journal_files(self.journal_dir)
                file_id = existing[-1][0] + 1 if existing else 1
                self._file = _JournalFile(self.journal_dir, file_id, self._preallocate)
            except OSError as e:
                raise StorageIOError(f"cannot open a journal file in {self.journal_dir}: {e}") from e
            self._written = JournalPosition(file_id, 0)
            self._thread = threading.Thread(target=self._run, name=f"journal-{self.journal_dir}", daemon=True)
            self._state = "running"
            self._thread.start()

    # ---- any thread

    def submit(self, records: Sequence[JournalRecord], callback: JournalCallback, wake: bool = True,
               flow: Hashable = None) -> None:
        """Make `records` durable, then call `callback(None)` (or `callback(error)` if the disk failed).

        A callback may return a function to run once the whole group's callbacks have run (the
        same function returned by several callbacks of a group runs once): a connection answers
        all of its adds in a group with one message.

        With `wake=False` the caller must call commit_here() next (it may first release its own
        locks), which commits on the caller's thread or else wakes the journal thread.

        Blocks while the queue holds queue_records_max records (back-pressure on the network). A
        submit larger than the whole bound is still accepted once the queue is empty. ``flow``:
        whose records these are, when the journal takes flows in turns (see wait_for_room); the
        records are then of one ledger, whose order the journal keeps (flow_queue.py).
        """
        data = _encode_batch(records)
        n = len(records)
        ledger_id = records[0].ledger_id if records else None
        with self._lock:
            self._check_open()
            while self._queued_records and self._queued_records + n > self._queue_records_max:
                self._not_full.wait()
                self._check_open()
            self._queue.put(flow, _Pending(data, n, callback, time.monotonic(), ledger_id))
            self._queued_records += n
            if wake:
                self._not_empty.notify()

    def wait_for_room(self, flow: Hashable, timeout_s: float | None = None) -> bool:
        """Block while ``flow`` has flow_bytes_max or more queued (fair journals only): called by a
        connection's thread before it applies a batch, holding no lock, so that a flooding flow's
        connections stop reading while the others' go on. False if it timed out."""
        if not self._queue.fair:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while (self._queue.queued_bytes(flow) >= self._flow_bytes_max and self._failed is None
                   and self._state == "running"):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._not_full.wait(remaining)
        return True

    def commit_here(self) -> None:
        """Write, sync and complete what is queued on this thread if that is one small group the
        journal is idle for (no group being written, no group wait configured); else wake the
        journal thread. At a few adds at a time this spares each group the journal thread's
        wake-up, a hop of latency and a share of the CPU per add; large groups still go to the
        journal thread, so a connection's next batch is received while they are written."""
        with self._lock:
            queue = self._queue
            only = queue.only_item()
            here = (not self._committing and only is not None and len(only.data) <= INLINE_GROUP_BYTES_MAX
                    and self._wait_s == 0 and self._state == "running" and self._failed is None)
            if not here:
                if queue:
                    self._not_empty.notify()
                return
            self._committing = True
            group = queue.take(INLINE_GROUP_BYTES_MAX, False)
            self._queued_records -= group[0].records
            self._not_full.notify_all()
        try:
            self._commit(group)
        except BaseException as e:  # as the journal thread does: fail loudly rather than hang submitters
            log.exception("journal commit for %s failed", self.journal_dir)
            self._fail(e)
            self._fail_queued()
            raise
        finally:
            with self._lock:
                self._committing = False
                if queue or self._state != "running" or self._failed is not None:
                    self._not_empty.notify()  # only then: an idle journal thread is waiting

    def _check_open(self) -> None:
        if self._failed is not None:
            failed = self._failed
            raise StorageIOError(f"journal {self.journal_dir} failed earlier: {failed}") from failed
        if self._state != "running":
            raise JournalStoppedError(f"journal {self.journal_dir} is {self._state}, not accepting records")

    @property
    def queued_records(self) -> int:
        """Records submitted and not yet taken into a group (BookKeeper's JOURNAL_QUEUE_SIZE)."""
        return self._queued_records

    def last_written_position(self) -> JournalPosition:
        """End of the last record handed to the OS; a checkpoint taken after that can use it as mark."""
        return self._written

    def remove_files_before(self, mark: JournalPosition) -> list[Path]:
        """Delete journal files older than the checkpoint mark's file; never the file being written."""
        current = self._file.file_id if self._file is not None else None
        removed: list[Path] = []
        try:
            for file_id, path in list_journal_files(self.journal_dir):
                if file_id >= mark.file_id or file_id == current:
                    continue
                path.unlink()
                removed.append(path)
            if removed:
                fsync_dir(self.journal_dir)
        except OSError as e:
            raise StorageIOError(f"cannot remove old journal files in {self.journal_dir}: {e}") from e
        return removed

    def stop(self) -> None:
        """Write and sync everything already submitted, run its callbacks, close the file. Idempotent."""
        with self._lock:
            if self._state == "new":
                self._state = "stopped"
                return
            if self._state == "running":
                self._state = "stopping"
            self._not_empty.notify_all()
            self._not_full.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # ---- the journal thread

    def _run(self) -> None:
        try:
            while True:
                group = self._take_group()
                if group is None:
                    break
                try:
                    self._commit(group)
                finally:
                    with self._lock:
                        self._committing = False
        except BaseException as e:  # an invariant or a bug: fail loudly rather than hang submitters
            log.exception("journal thread for %s died", self.journal_dir)
            self._fail(e)
            self._fail_queued()
        finally:
            self._close_file()
            with self._lock:
                self._state = "stopped"
                self._not_full.notify_all()

    def _take_group(self) -> list[_Pending] | None:
        """Everything queued up to group_commit_bytes_max; wait a little for more if the group is small.

        The wait is measured from the oldest record's arrival (as BookKeeper does), so under load,
        when records piled up during the previous fsync, the group is flushed without sleeping.
        """
        with self._lock:
            while self._committing or (self._failed is None and not self._queue and self._state == "running"):
                self._not_empty.wait()
            if not self._queue or self._failed is not None:
                return None
            self._committing = True
            deadline = self._queue.oldest_enqueued() + self._wait_s
            group: list[_Pending] = []
            size = self._drain_locked(group, 0)
            while size < self._group_bytes_max and self._state == "running":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if not self._queue:
                    self._not_empty.wait(remaining)
                size = self._drain_locked(group, size)
            self._not_full.notify_all()
            return group

    def _drain_locked(self, group: list[_Pending], size: int) -> int:
        """Move queued submits into the group while it stays under the byte bound (always >= 1 submit)."""
        for p in self._queue.take(self._group_bytes_max - size, bool(group)):
            self._queued_records -= p.records
            group.append(p)
            size += len(p.data)
        return size

    def _commit(self, group: list[_Pending]) -> None:
        """One write, one fdatasync, then the callbacks in submission order; roll the file if full."""
        jf = self._file
        if jf is None:
            raise InvariantViolation("journal thread running without an open file")
        data = group[0].data if len(group) == 1 else b"".join([p.data for p in group])
        error: BaseException | None = None
        on_sync = self.on_sync
        started = time.perf_counter() if on_sync is not None else 0.0
        try:
            if data:
                jf.append(data)
                self._written = JournalPosition(jf.file_id, jf.offset)
            jf.sync()
            self.groups_synced += 1
            if on_sync is not None:
                on_sync(time.perf_counter() - started, sum(p.records for p in group), len(data))
        except OSError as e:
            error = StorageIOError(f"journal write/fdatasync failed on {jf.path}: {e}")
            error.__cause__ = e
            log.error("journal %s failed; refusing all further records: %s", jf.path, e)
            self._fail(error)
        self._complete(group, error)
        if error is not None:
            self._fail_queued()
        elif jf.offset >= self._file_size_max:
            self._roll(jf)

    def _complete(self, group: list[_Pending], error: BaseException | None) -> None:
        after: dict[Callable[[], None], None] = {}  # insertion-ordered and without repeats
        for p in group:
            try:
                then = p.callback(error)
                if then is not None:
                    after[then] = None
            except Exception:
                log.exception("journal callback raised; ignored")
        for then in after:
            try:
                then()
            except Exception:
                log.exception("journal group callback raised; ignored")

    def _roll(self, jf: _JournalFile) -> None:
        try:
            jf.close(truncate=False)
            self._file = None
            self._file = _JournalFile(self.journal_dir, jf.file_id + 1, self._preallocate)
            self._written = JournalPosition(self._file.file_id, 0)
        except OSError as e:
            error = StorageIOError(f"cannot roll the journal in {self.journal_dir}: {e}")
            error.__cause__ = e
            log.error("%s", error)
            self._fail(error)
            self._fail_queued()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = error
            self._not_full.notify_all()
            self._not_empty.notify_all()

    def _fail_queued(self) -> None:
        """After a failure nothing queued can become durable: tell every waiting submitter now."""
        with self._lock:
            rest = self._queue.drain()
            self._queued_records = 0
            self._not_full.notify_all()
        self._complete(rest, self._failed)

    def _close_file(self) -> None:
        jf, self._file = self._file, None
        if jf is None:
            return
        try:
            jf.close(truncate=self._failed is None)
        except OSError as e:
            log.warning("closing journal file %s: %s", jf.path, e)
