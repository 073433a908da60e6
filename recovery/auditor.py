"""The auditor (BookKeeper's Auditor): one per cluster, elected through ZooKeeper.

While elected it
- watches ``available`` (writable and read-only registrations; read-only bookies are not lost)
  and the lost-bookie delay stored in ZooKeeper (changeable at run time);
- keeps the bookie → ledgers index, rebuilt from every ledger's metadata at each audit (a lost
  bookie's indexed ledgers are marked before the new scan reads anything);
- when a bookie is gone for longer than the delay (at once when a second one is gone too: see
  :mod:`recovery.tracker`), marks every ledger naming it under-replicated with that bookie missing;
- every ``audit_interval_ms`` audits again (ledgers that still name an audited lost bookie are
  marked again: e.g. created by a writer that had not noticed it go);
- every ``check_all_ledgers_interval_ms`` reads sampled entries of every finished fragment from
  each of its available bookies (:mod:`recovery.checker`) and marks bookies that lost entries;
- every ``replicas_check_interval_ms`` asks each bookie of every finished fragment which entries
  of its share it holds (:mod:`recovery.replicas_check`: ids only, every entry) and marks bookies
  that lack any;
- every ``placement_check_interval_ms`` counts fragments that break the rack placement policy
  (logged and kept in :attr:`Auditor.stats`; moving them is left to an operator, as BookKeeper's
  default), and closed ledgers whose copies break their placement groups (DESIGN §4.10: the
  namespace's current groups, else the ledger's recorded ones), which it counts
  (``ledgers_not_adhering``) and marks under-replicated with the misplaced bookies as missing, so
  that replication workers move those copies into the groups.
Nothing is marked while re-replication is disabled; the audit waits for it to be enabled again.
The scans read every ledger's metadata node but decode only those whose version changed
since the last scan (:mod:`recovery.ledger_views`), which is what lets a check of 100,000 ledgers
cost little more than reading their nodes.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger_client.bookies import BookiePool
from metadata import LedgerMetadata, MetadataError, MetadataStore

from .checker import FragmentChecker, ProbeWindow
from .config import AutoRecoveryConfig
from .groups import LedgerGroups
from .ledger_views import LedgerView, LedgerViews, index_of
from .placement_audit import PlacementAudit
from .replicas_check import ListingWindow, ReplicasTally
from .tracker import LostBookieTracker

log = logging.getLogger(__name__)

#: A bookie must have been unavailable this long before it counts as lost even with a delay of 0.
#: A bookie turning read-only registers as read-only before it unregisters as writable, but the
#: two lists are watched and read separately, so one view may catch it in neither.
CONFIRM_LOST_S = 0.25
RETRY_S = 1.0


@dataclass
class AuditorStats:
    audits: int = 0
    ledgers_marked: int = 0
    lost_bookies_audited: list[str] = field(default_factory=list)
    ledger_checks: int = 0
    fragments_missing_entries: int = 0
    placement_checks: int = 0
    placement_violations: int = 0
    ledgers_not_adhering: int = 0     # closed ledgers with copies outside their placement groups, last check
    probes: int = 0                   # entry reads of the full checks
    placement_ledgers_evaluated: int = 0   # ledgers whose placement was evaluated (not reused), all checks
    replicas_checks: int = 0
    replicas: ReplicasTally = field(default_factory=ReplicasTally)   # the last replicas check's findings


def scan_ledgers(store: MetadataStore, batch: int,
                 visit: Callable[[list[LedgerMetadata]], None] | None = None) -> list[LedgerMetadata]:
    """Every ledger's metadata (ledgers deleted during the scan are skipped), read ``batch`` at a
    time with pipelined requests (one round trip per batch: per-request CPU, not bytes, is what a
    scan of thousands of ledgers costs in Python). ``visit`` gets each batch as soon as it is read:
    work on the first ledgers starts while the others are still being read (exceptions from it end
    the scan)."""
    ids = store.ledgers.list_ledgers()
    found: list[LedgerMetadata] = []
    for i in range(0, len(ids), max(1, batch)):
        got = [x[0] for x in store.ledgers.read_ledger_metadata_many(ids[i:i + batch]) if x is not None]
        if visit is not None and got:
            visit(got)
        found.extend(got)
    return found


class Auditor:
    def __init__(self, store: MetadataStore, config: AutoRecoveryConfig, pool: BookiePool, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._cfg = config
        self._clock = clock
        self._checker = FragmentChecker(pool, sample_fraction=config.check_entry_sample_fraction,
                                        reads_in_flight_max=config.copy_reads_in_flight_max,
                                        timeout_s=config.bookie_timeout_ms / 1000)
        self._pool = pool
        self.tracker = LostBookieTracker()
        self.stats = AuditorStats()
        self._cond = threading.Condition()
        self._stop = False
        self._available: set[str] | None = None
        self._bookies_changed = False
        self._delay_s = config.lost_bookie_recovery_delay_s or 0
        self._delay_events: list[int] = []
        self._delay_known = False   # the watch's first report is the current value, not a change
        self._trigger = False
        self._index: dict[str, set[int]] = {}   # bookie → ledgers naming it, as of the last audit's scan
        self._views = LedgerViews(config.scan_cache_ledgers_max)   # every scan's ledgers, decoded once per version
        self._placement = PlacementAudit()
        self._thread: threading.Thread | None = None
        self._cancels: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_guarded, name="auditor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """Stop auditing; joins the thread unless ``timeout_s`` is None (callers on a store thread
        must not wait for an audit that may itself be waiting on the store)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if timeout_s is not None and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def trigger(self) -> None:
        """Audit now, pending bookies included (as a delay reset to its value does)."""
        with self._cond:
            self._trigger = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ events (store threads)

    def _on_bookies(self, writable: list[str], readonly: list[str]) -> None:
        with self._cond:
            self._available = set(writable) | set(readonly)
            self._bookies_changed = True
            self._cond.notify_all()

    def _on_delay(self, seconds: int) -> None:
        with self._cond:
            self._delay_events.append(seconds)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the thread

    def _run_guarded(self) -> None:
        try:
            if not self._setup():
                return
            while not self._stopped():
                try:
                    self._run()
                except Exception:
                    log.exception("auditor: unexpected failure; starting over in %.0fs", RETRY_S)
                    self._sleep(RETRY_S)
        finally:
            for cancel in self._cancels:
                try:
                    cancel()
                except MetadataError:
                    pass
            self._cancels.clear()

    def _setup(self) -> bool:
        """Set the watches; False if stopped before that worked."""
        while not self._stopped():
            try:
                self._cancels.append(self._store.cluster.watch_bookies(self._on_bookies))
                if self._cfg.lost_bookie_recovery_delay_s is None:
                    self._cancels.append(self._store.underreplication.watch_lost_bookie_recovery_delay(self._on_delay))
                return True
            except MetadataError as e:
                log.warning("auditor: cannot watch the cluster yet: %s", e)
                for cancel in self._cancels:
                    cancel()
                self._cancels.clear()
                self._sleep(RETRY_S)
        return False

    def _run(self) -> None:
        now = self._clock()
        next_audit = now                       # the first audit learns which bookies ledgers name
        # the periodic checks: [interval in s (0: off), the check, when it is next due]
        periodic: list[list[Any]] = [
            [interval_ms / 1000, check, now + interval_ms / 1000]
            for interval_ms, check in ((self._cfg.check_all_ledgers_interval_ms, self._check_all),
                                       (self._cfg.replicas_check_interval_ms, self._check_replicas),
                                       (self._cfg.placement_check_interval_ms, self._check_placement))
            if interval_ms]
        while not self._stopped():
            now = self._clock()
            explicit = self._take_events(now)
            due = self.tracker.due(self._delay_s, now) if not explicit else set(self.tracker.pending)
            if not explicit and any(now - self.tracker.pending[b] < CONFIRM_LOST_S for b in due):
                due = set()   # wait until the newest of them is confirmed; audit them together
            if due or explicit or now >= next_audit:
                if due:
                    log.info("auditor: bookies %s unavailable for %.2fs; auditing", sorted(due),
                             max(now - self.tracker.pending[b] for b in due))
                if self._guard(functools.partial(self._audit, due)):
                    next_audit = self._clock() + self._cfg.audit_interval_ms / 1000
                else:
                    next_audit = self._clock() + RETRY_S
            for timer in periodic:
                if now >= timer[2]:
                    self._guard(timer[1])
                    timer[2] = self._clock() + timer[0]
            wake = [next_audit, *(timer[2] for timer in periodic)]
            due_at = self.tracker.next_due_at(self._delay_s)
            if due_at is not None:
                wake.append(max(due_at, max(self.tracker.pending.values()) + CONFIRM_LOST_S))
            self._wait(min(wake) - self._clock())

    def _take_events(self, now: float) -> bool:
        """Apply queued watch events to the tracker; True when an immediate audit was asked for."""
        with self._cond:
            available = self._available if self._bookies_changed else None
            self._bookies_changed = False
            delays, self._delay_events = self._delay_events, []
            explicit, self._trigger = self._trigger, False
        if available is not None:
            self.tracker.observe(available, now)
        for seconds in delays:
            if self._cfg.lost_bookie_recovery_delay_s is not None:
                break
            first, self._delay_known = not self._delay_known, True
            old, self._delay_s = self._delay_s, seconds
            if not first and self.tracker.delay_changed(seconds, old, now):
                log.info("auditor: lost-bookie delay set to %ds (was %ds): auditing now", seconds, old)
                explicit = True
        return explicit

    def _guard(self, action: Callable[[], object]) -> bool:
        try:
            return action() is not False
        except MetadataError as e:
            log.warning("auditor: %s failed: %s; retrying", getattr(action, "__name__", "audit"), e)
            return False

    # ------------------------------------------------------------------ audits

    def _audit(self, due: set[str]) -> bool:
        """Mark the ledgers of ``due`` lost bookies (and of lost bookies audited before whose
        ledgers still name them). False (retry soon) while re-replication is disabled.

        The ledgers the last scan's index says a lost bookie holds are marked first, in pipelined
        batches, before anything is read: workers start at once instead of competing with the scan
        for the marks. The scan then catches what the index did not know (ledgers created or
        changed since), marking as it reads; a stale entry costs a worker one no-op. The index
        built from the same scan then tells the tracker which bookies ledgers name."""
        if not self._store.underreplication.is_replication_enabled():
            log.info("auditor: re-replication is disabled; audit postponed")
            return False
        available = self._current_available()
        due = {b for b in due if b not in available}
        lost = due | (self.tracker.audited - available)
        queued = self._store.underreplication.list_underreplicated() if lost else {}
        t0 = self._clock()
        marked = self._mark_indexed(lost, queued)
        early = len(marked)

        def mark_if_lost(views: list[LedgerView]) -> None:
            marks: dict[int, list[str]] = {}
            for v in views:
                have = set(queued.get(v.ledger_id, ())) | marked.get(v.ledger_id, set())
                missing = sorted(b for b in lost & v.bookies if b not in have)
                if missing:
                    marks[v.ledger_id] = missing   # one mark for every lost bookie
            self._store.underreplication.mark_underreplicated_many(marks)
            for lid, bookies in marks.items():
                marked.setdefault(lid, set()).update(bookies)

        ledgers: list[LedgerView] = []
        for scanned in self._views.scan(self._store, self._cfg.metadata_reads_in_flight_max):
            views = [s[0] for s in scanned]
            if lost:
                mark_if_lost(views)
            ledgers.extend(views)
        self._index = index_of(ledgers)
        self.tracker.observe(available, self._clock(), named=self._index.keys())
        if due:
            log.info("auditor: bookies %s lost; %d ledgers marked under-replicated (%d from the index at once, "
                     "%d ledgers scanned in %.2fs)", sorted(due), len(marked), early, len(ledgers), self._clock() - t0)
            self.stats.lost_bookies_audited.extend(sorted(due))
        self.tracker.mark_audited(due)
        self.tracker.forget([b for b in self.tracker.audited if b not in self._index])
        self.stats.audits += 1
        self.stats.ledgers_marked += len(marked)
        return True

    def _mark_indexed(self, lost: set[str], queued: dict[int, list[str]]) -> dict[int, set[str]]:
        """Mark what the last index says the lost bookies hold; returns ledger → bookies marked."""
        marks: dict[int, set[str]] = {}
        for b in lost:
            for lid in self._index.get(b, ()):
                if b not in queued.get(lid, ()):
                    marks.setdefault(lid, set()).add(b)
        ids = sorted(marks)
        batch = max(1, self._cfg.metadata_reads_in_flight_max)
        for i in range(0, len(ids), batch):
            self._store.underreplication.mark_underreplicated_many({lid: marks[lid] for lid in ids[i:i + batch]})
        return marks

    def _current_available(self) -> set[str]:
        with self._cond:
            if self._available is not None:
                return set(self._available)
        return set(self._store.cluster.list_bookies()) | set(self._store.cluster.list_bookies(readonly=True))

    def _check_all(self) -> None:
        """Periodic check: sampled entries of every finished fragment, from its available bookies.

        Every ledger's probes are read on every check (finding a bookie that lost data it still
        claims is the point), but a ledger's metadata is decoded only when its version changed
        since the last scan (:class:`LedgerViews`: most ledgers are closed and never change, and
        most have no entries, so nothing to read), and the reads of all ledgers share one window
        of ``copy_reads_in_flight_max`` (:class:`recovery.checker.ProbeWindow`) instead of one
        round trip per ledger. Losses are marked after each metadata batch, in one batch."""
        if not self._store.underreplication.is_replication_enabled():
            return
        window = self._checker.window()
        found = self._scan_and_mark(window)
        if found is None:
            return
        self.stats.probes += window.probes
        self.stats.ledger_checks += 1
        self.stats.fragments_missing_entries += found[0]
        self.stats.ledgers_marked += found[1]
        log.info("auditor: checked every ledger (%d entry reads); %d fragments missing entries, %d ledgers marked",
                 window.probes, found[0], found[1])

    def _check_replicas(self) -> None:
        """Periodic replicas check (:mod:`recovery.replicas_check`): every bookie of every finished
        fragment is asked which entries of its share it holds; one lacking any is marked missing
        for that ledger. The same scan and window as :meth:`_check_all`, ids instead of entries."""
        if not self._store.underreplication.is_replication_enabled():
            return
        window = ListingWindow(self._pool, self._cfg.copy_reads_in_flight_max, self._cfg.bookie_timeout_ms / 1000)
        found = self._scan_and_mark(window)
        if found is None:
            return
        t = window.tally
        self.stats.replicas_checks += 1
        self.stats.replicas = t
        self.stats.fragments_missing_entries += found[0]
        self.stats.ledgers_marked += found[1]
        log.info("auditor: replicas check of every ledger (%d listed reads): %d entry copies lacking, %d ledgers "
                 "marked; ledgers with an entry short of Qw %d, of Qa %d, with no copy %d", t.requests,
                 t.entries_lacking, found[1], t.ledgers_below_write_quorum, t.ledgers_below_ack_quorum,
                 t.ledgers_no_replica)

    def _scan_and_mark(self, window: ProbeWindow | ListingWindow) -> list[int] | None:
        """Every ledger with finished fragments through ``window`` (a full check's reads, on the
        available bookies), marking what each metadata batch's answers showed lost, in one batch;
        [fragments lacking entries, (ledger, bookie) marks], or None if the auditor stopped."""
        available = self._current_available()
        found = [0, 0]
        for scanned in self._views.scan(self._store, self._cfg.metadata_reads_in_flight_max):
            if self._stopped():
                return None
            for view, _data, _md in scanned:
                if view.probe_md is not None:
                    window.add(view.probe_md, available)
            self._mark_lost_copies(window.found(), found)
        self._mark_lost_copies(window.drain(), found)
        return found

    def _mark_lost_copies(self, bad: dict[int, dict[str, list[int]]], found: list[int]) -> None:
        """Mark each ledger with the bookies that lack entries of it; counts into ``found``."""
        marks = {lid: sorted(by_bookie) for lid, by_bookie in bad.items() if by_bookie}
        self._store.underreplication.mark_underreplicated_many(marks)
        found[0] += sum(len(keys) for by_bookie in bad.values() for keys in by_bookie.values())
        found[1] += sum(len(b) for b in marks.values())

    def _check_placement(self) -> None:
        """Placement of every ledger. The bookies' registrations are read once per check; a
        ledger is decoded and evaluated again only when its metadata version, the bookies'
        locations/groups/writability or its groups changed since the verdict it has
        (:mod:`recovery.placement_audit`): violations are still counted and logged every check."""
        available = self._current_available()
        info = self._store.cluster.bookie_infos(sorted(available))
        location_of = {b: str(i.get("network_location") or "") for b, i in info.items()}
        group_of = {b: str(i.get("bookie_group") or "") for b, i in info.items()}
        self._placement.begin(location_of, group_of, self._store.cluster.list_bookies(),
                              self._cfg.placement_min_locations_per_write_quorum)
        groups = LedgerGroups(self._store)
        violations = 0
        misplaced: dict[int, set[str]] = {}
        evaluated = self._placement.evaluated
        for scanned in self._views.scan(self._store, self._cfg.metadata_reads_in_flight_max):
            for s in scanned:
                lid, ledger_groups = s[0].ledger_id, groups.for_namespace(s[0].namespace, s[0].recorded)
                verdict = self._placement.verdict(s, ledger_groups)
                for key, why in verdict.violations:
                    log.warning("auditor: ledger %d fragment %d breaks the placement policy: %s", lid, key, why)
                violations += len(verdict.violations)
                if verdict.misplaced:
                    misplaced[lid] = set(verdict.misplaced)
                    log.warning("auditor: ledger %d has copies on %s, outside its placement %s", lid,
                                sorted(verdict.misplaced), ledger_groups.describe())
        self.stats.placement_checks += 1
        self.stats.placement_violations = violations
        self.stats.ledgers_not_adhering = len(misplaced)
        self.stats.placement_ledgers_evaluated += self._placement.evaluated - evaluated
        self._mark_misplaced(misplaced)

    def _mark_misplaced(self, misplaced: dict[int, set[str]]) -> None:
        """Queue the misplaced copies for the workers (not while re-replication is disabled). A
        ledger already marked with them is left as it is: re-marking would only rewrite its node."""
        if not misplaced or not self._store.underreplication.is_replication_enabled():
            return
        queued = self._store.underreplication.list_underreplicated()
        marks = {lid: sorted(b) for lid, b in misplaced.items() if not b <= set(queued.get(lid, ()))}
        self._store.underreplication.mark_underreplicated_many(marks)
        self.stats.ledgers_marked += len(marks)

    # ------------------------------------------------------------------ helpers

    def _stopped(self) -> bool:
        with self._cond:
            return self._stop

    def _wait(self, seconds: float) -> None:
        with self._cond:
            if self._stop or self._bookies_changed or self._delay_events or self._trigger:
                return
            self._cond.wait(max(0.01, min(seconds, 60.0)))

    def _sleep(self, seconds: float) -> None:
        with self._cond:
            if not self._stop:
                self._cond.wait(seconds)
