"""Moving every ledger off one bookie: ``spark-bookie shell recover`` and ``decommission``.

BookKeeper's BookKeeperAdmin.decommissionBookie: trigger an audit of the bookie, wait until no
ledger's metadata names it, then delete its cookie so the id can never come back with its old
identity. The audit is done by the command itself: on every round it marks each ledger naming the
bookie (that is not queued for it yet), so it works at once, whatever the lost-bookie delay, for
a dead bookie and for a live one (the auditor only ever marks lost bookies), and it catches
ledgers placed on the bookie while it waits. The shell runs a replication worker of its own
beside it, so the data moves even where no autorecovery daemon runs. ``recover`` is the same
without the cookie step, for a bookie that is already dead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from metadata import MetadataStore, NoNodeError

from .auditor import scan_ledgers
from .errors import DecommissionError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainProgress:
    bookie: str
    total: int          # ledgers that named the bookie when the command started (or since)
    remaining: int      # ledgers whose metadata still names it
    queued: int         # of those, how many are in the under-replication queue
    elapsed_s: float
    done: bool = False


Progress = Callable[[DrainProgress], None]


def is_registered(store: MetadataStore, bookie_id: str) -> bool:
    return bookie_id in store.cluster.list_bookies() or bookie_id in store.cluster.list_bookies(readonly=True)


def drain_bookie(store: MetadataStore, bookie_id: str, *, timeout_s: float, poll_s: float = 1.0,
                 progress: Progress | None = None, metadata_reads_in_flight_max: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> DrainProgress:
    """Mark every ledger naming ``bookie_id`` and wait until none does; returns the last progress.

    DecommissionError if re-replication is disabled or the deadline passes first.
    """
    if not store.underreplication.is_replication_enabled():
        raise DecommissionError("re-replication is disabled cluster-wide; enable it first "
                                "(spark-bookie shell autorecovery --enable)")
    start = clock()
    total = 0
    while True:
        naming = [md.ledger_id for md in scan_ledgers(store, metadata_reads_in_flight_max)
                  if bookie_id in md.bookies()]
        queued = store.underreplication.list_underreplicated()
        for lid in naming:
            if bookie_id not in queued.get(lid, ()):
                try:
                    store.underreplication.mark_underreplicated(lid, [bookie_id])
                except NoNodeError:
                    continue   # deleted meanwhile
                queued[lid] = [bookie_id]
        total = max(total, len(naming))
        state = DrainProgress(bookie_id, total, len(naming), sum(1 for lid in naming if lid in queued),
                              clock() - start, done=not naming)
        if progress is not None:
            progress(state)
        if not naming:
            return state
        if clock() - start > timeout_s:
            raise DecommissionError(f"{len(naming)} ledgers still name {bookie_id} after {timeout_s:.0f}s "
                                    f"(e.g. {sorted(naming)[:10]}); are replication workers running?")
        if not store.underreplication.is_replication_enabled():
            raise DecommissionError("re-replication was disabled while waiting")
        time.sleep(poll_s)


def delete_cookie(store: MetadataStore, bookie_id: str) -> bool:
    """Delete the bookie's cookie from ZooKeeper; False if it had none."""
    try:
        store.cluster.delete_cookie(bookie_id, -1)
    except NoNodeError:
        return False
    return True
