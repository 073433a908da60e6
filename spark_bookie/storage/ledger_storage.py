"""LedgerStorage: the bookie's ledger storage (write cache -> entry logs, RocksDB index, read cache).

Modelled on BookKeeper's SingleDirectoryDbLedgerStorage. Adds land in an in-memory write cache
(durability is the journal's job); `flush()` swaps the cache for an empty one, writes its entries
sorted into blocks of the current entry log, fsyncs the log, then writes locations, dirty ledger
state and per-log accounting to RocksDB in one synced batch, and only then drops the swapped-out
cache. Readers look in the active cache, then the one being flushed, then the index — in that
order, so an entry is always visible somewhere while it moves.

Threads: adds from the event loop, reads from a pool, flush from a sync thread, GC from its own
thread. `_state_lock` guards ledger state and the active cache (held for microseconds);
`_flush_lock` serializes everything that writes the index (flush, ledger deletion, compaction's
relocations, log deletion) so per-log accounting is persisted in the order it was computed.
Reads take no storage-wide lock; a read whose log vanished under it (compacted away) re-looks-up
the index once.

Durability contract for the journal: when `flush()` returns, every add and every ledger-state
change made before it was called is on disk (entry logs fsynced, index synced), so journal
records older than the flush's start may be trimmed. State changes (fence, master key, explicit
LAC) are memory-only until the next flush; the journal covers them in between.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ledger_client.protocol.checks import invariant
from spark_bookie.errors import DiskFullError, NoEntryError, NoLedgerError, StorageIOError
from spark_bookie.storage.block_walk import BlockWalk
from spark_bookie.storage.caches import ReadCache, WriteCache
from spark_bookie.storage.entry_log import (
    DecodedBlock,
    EntryLogger,
    GiveWay,
    Location,
    LogMissingError,
    entry_record_bytes,
)
from spark_bookie.storage.index import IndexBatch, LedgerIndex, LedgerState

_ID_MAX = (1 << 63) - 1


log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LogUsage:
    """One entry log as GC sees it: bytes stored per the index's accounting, and how many are live."""

    log_id: int
    live_bytes: int
    total_bytes: int
    file_bytes: int

    @property
    def live_ratio(self) -> float:
        """Live bytes over what the log holds, its file where that is larger: a crash in the middle
        of a flush leaves blocks no index entry points at (the journal replays them into a new
        log) that would otherwise hold their space for ever. An uncompressed log's file exceeds
        its accounting only by block headers; a compressed one's is smaller."""
        total = max(self.total_bytes, self.file_bytes)
        return self.live_bytes / total if total else 0.0


class LedgerStorage:
    """Entries and ledger state of one ledger directory. See the module docstring for the design."""

    def __init__(
        self,
        ledger_dir: str | Path,
        *,
        write_cache_bytes_max: int = 64 << 20,
        read_cache_bytes_max: int = 32 << 20,
        entry_log_size_bytes_max: int = 512 << 20,
        entry_log_block_bytes: int = 64 << 10,
        compression: str = "none",
        index_reserve_bytes: int = 0,
    ) -> None:
        """``index_reserve_bytes``: a flush that would leave less than this free on the ledger
        disk is refused (DiskFullError): the index must always be able to flush, compact and be
        opened again after a crash (BookKeeper's minUsableSizeForIndexFileCreation)."""
        if write_cache_bytes_max <= 0:
            raise ValueError("write_cache_bytes_max must be positive")
        self.ledger_dir = Path(ledger_dir)
        self.current_dir = self.ledger_dir / "current"
        self.write_cache_bytes_max = write_cache_bytes_max
        self.index_reserve_bytes = index_reserve_bytes
        self.flushed_bytes_total = 0  # entry-log bytes written by flushes (the disk monitor's count)
        self.flushes_total = 0  # flushes that wrote something (the bookie's metrics)
        self._index = LedgerIndex(self.current_dir / "index")
        self._log = EntryLogger(
            self.current_dir,
            log_size_bytes_max=entry_log_size_bytes_max,
            block_bytes=entry_log_block_bytes,
            compression=compression,
            allocate_log_id=self._allocate_log_id,
        )
        self._read_cache = ReadCache(read_cache_bytes_max)
        self._state_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._log_id_lock = threading.Lock()
        self._states: dict[int, LedgerState] = {}
        self._dirty: set[int] = set()  # ledgers whose state changed since the last flush
        self._active = WriteCache()
        self._flushing: WriteCache | None = None
        self._log_meta: dict[int, dict[int, int]] = {}  # log id -> ledger id -> bytes; under _flush_lock
        self._next_log_id = 0
        self._open = False

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        if self._open:
            return
        try:
            self.current_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageIOError(f"cannot create {self.current_dir}: {exc}") from exc
        self._index.open()
        self._states = self._index.load_ledger_states()
        self._log_meta = self._index.load_log_meta()
        on_disk = self._log.log_ids()
        self._next_log_id = max(self._index.last_log_id(), on_disk[-1] if on_disk else -1) + 1
        self._open = True

    def close(self) -> None:
        """Flush, then close logs and index. Safe to call twice."""
        if not self._open:
            return
        try:
            self.flush()
        except DiskFullError as exc:  # the journal keeps what the write cache held
            log.warning("closing without a last flush: %s", exc)
        finally:
            self._open = False
            try:
                self._log.close()
            finally:
                self._index.close()
                self._read_cache.clear()

    def __enter__(self) -> LedgerStorage:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _allocate_log_id(self) -> int:
        """Called by the entry logger when it starts a log; persisted so ids are never reused."""
        with self._log_id_lock:
            log_id = self._next_log_id
            self._next_log_id += 1
        invariant(log_id < 1 << 32, "entry log ids exhausted")
        batch = IndexBatch()
        batch.put_last_log_id(log_id)
        self._index.write(batch)
        return log_id

    def _require_open(self) -> None:
        if not self._open:
            raise StorageIOError(f"ledger storage {self.ledger_dir} is not open")

    # ------------------------------------------------------------------ ledger state
    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._states

    def ledger_ids(self) -> list[int]:
        with self._state_lock:
            return sorted(self._states)

    def set_master_key(self, ledger_id: int, key: bytes) -> None:
        """Creates the ledger if it is new; an existing key is replaced (the bookie checks it first)."""
        _check_id(ledger_id, "ledger")
        with self._state_lock:
            st = self._states.get(ledger_id)
            if st is None:
                # A new ledger has nothing indexed (deletion removes a ledger's locations).
                self._states[ledger_id] = LedgerState(master_key=bytes(key), last_entry=-1)
                self._dirty.add(ledger_id)
            elif st.master_key != key:
                st.master_key = bytes(key)
                self._dirty.add(ledger_id)

    def master_key(self, ledger_id: int) -> bytes | None:
        st = self._states.get(ledger_id)
        return None if st is None else st.master_key

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence; True if the ledger was not fenced before. NoLedgerError if unknown."""
        with self._state_lock:
            st = self._state(ledger_id)
            if st.fenced:
                return False
            st.fenced = True
            self._dirty.add(ledger_id)
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        st = self._states.get(ledger_id)
        return st is not None and st.fenced

    def set_explicit_lac(self, ledger_id: int, lac: int, body: bytes) -> None:
        """Remember the explicit LAC and its body; a smaller LAC than the one held is ignored."""
        with self._state_lock:
            st = self._state(ledger_id)
            if st.lac is None or lac > st.lac:
                st.lac, st.lac_body = lac, bytes(body)
                self._dirty.add(ledger_id)

    def explicit_lac(self, ledger_id: int) -> tuple[int, bytes] | None:
        st = self._states.get(ledger_id)
        if st is None or st.lac is None:
            return None
        return st.lac, st.lac_body

    def _state(self, ledger_id: int) -> LedgerState:
        st = self._states.get(ledger_id)
        if st is None:
            raise NoLedgerError(f"ledger {ledger_id} does not exist on this bookie")
        return st

    # ------------------------------------------------------------------ entries: write
    def add_entry(self, ledger_id: int, entry_id: int, body: bytes) -> None:
        """Into the write cache (idempotent on replay). The ledger must exist (set_master_key).

        When the cache is past its budget the caller flushes inline: back-pressure instead of
        unbounded memory (a sync thread flushing at `needs_flush()` keeps this rare).
        """
        self.add_entries(ledger_id, [(entry_id, body)])

    def add_entries(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        """add_entry for many entries of one ledger under one lock (the bookie's batched add path)."""
        for entry_id, _body in entries:
            _check_id(entry_id, "entry")
        with self._state_lock:
            st = self._states.get(ledger_id)
            if st is None:
                raise NoLedgerError(f"ledger {ledger_id} does not exist on this bookie")
            if st.last_entry is None:
                st.last_entry = self._index.last_entry_id(ledger_id)
            cache = self._active
            put = cache.put
            top = st.last_entry
            for entry_id, body in entries:
                put(ledger_id, entry_id, body)
                if entry_id > top:
                    top = entry_id
            st.last_entry = top
            full = cache.size_bytes >= self.write_cache_bytes_max
        if full:
            self.flush()

    def needs_flush(self) -> bool:
        return self._active.size_bytes >= self.write_cache_bytes_max // 2

    def write_cache_bytes(self) -> int:
        return self._active.size_bytes

    def unflushed_bytes(self) -> int:
        """What the write cache holds, including a flush under way."""
        flushing = self._flushing
        return self._active.size_bytes + (flushing.size_bytes if flushing is not None else 0)

    def _check_room(self, nbytes: int) -> None:
        """DiskFullError unless writing ``nbytes`` leaves the index reserve free, and the index is
        writable (one opened read-only on a full disk is reopened once the reserve is free)."""
        if not self.index_reserve_bytes and not self._index.read_only:
            return
        try:
            free = shutil.disk_usage(self.current_dir).free
        except OSError as exc:
            raise StorageIOError(f"cannot stat {self.current_dir}: {exc}") from exc
        # Block headers and the index batch come on top of the entries: a generous margin.
        need = nbytes + nbytes // 32 + (1 << 20)
        if free - need < self.index_reserve_bytes:
            raise DiskFullError(f"flushing {nbytes} bytes would leave {free - need} of {free} free bytes on "
                                f"{self.current_dir}, below the index reserve of {self.index_reserve_bytes}")
        if self._index.read_only:
            self._index.reopen_writable()

    def flush(self) -> None:
        """Write cache -> entry log (fsync) -> index (synced batch). Thread-safe w.r.t. adds and reads."""
        with self._flush_lock:
            self._require_open()
            with self._state_lock:
                cache = self._active
                if cache or self._index.read_only:
                    self._check_room(cache.size_bytes)  # before anything moves: refused, nothing changes
                dirty = {lid: self._states[lid].encode() for lid in self._dirty if lid in self._states}
                self._dirty = set()
                if not cache and not dirty:
                    return
                self._flushing = cache  # readers see it here before it leaves _active
                self._active = WriteCache()
            # A flush the cache's size forced must keep up with the adds: the log's pacing for the
            # journals' sake (entry_log.WRITEBACK_PAUSE_S) would cap how fast the bookie can take them.
            paced = cache.size_bytes < self.write_cache_bytes_max // 2
            try:
                self._write_out(cache, dirty, paced)
                self.flushed_bytes_total += cache.size_bytes
                self.flushes_total += 1
            except BaseException:
                self._restore(cache, dirty)
                raise
            finally:
                self._flushing = None

    def _write_out(self, cache: WriteCache, dirty: dict[int, bytes], paced: bool) -> None:
        entries = cache.sorted_entries()
        spans, _written = self._log.append_spans(entries, paced=paced)
        self._log.sync()
        batch = IndexBatch()
        added: dict[tuple[int, int], int] = {}
        start = 0
        give_way = GiveWay()  # background work: see entry_log.BACKGROUND_SLICE_BYTES
        for log_id, offset, count in spans:
            block = entries[start:start + count]
            start += count
            batch.put_block(log_id, offset, block)
            for lid, n in _record_bytes_by_ledger(block):
                added[(log_id, lid)] = added.get((log_id, lid), 0) + n
                give_way.done(n)
        invariant(start == len(entries), f"entry log placed {start} of {len(entries)} entries")
        for lid, record in dirty.items():
            batch.put_state(lid, record)
        self._account(batch, added)
        self._index.write(batch)

    def _account(self, batch: IndexBatch, added: dict[tuple[int, int], int]) -> None:
        """Add bytes to the per-log accounting and put the touched logs' records in the batch."""
        touched: set[int] = set()
        for (log_id, lid), n in added.items():
            meta = self._log_meta.setdefault(log_id, {})
            meta[lid] = meta.get(lid, 0) + n
            touched.add(log_id)
        for log_id in touched:
            batch.put_log_meta(log_id, self._log_meta[log_id])

    def _restore(self, cache: WriteCache, dirty: dict[int, bytes]) -> None:
        """A failed flush puts its entries back so nothing added is lost from memory."""
        with self._state_lock:
            for lid, per in cache.entries.items():
                if lid in self._states:
                    for eid, body in per.items():
                        self._active.put(lid, eid, body)
            self._dirty.update(lid for lid in dirty if lid in self._states)

    def delete_ledger(self, ledger_id: int) -> None:
        """Drop the ledger's state, index entries and cached entries (log space is GC's job)."""
        with self._flush_lock:
            self._require_open()
            with self._state_lock:
                self._states.pop(ledger_id, None)
                self._active.drop_ledger(ledger_id)
                self._dirty.discard(ledger_id)
            batch = IndexBatch()
            batch.delete_state(ledger_id)
            batch.delete_entries(ledger_id)
            self._index.write(batch)

    # ------------------------------------------------------------------ entries: read
    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored (cache or disk), -1 if none. NoLedgerError if unknown."""
        st = self._state(ledger_id)
        last = st.last_entry
        if last is not None:
            return last
        with self._state_lock:
            if st.last_entry is None:
                st.last_entry = self._index.last_entry_id(ledger_id)
            return st.last_entry

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """One entry; entry_id -1 = the highest stored. NoLedgerError / NoEntryError."""
        self._state(ledger_id)
        if entry_id == -1:
            entry_id = self.last_entry_id(ledger_id)
        if entry_id < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id}")
        body = self._cached(ledger_id, entry_id)
        if body is None:
            found = self._disk_lookup(ledger_id, entry_id)
            if found is None:
                raise NoEntryError(f"ledger {ledger_id} has no entry {entry_id}")
            block, slot = found
            body = block.bodies[slot]
        return body

    def get_cached_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes] | None:
        """get_range's answer if every entry of it is still in the write caches (no disk, no
        waiting: fit for the event loop), else None. A tail's entries are that fresh."""
        out: list[bytes] = []
        total = 0
        for eid in range(first, last + 1):
            body = self._cached(ledger_id, eid)
            if body is None:
                return None   # some of it is on disk: the executor reads it all
            if out and total + len(body) > max_bytes:
                break
            out.append(body)
            total += len(body)
        return out or None

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]:
        """Consecutive entries from `first`, stopping at `last`, a gap, or `max_bytes` (the first
        entry is returned even if larger). NoEntryError if `first` itself is missing."""
        self._state(ledger_id)
        out: list[bytes] = []
        if first > last:
            return out
        if first < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entry {first}")
        walk = BlockWalk(ledger_id, self._cached, self._disk_lookup)
        total = 0
        for eid in range(first, last + 1):
            body = walk.body(eid)
            if body is None or (out and total + len(body) > max_bytes):
                break
            out.append(body)
            total += len(body)
        if not out:
            raise NoEntryError(f"ledger {ledger_id} has no entry {first}")
        return out

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int],
                    max_bytes: int) -> tuple[list[int], list[bytes]]:
        """The listed entries (ascending ids) this bookie holds, as (ids, bodies): missing ones are
        skipped, and the answer stops before `max_bytes` would be passed (the first entry found is
        returned even if larger). NoEntryError if none of them is held."""
        self._state(ledger_id)
        walk = BlockWalk(ledger_id, self._cached, self._disk_lookup)
        ids: list[int] = []
        out: list[bytes] = []
        total = 0
        for eid in entry_ids:
            body = walk.body(eid) if eid >= 0 else None
            if body is None:
                continue
            if out and total + len(body) > max_bytes:
                break
            ids.append(eid)
            out.append(body)
            total += len(body)
        if not out:
            raise NoEntryError(f"ledger {ledger_id} has none of the {len(entry_ids)} entries asked for")
        return ids, out

    def held_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[int]:
        """Which of ``entry_ids`` this bookie holds, by the write caches and the index (no entry is
        read: a repair asks this of a fragment's every entry). Caches first, as _cached reads them."""
        self._state(ledger_id)
        located = self._index.get_location
        return [e for e in entry_ids if self._cached(ledger_id, e) is not None or located(ledger_id, e) is not None]

    def _cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Active cache, then the cache being flushed (order matters: see the module docstring)."""
        per = self._active.entries.get(ledger_id)
        if per is not None:
            body = per.get(entry_id)
            if body is not None:
                return body
        flushing = self._flushing
        if flushing is not None:
            return flushing.get(ledger_id, entry_id)
        return None

    def _disk_lookup(self, ledger_id: int, entry_id: int) -> tuple[DecodedBlock, int] | None:
        """Index -> block; if the log was compacted away between the lookup and the read, retry once."""
        for attempt in range(2):
            loc = self._index.get_location(ledger_id, entry_id)
            if loc is None:
                return None
            try:
                block = self._block(loc)
            except LogMissingError:
                if attempt:
                    raise
                continue
            invariant(
                loc.slot < len(block)
                and block.ledger_ids[loc.slot] == ledger_id
                and block.entry_ids[loc.slot] == entry_id,
                f"index says ({ledger_id}, {entry_id}) is at {loc} but the block there holds something else",
            )
            return block, loc.slot
        return None

    def _block(self, loc: Location) -> DecodedBlock:
        block = self._read_cache.get(loc.log_id, loc.offset)
        if block is None:
            block = self._log.read_block(loc.log_id, loc.offset)
            self._read_cache.put(loc.log_id, loc.offset, block)
        return block

    def entry_location(self, ledger_id: int, entry_id: int) -> Location | None:
        """The indexed location of an entry (flushed entries only)."""
        return self._index.get_location(ledger_id, entry_id)

    # ------------------------------------------------------------------ GC support
    @property
    def entry_logger(self) -> EntryLogger:
        return self._log

    def entry_log_ids(self) -> list[int]:
        return self._log.log_ids()

    def disk_usage_bytes(self) -> int:
        """Entry logs plus the RocksDB index: what this ledger directory occupies."""
        return self._log.total_bytes() + self._index.size_bytes()

    def gc_log_usage(self) -> list[LogUsage]:
        """Live/total bytes of every entry log GC may touch (all but the one being written).

        Taken under the flush lock, so every listed log is complete and fully accounted; a log
        with no accounting at all is an orphan of a crash between log fsync and index write.
        """
        with self._flush_lock:
            self._require_open()
            current = self._log.current_log_id
            with self._state_lock:
                existing = set(self._states)
            out = []
            for log_id in self._log.log_ids():
                if current is not None and log_id >= current:
                    continue
                meta = self._log_meta.get(log_id, {})
                live = sum(n for lid, n in meta.items() if lid in existing)
                out.append(LogUsage(log_id, live, sum(meta.values()), self._log.log_size(log_id)))
            return out

    def relocate(self, moves: Iterable[tuple[int, int, Location, bytes]]) -> tuple[int, int]:
        """Compaction: rewrite entries into the current log; (entries moved, bytes written).

        The index is switched only where it still points at the old location and the ledger
        still exists, under the flush lock so no flush or deletion interleaves.
        """
        moves = list(moves)
        if not moves:
            return 0, 0
        self._require_open()
        new_locs, written = self._log.append([(lid, eid, body) for lid, eid, _old, body in moves])
        self._log.sync()
        moved = 0
        with self._flush_lock:
            batch = IndexBatch()
            added: dict[tuple[int, int], int] = {}
            for (lid, eid, old, body), new in zip(moves, new_locs, strict=True):
                if lid not in self._states or self._index.get_location(lid, eid) != old:
                    continue
                batch.put_location(lid, eid, new)
                key = (new.log_id, lid)
                added[key] = added.get(key, 0) + entry_record_bytes(len(body))
                moved += 1
            self._account(batch, added)
            self._index.write(batch)
        return moved, written

    def drop_entry_log(self, log_id: int) -> int:
        """Delete an entry log GC found dead or has compacted; returns the file bytes freed."""
        with self._flush_lock:
            self._require_open()
            invariant(log_id != self._log.current_log_id, f"entry log {log_id} is being written")
            self._log_meta.pop(log_id, None)
            batch = IndexBatch()
            batch.delete_log_meta(log_id)
            self._index.write(batch)
        freed = self._log.delete_log(log_id)
        self._read_cache.drop_log(log_id)
        return freed

    def cache_stats(self) -> dict[str, int]:
        rc = self._read_cache
        return {
            "write_cache_bytes": self._active.size_bytes,
            "read_cache_bytes": rc.size_bytes,
            "read_cache_blocks": len(rc),
            "read_cache_hits": rc.hits,
            "read_cache_misses": rc.misses,
        }


def _check_id(value: int, what: str) -> None:
    if not 0 <= value <= _ID_MAX:
        raise ValueError(f"{what} id {value} is out of range 0..2^63-1")


def _record_bytes_by_ledger(block: Sequence[tuple[int, int, bytes]]) -> list[tuple[int, int]]:
    """entry_record_bytes summed per ledger over a block sorted by ledger (usually one ledger)."""
    if block[0][0] == block[-1][0]:
        return [(block[0][0], entry_record_bytes(0) * len(block) + sum(len(b) for _l, _e, b in block))]
    sums: dict[int, int] = {}
    for lid, _eid, body in block:
        sums[lid] = sums.get(lid, 0) + entry_record_bytes(len(body))
    return list(sums.items())
