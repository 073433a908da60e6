"""Garbage collection and compaction of entry logs (BookKeeper's GarbageCollectorThread).

A round: (1) delete local ledgers that no longer exist in the metadata store, (2) for every
entry log except the one being written, compute its live fraction from the per-log accounting
(bytes stored per ledger, kept in the index at each flush) — a log with nothing live is deleted,
a log below the threshold is compacted: its still-live entries (those whose index location
still points into it) are rewritten into the current log, the index is switched and synced,
and the old file is deleted.

The local ledger list is snapshotted BEFORE asking the metadata store: a ledger created after
the metadata was asked cannot be in the local snapshot, so it is never taken for a deleted one.
If the metadata store cannot be reached (the question returns None or raises), no ledger is
deleted this round; compaction, which depends only on local state, still runs.

The question is `missing_ledgers(local)`: which of the ledgers this bookie holds the store
answered, completely, do not exist (a tombstone counts as not existing). A bookie asks about its
own ledgers rather than listing every ledger of the cluster, so a round costs in proportion to
what it holds, and with the bookie's memory of the last round (metadata.ledgers.LedgerPresence)
in proportion to what changed; nothing of the ledgers it does not hold is kept in memory. Only
ledgers of the local snapshot are deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from spark_bookie.errors import StorageIOError
from spark_bookie.storage.entry_log import Location
from spark_bookie.storage.ledger_storage import LedgerStorage, LogUsage

log = logging.getLogger(__name__)

_RELOCATE_CHUNK_BYTES = 8 << 20  # rewrite and re-index in chunks: bounded memory and lock hold


@dataclass
class GcStats:
    ledgers_deleted: int = 0
    logs_deleted: int = 0
    logs_compacted: int = 0
    bytes_reclaimed: int = 0
    logs_failed: int = 0  # compactions abandoned (unreadable block); the file is kept

    def __iadd__(self, other: GcStats) -> GcStats:
        self.ledgers_deleted += other.ledgers_deleted
        self.logs_deleted += other.logs_deleted
        self.logs_compacted += other.logs_compacted
        self.bytes_reclaimed += other.bytes_reclaimed
        self.logs_failed += other.logs_failed
        return self


class GarbageCollector:
    """Runs GC rounds over one LedgerStorage; call run_once() from a dedicated thread."""

    def __init__(
        self,
        storage: LedgerStorage,
        missing_ledgers: Callable[[set[int]], set[int] | None],
        *,
        compaction_ratio_threshold: float,
    ) -> None:
        if not 0.0 <= compaction_ratio_threshold <= 1.0:
            raise ValueError("compaction_ratio_threshold must be in [0, 1]")
        self.storage = storage
        self.missing_ledgers = missing_ledgers
        self.threshold = compaction_ratio_threshold
        self.totals = GcStats()
        # Logs whose compaction found an unreadable block: not scanned again by this process (each
        # try reads the whole log and fails the same way); still deleted once nothing is live.
        self.abandoned: set[int] = set()

    def run_once(self) -> GcStats:
        stats = GcStats()
        local = set(self.storage.ledger_ids())  # FIRST: see the module docstring
        missing = self._fetch_missing(local)
        if missing is not None:
            for ledger_id in sorted(missing & local):
                self.storage.delete_ledger(ledger_id)
                stats.ledgers_deleted += 1
        for usage in self.storage.gc_log_usage():
            self._collect_log(usage, stats)
        self.totals += stats
        if stats.ledgers_deleted or stats.logs_deleted or stats.logs_compacted:
            log.debug("gc round: %s", stats)
        return stats

    def _fetch_missing(self, local: set[int]) -> set[int] | None:
        try:
            missing = self.missing_ledgers(set(local))
        except Exception:
            log.warning("metadata store unreachable; no ledger deleted this GC round", exc_info=True)
            return None
        if missing is None:
            log.info("metadata store unreachable; no ledger deleted this GC round")
        return missing

    def _collect_log(self, usage: LogUsage, stats: GcStats) -> None:
        if usage.live_bytes == 0:
            stats.bytes_reclaimed += self.storage.drop_entry_log(usage.log_id)
            stats.logs_deleted += 1
            self.abandoned.discard(usage.log_id)
        elif usage.live_ratio < self.threshold and usage.log_id not in self.abandoned:
            try:
                stats.bytes_reclaimed += compact_log(self.storage, usage.log_id)
                stats.logs_compacted += 1
            except StorageIOError:
                log.exception("compaction of entry log %d abandoned; the file is kept (not tried again until "
                              "the bookie restarts)", usage.log_id)
                stats.logs_failed += 1
                self.abandoned.add(usage.log_id)


def compact_log(storage: LedgerStorage, log_id: int) -> int:
    """Move the live entries of `log_id` into the current log, then delete it; net bytes freed.

    Raises CorruptDataError (keeping the file) if a block cannot be read: compaction never
    drops an entry it could not copy.
    """
    existing = set(storage.ledger_ids())
    moves: list[tuple[int, int, Location, bytes]] = []
    pending = 0
    written = 0
    for offset, block in storage.entry_logger.scan(log_id):
        triples = zip(block.ledger_ids, block.entry_ids, block.bodies, strict=True)
        for slot, (lid, eid, body) in enumerate(triples):
            if lid not in existing:
                continue
            loc = Location(log_id, offset, slot)
            if storage.entry_location(lid, eid) != loc:
                continue  # a newer copy is indexed elsewhere
            moves.append((lid, eid, loc, body))
            pending += len(body)
        if pending >= _RELOCATE_CHUNK_BYTES:
            written += storage.relocate(moves)[1]
            moves, pending = [], 0
    written += storage.relocate(moves)[1]
    return storage.drop_entry_log(log_id) - written
