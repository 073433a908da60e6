"""Checkpoints: make ledger storage durable, then move the journal's replay mark past it.

BookKeeper's SyncThread: take the journal position first, flush ledger storage (everything the
journal wrote before that position was applied to storage before it was journaled), persist the
mark atomically, then delete journal files wholly before the mark. On start, the journal replays
from the mark, so a crash at any point replays at most what a checkpoint had not yet covered.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import google_crc32c

from spark_bookie.errors import CorruptDataError, DiskFullError
from spark_bookie.storage.files import fsync_dir
from spark_bookie.storage.journal import Journal, JournalPosition, JournalRecord, RecordType
from spark_bookie.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)
_MARK = struct.Struct(">qqI")
MARK_FILE = "lastMark"


def read_mark(ledger_dir: str | Path) -> JournalPosition | None:
    p = Path(ledger_dir) / "current" / MARK_FILE
    if not p.exists():
        return None
    data = p.read_bytes()
    if len(data) != _MARK.size:
        raise CorruptDataError(f"{p} is {len(data)} bytes, expected {_MARK.size}")
    file_id, offset, crc = _MARK.unpack(data)
    if google_crc32c.value(data[:16]) != crc:
        raise CorruptDataError(f"{p} fails its checksum")
    return JournalPosition(file_id, offset)


def write_mark(ledger_dir: str | Path, mark: JournalPosition) -> None:
    cur = Path(ledger_dir) / "current"
    cur.mkdir(parents=True, exist_ok=True)
    head = struct.pack(">qq", mark.file_id, mark.offset)
    tmp = cur / (MARK_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head + struct.pack(">I", google_crc32c.value(head)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, cur / MARK_FILE)
    fsync_dir(cur)


class Checkpointer:
    def __init__(self, storage: LedgerStorage, journal: Journal, ledger_dir: str | Path,
                 flush_interval_ms: int, on_disk_full: Callable[[], None] = lambda: None) -> None:
        """``on_disk_full`` is called when a flush was refused for lack of space (the disk
        monitor then turns the bookie read-only without waiting for its next check)."""
        self._storage = storage
        self._on_disk_full = on_disk_full
        self._full = False
        self._journal = journal
        self._dir = Path(ledger_dir)
        self._interval_s = flush_interval_ms / 1000.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_mark: JournalPosition | None = None

    def lag_bytes(self) -> int:
        """Journal bytes written since the last mark, counted within the current journal file (a
        file rolled since the mark counts from its start): what a restart would replay, roughly."""
        written, mark = self._journal.last_written_position(), self._last_mark
        if mark is None or mark.file_id != written.file_id:
            return written.offset
        return max(0, written.offset - mark.offset)

    def apply(self, rec: JournalRecord) -> None:
        """Re-apply one journal record to ledger storage (replay is idempotent).

        A record for a ledger the bookie no longer has was written before GC deleted that ledger
        (its master key was already checkpointed, so it is not re-created here): skip it.
        """
        s = self._storage
        if rec.type == RecordType.MASTER_KEY:
            if s.master_key(rec.ledger_id) is None:
                s.set_master_key(rec.ledger_id, rec.payload)
            return
        if not s.ledger_exists(rec.ledger_id):
            log.info("replay: skipping %s of deleted ledger %d", rec.type.name, rec.ledger_id)
            return
        if rec.type == RecordType.ADD:
            if s.entry_location(rec.ledger_id, rec.entry_id) is not None:
                # Already in an entry log: a flush the cache's size forced between checkpoints
                # does not move the mark. Re-adding it would write it twice, and on a full disk
                # ask for room the data already has.
                return
            try:
                s.add_entry(rec.ledger_id, rec.entry_id, rec.payload)
            except DiskFullError:
                pass  # the entry is in the write cache; the journal keeps it until a flush fits
        elif rec.type == RecordType.FENCE:
            s.set_fenced(rec.ledger_id)
        elif rec.type == RecordType.EXPLICIT_LAC:
            s.set_explicit_lac(rec.ledger_id, rec.entry_id, rec.payload)

    def replay(self) -> int:
        mark = read_mark(self._dir)
        self._last_mark = mark
        return self._journal.replay(mark, self.apply)

    def checkpoint(self) -> JournalPosition:
        with self._lock:
            mark = self._journal.last_written_position()
            self._storage.flush()
            if mark != self._last_mark:
                write_mark(self._dir, mark)
                self._last_mark = mark
                removed = self._journal.remove_files_before(mark)
                if removed:
                    log.debug("removed journal files %s", [p.name for p in removed])
            return mark

    def try_checkpoint(self) -> bool:
        """checkpoint(), except that a flush refused for lack of space is not an error: the
        entries stay in the write cache and in the journal (the mark does not move), reads are
        served from the cache, and the next checkpoint tries again. Logged once per episode."""
        try:
            self.checkpoint()
        except DiskFullError as e:
            if not self._full:
                log.warning("checkpoint deferred: %s; the journal keeps everything since the last mark", e)
            self._full = True
            self._on_disk_full()
            return False
        if self._full:
            log.info("checkpoint: the write cache fits on the ledger disk again")
        self._full = False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bookie-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Start each bookie's cycle at a random phase: bookies started together would otherwise
        # flush together, and a write quorum waiting on two stalled bookies is what shows in p99.
        waited = random.uniform(0.0, self._interval_s)
        tick = 0.05
        while not self._stop.wait(tick):
            waited += tick
            if waited >= self._interval_s or self._storage.needs_flush():
                waited = 0.0
                try:
                    self.try_checkpoint()
                except Exception:
                    log.exception("checkpoint failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
