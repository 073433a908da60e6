"""The replication worker (BookKeeper's ReplicationWorker): takes under-replicated ledgers off the
queue and gives their fragments new bookies.

One ledger at a time per thread, ``worker_ledgers_in_flight_max`` threads:
1. acquire a ledger (an ephemeral lock: a dead worker's ledgers go back to the queue by themselves);
2. a deleted ledger is simply dropped from the queue;
3. every finished fragment that names a missing bookie is copied to a new bookie (chosen by the
   placement policy among writable bookies) and then, by CAS through ``metadata.update_ledger``,
   the new bookie takes the old one's place in that fragment; a racing writer's ensemble change
   and this CAS both re-read and re-apply, so neither overwrites the other;
4. the last fragment of a ledger that is not closed belongs to its writer: the worker waits
   ``open_ledger_rereplication_grace_ms`` (holding the lock, re-checking: the writer may replace
   the bookie itself), then opens the ledger with recovery (fence + close; the old writer can no
   longer add) and repairs the now finished fragment — unless no bookie could take the missing
   one's place: fencing would then stop the writer and repair nothing (it writes on without the
   bookie, BookKeeper's delayed ensemble change), so the ledger is left to its writer (done if the
   bookie is writable again: the writer takes it back and marks the ledger for what it missed;
   retried later if not);
5. with no bookie to take its place, a finished fragment whose missing bookie is writable again
   (back with its id and its disk) is filled in place: the entries of its share it lacks (a
   writer wrote on without it; asked by listed reads of ids only, so a gap in the middle counts)
   are copied back to it from the others; the metadata does not change;
6. done: ``mark_replicated`` (a CAS on the queue node: if more bookies were marked missing
   meanwhile the ledger stays queued). A failure releases the lock and backs off exponentially
   per ledger, so one broken ledger cannot starve the others.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ledger_client import LedgerClient, errors
from ledger_client.placement import PlacementGroups
from ledger_client.protocol.framing import Digester
from ledger_client.recovery import LedgerRecovery
from metadata import DigestType, LedgerMetadata, MetadataError, MetadataStore, NoNodeError, update_ledger

from .checker import FragmentChecker
from .config import AutoRecoveryConfig
from .copier import FragmentCopier
from .errors import RecoveryError, ReplicationError
from .groups import LedgerGroups
from .plan import (
    FragmentRepair,
    RepairKind,
    choose_replacements,
    copy_runs,
    move_groups,
    plan_repair,
    replace_in_fragment,
)

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    DONE = "done"      # nothing names a missing bookie any more (or the ledger is gone)
    DEFER = "defer"    # an open ledger in its grace period: keep the lock, look again later
    RETRY = "retry"    # failed this time: release the lock, back off


@dataclass
class WorkerStats:
    ledgers_replicated: int = 0
    ledgers_dropped: int = 0        # deleted while queued
    ledgers_fenced: int = 0         # open ledgers recovery-opened after their grace period
    fragments_repaired: int = 0
    fragments_filled: int = 0       # of those, filled in place (the bookie back, no spare)
    entries_copied: int = 0
    bytes_copied: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in vars(self).items() if isinstance(v, int)}


class _Primed:
    """The store, as the CAS loop sees it, except that its first read returns the metadata and
    version we already hold: one ZooKeeper read less per fragment. A lost race re-reads for real."""

    def __init__(self, store: MetadataStore, md: LedgerMetadata, version: int) -> None:
        self._store = store
        self._first: tuple[LedgerMetadata, int] | None = (md, version)

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        first, self._first = self._first, None
        if first is not None and first[0].ledger_id == ledger_id:
            return first
        return self._store.ledgers.read_ledger_metadata(ledger_id)

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        return self._store.ledgers.write_ledger_metadata(md, version)


class ReplicationWorker:
    def __init__(self, store: MetadataStore, client: LedgerClient, config: AutoRecoveryConfig, *,
                 clock: Callable[[], float] = time.monotonic, name: str = "replication-worker") -> None:
        self._store = store
        self._client = client
        self._cfg = config
        self._clock = clock
        self._name = name
        self._copier = FragmentCopier(client.pool, config)
        self._checker = FragmentChecker(client.pool, sample_fraction=0.0, reads_in_flight_max=2,
                                        timeout_s=config.bookie_timeout_ms / 1000)
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._deferred: dict[int, float] = {}       # ledger → when to look again (lock held)
        self._open_since: dict[int, float] = {}     # ledger → when its open last fragment was first seen
        self._backoff: dict[int, tuple[int, float]] = {}   # ledger → (failures, not before)
        self._busy: set[int] = set()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for i in range(self._cfg.worker_ledgers_in_flight_max):
            t = threading.Thread(target=self._loop, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking ledgers, let the current ones end, release every lock we hold. Idempotent."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self._threads.clear()
        with self._mutex:
            held = list(self._deferred) + list(self._busy)
            self._deferred.clear()
        for lid in held:
            self._release(lid)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            lid = self._due_deferred()
            if lid is None:
                try:
                    lid = self._store.underreplication.acquire_underreplicated(self._cfg.acquire_poll_ms,
                                                                               exclude=self._excluded())
                except MetadataError as e:
                    log.warning("%s: cannot take a ledger off the queue: %s", self._name, e)
                    self._stop.wait(self._cfg.worker_backoff_ms / 1000)
                    continue
                if lid is None:
                    continue
            with self._mutex:
                self._busy.add(lid)
            try:
                self._handle(lid)
            finally:
                with self._mutex:
                    self._busy.discard(lid)

    def _due_deferred(self) -> int | None:
        now = self._clock()
        with self._mutex:
            for lid, at in self._deferred.items():
                if at <= now:
                    del self._deferred[lid]
                    return lid
        return None

    def _excluded(self) -> list[int]:
        """Ledgers acquire must skip: those backing off after a failure, and deferred open ones
        (their locks are ours already)."""
        now = self._clock()
        with self._mutex:
            return [k for k, (_n, until) in self._backoff.items() if until > now] + list(self._deferred)

    def _handle(self, lid: int) -> None:
        if self._stop.is_set():
            self._release(lid)
            return
        try:
            outcome, again_at = self.replicate(lid)
        except (RecoveryError, errors.LedgerError, MetadataError) as e:
            log.warning("%s: ledger %d not re-replicated this time: %s", self._name, lid, e)
            outcome, again_at = Outcome.RETRY, 0.0
        except Exception:
            log.exception("%s: ledger %d: unexpected failure", self._name, lid)
            outcome, again_at = Outcome.RETRY, 0.0
        if outcome is Outcome.DEFER:
            with self._mutex:
                self._deferred[lid] = again_at
            return
        if outcome is Outcome.DONE:
            with self._mutex:
                self._backoff.pop(lid, None)
                self._open_since.pop(lid, None)
            try:
                if self._store.underreplication.mark_replicated(lid):
                    self.stats.add(ledgers_replicated=1)
                else:
                    log.info("%s: ledger %d was marked again while being repaired; it stays queued",
                             self._name, lid)
            except MetadataError as e:
                log.warning("%s: ledger %d repaired but not unmarked: %s", self._name, lid, e)
                self._release(lid)
            return
        self.stats.add(failures=1)
        with self._mutex:
            n = self._backoff.get(lid, (0, 0.0))[0] + 1
            wait_ms = min(self._cfg.worker_backoff_max_ms, self._cfg.worker_backoff_ms * 2 ** (n - 1))
            self._backoff[lid] = (n, self._clock() + wait_ms * random.uniform(0.8, 1.2) / 1000)
        self._release(lid)

    def _release(self, lid: int) -> None:
        try:
            self._store.underreplication.release_underreplicated(lid)
        except MetadataError as e:
            log.info("%s: releasing ledger %d: %s (its lock goes with our session)", self._name, lid, e)

    # ------------------------------------------------------------------ one ledger

    def replicate(self, lid: int) -> tuple[Outcome, float]:
        """One attempt at the ledger (whose lock we hold): (outcome, when to look again if DEFER)."""
        missing = self._missing(lid)
        if not missing:
            return Outcome.DONE, 0.0
        try:
            md, version = self._store.ledgers.read_ledger_metadata(lid)
        except NoNodeError:
            log.info("%s: ledger %d was deleted; dropping it from the queue", self._name, lid)
            self.stats.add(ledgers_dropped=1)
            return Outcome.DONE, 0.0
        gone, filled = set(missing), set[int]()
        md, version = self._repair_finished(md, version, gone, filled)
        open_last = next((r for r in plan_repair(md, gone) if r.kind is RepairKind.OPEN_LAST), None)
        if open_last is not None:
            if not self._replaceable(md, open_last, gone):
                return self._leave_to_writer(md, open_last), 0.0
            waiting = self._wait_for_writer(md, gone)
            if waiting is not None:
                return Outcome.DEFER, waiting
            try:
                md = self._fence_and_close(md)
                md, version = self._store.ledgers.read_ledger_metadata(lid)
            except (errors.NoSuchLedgerError, NoNodeError):
                self.stats.add(ledgers_dropped=1)
                return Outcome.DONE, 0.0
            md, version = self._repair_finished(md, version, gone, filled)
        # ``md`` is what our last CAS wrote (or read): a writer's later ensemble change is its own
        # and the auditor's periodic audit re-marks the ledger if it names a lost bookie again.
        left = [r for r in plan_repair(md, gone) if r.first_entry_id not in filled]
        return (Outcome.RETRY if left else Outcome.DONE), 0.0

    def _replaceable(self, md: LedgerMetadata, repair: FragmentRepair, gone: Collection[str]) -> bool:
        """Could the placement policy find bookies for the fragment's missing ones now?"""
        try:
            choose_replacements(self._client.placement, repair, self._client.registry.writable(),
                                set(gone) | set(repair.ensemble), LedgerGroups(self._store).of(md))
        except errors.NotEnoughBookiesError:
            return False
        return True

    def _leave_to_writer(self, md: LedgerMetadata, repair: FragmentRepair) -> Outcome:
        """An open ledger's last fragment names missing bookies no spare can replace: its writer
        writes on without them (a delayed ensemble change) and fencing it would repair nothing.
        Done once they are writable again (the writer takes them back, and marks the ledger for
        whatever they missed when it finishes that fragment); else try again later."""
        writable = set(self._client.registry.writable_ids())
        back = set(repair.replaced) <= writable
        log.info("%s: ledger %d is %s and its last fragment names %s; no spare bookie to move it to: %s",
                 self._name, md.ledger_id, md.state.value, sorted(repair.replaced),
                 "they are back, left to its writer" if back else "not fencing its writer, trying later")
        return Outcome.DONE if back else Outcome.RETRY

    def _missing(self, lid: int) -> list[str] | None:
        """The ledger's missing replicas: as recorded when we locked it (no second read; the
        unmark is a CAS on that record's version, so a later mark keeps the ledger queued)."""
        missing = self._store.underreplication.acquired_missing_replicas(lid)
        if missing is not None:
            return missing
        return self._store.underreplication.missing_replicas(lid)

    def _repair_finished(self, md: LedgerMetadata, version: int, gone: Collection[str],
                         filled: set[int]) -> tuple[LedgerMetadata, int]:
        for repair in plan_repair(md, gone):
            if repair.kind is not RepairKind.OPEN_LAST and repair.first_entry_id not in filled:
                md, version = self._repair(md, version, repair, gone, filled)
        return md, version

    def _wait_for_writer(self, md: LedgerMetadata, gone: Collection[str]) -> float | None:
        """While an open ledger's grace period runs: when to look again (None once it is over)."""
        now = self._clock()
        since = self._open_since.setdefault(md.ledger_id, now)
        grace_end = since + self._cfg.open_ledger_rereplication_grace_ms / 1000
        if now >= grace_end:
            return None
        last = md.ensembles[max(md.ensembles)]
        log.info("%s: ledger %d is %s and its last fragment names %s; its writer has %.1fs more",
                 self._name, md.ledger_id, md.state.value, sorted(set(gone) & set(last)), grace_end - now)
        return now + max(0.05, min(self._cfg.worker_backoff_ms / 1000, grace_end - now))

    def _repair(self, md: LedgerMetadata, version: int, repair: FragmentRepair, gone: Collection[str],
                filled: set[int]) -> tuple[LedgerMetadata, int]:
        """Copy one finished fragment (if it has entries) to new bookies and publish it by CAS;
        with no bookie to take their place, fill it in place if its missing bookies are back.
        Replacements keep to the ledger's placement groups; a live bookie the auditor found
        misplaced is moved (:meth:`_choose`), never filled in place: with no bookie of the groups
        to move it to, the ledger stays marked and is retried after a backoff."""
        if self._stop.is_set():
            raise ReplicationError("the worker is stopping")
        registry = self._client.registry
        groups = LedgerGroups(self._store).of(md)
        moving = move_groups(groups, repair, registry.writable())
        try:
            new = self._choose(repair, set(gone) | set(repair.ensemble), groups, moving)
        except errors.NotEnoughBookiesError:
            if moving is not None or not self._fill_in_place(md, repair):
                raise
            filled.add(repair.first_entry_id)
            return md, version
        copied = (0, 0)
        if repair.kind is RepairKind.COPY:
            reachable = set(registry.writable_ids()) | set(registry.readonly_ids())
            runs = copy_runs(md, repair, new, reachable, self._cfg.copy_range_entries_max)
            stats = self._copier.copy(md, runs, cancel=self._stop)
            copied = (stats.entries, stats.bytes)
        replacements = {repair.ensemble[p]: new[p] for p in repair.positions}
        transition = functools.partial(replace_in_fragment, first_entry_id=repair.first_entry_id,
                                       replacements=replacements)
        md, version = update_ledger(_Primed(self._store, md, version), md.ledger_id, transition)
        self.stats.add(fragments_repaired=1, entries_copied=copied[0], bytes_copied=copied[1])
        log.info("%s: ledger %d fragment %d: %s (%d entries copied)", self._name, md.ledger_id,
                 repair.first_entry_id, ", ".join(f"{o} -> {n}" for o, n in replacements.items()), copied[0])
        return md, version

    def _choose(self, repair: FragmentRepair, exclude: set[str], groups: PlacementGroups,
                moving: PlacementGroups | None) -> dict[int, str]:
        """Replacements within ``groups``; a live copy being moved (``moving``: plan.move_groups)
        goes to a better placed bookie when one is free, else (a secondary copy decommissioned, or
        the primary spare taken meanwhile) to any bookie of the groups."""
        placement, writable = self._client.placement, self._client.registry.writable()
        if moving is not None and moving != groups:
            try:
                return choose_replacements(placement, repair, writable, exclude, moving)
            except errors.NotEnoughBookiesError:
                pass
        return choose_replacements(placement, repair, writable, exclude, groups)

    def _fill_in_place(self, md: LedgerMetadata, repair: FragmentRepair) -> bool:
        """The fragment's missing bookies are writable again (back with their ids) and no other
        could take their place: copy back to each the entries of the fragment it lacks (a writer
        wrote on without it), all of its share when it cannot tell which. False when one is not
        writable."""
        registry = self._client.registry
        writable = set(registry.writable_ids())
        if not set(repair.replaced) <= writable:
            return False
        lacking: dict[int, set[int] | None] = {}
        for p in repair.positions if repair.kind is RepairKind.COPY else ():
            missing = self._checker.lacking_entries(md, repair.first_entry_id, repair.last_entry_id, p,
                                                    repair.ensemble[p])
            if missing is None or missing:
                lacking[p] = None if missing is None else set(missing)
        copied = (0, 0)
        if lacking:
            same = {p: repair.ensemble[p] for p in lacking}
            reachable = (writable | set(registry.readonly_ids())) - set(same.values())
            only = {p: ids for p, ids in lacking.items() if ids is not None}
            runs = copy_runs(md, dataclasses.replace(repair, positions=tuple(lacking)), same, reachable,
                             self._cfg.copy_range_entries_max, only)
            stats = self._copier.copy(md, runs, cancel=self._stop)
            copied = (stats.entries, stats.bytes)
        self.stats.add(fragments_repaired=1, fragments_filled=1, entries_copied=copied[0], bytes_copied=copied[1])
        log.info("%s: ledger %d fragment %d: no spare bookie for %s, which %s back: %s", self._name, md.ledger_id,
                 repair.first_entry_id, sorted(repair.replaced), "is" if len(repair.replaced) == 1 else "are",
                 f"{copied[0]} entries copied back in place" if lacking else "it holds its entries")
        return True

    def _fence_and_close(self, md: LedgerMetadata) -> LedgerMetadata:
        """Recovery-open the ledger (fence its bookies, find its end, close it): its writer had its
        grace period. The digest of a rewritten entry is recomputed, which needs the password for
        HMAC ledgers; the metadata keeps only its hash, so HMAC ledgers wait for their writer or a
        reader with the password to close them."""
        if md.digest_type is DigestType.HMAC:
            raise ReplicationError(f"ledger {md.ledger_id} is open with an HMAC digest: closing it needs its "
                                   "password; it is repaired once its writer or a reader closes it")
        log.info("%s: ledger %d: grace period over; fencing and closing it", self._name, md.ledger_id)
        closed = LedgerRecovery(self._client, md, Digester(md.digest_type, b""), md.password_hash).run()
        self.stats.add(ledgers_fenced=1)
        return closed
