"""The under-replication queue and auditor election (``store.underreplication``): the cluster side
of re-replication, BookKeeper's ``LedgerUnderreplicationManager`` and ``AuditorElector``.

Everything here is called by ``recovery/`` (auditor, replication worker, shell); nothing here
knows about bookies' data. Layout under ``<root>/underreplication`` (BookKeeper's names):

- ``ledgers/<hierarchical path>/urL<id>``: one node per under-replicated ledger; its data lists
  the missing replicas (bookie ids). Marking again merges bookie ids into the node by CAS. The
  path is BookKeeper's: four buckets of 16 bits of the id as 4 hex digits, then ``urL%010d``
  (ledger 1: ``ledgers/0000/0000/0000/0001/urL0000000001``); emptied buckets are pruned.
- ``locks/urL<id>``: ephemeral, held by the worker replicating that ledger; it vanishes with the
  worker's session, so a dead worker's ledger is picked up by another.
- ``disable``: present while re-replication is disabled (workers stop acquiring).
- ``lostBookieRecoveryDelay``: seconds the auditor waits after a bookie disappears before marking
  its ledgers; changeable at run time (the auditor watches it).
- ``auditorelection/V_<seq>``: ephemeral sequential votes; the lowest is the auditor; the data of
  each vote is the candidate's id.

The queue, the locks, the switches (:mod:`metadata.underreplication.switches`) and the election
(:mod:`metadata.underreplication.election`) are written once, on the node layer
(:mod:`metadata.nodes`), so the twin and ZooKeeper cannot differ in the protocol, only in the
node layer, which the contract suite pins down.

Data formats (small, versioned JSON, UTF-8):

- an under-replicated ledger node: ``{"v": 1, "missing": ["host:port", ...], "ctime_ms": N}``
  (``missing`` sorted, ``ctime_ms`` = when the ledger was first marked; merges keep it);
- a lock node: ``{"v": 1, "host": "...", "pid": N}`` (who holds it, for operators);
- an auditor vote: the candidate id as plain text (BookKeeper keeps the bookie id there too);
- ``lostBookieRecoveryDelay``: the seconds as decimal text, like BookKeeper;
- ``disable``: empty; only its existence matters.

Threads: the election, the delay watch and every callback run on one worker thread per store
(``<store>-underreplication``); watch callbacks only poke a condition or queue work there, so
nothing blocks ZooKeeper's event thread.

Cost per ledger (what bounds re-replication on a busy machine, where each ZooKeeper request costs
~0.2-0.3 ms of client CPU): acquire = one round trip (lock create + node read, pipelined) on top
of the bucket listings cached between child-watch events (:mod:`metadata.underreplication.view`);
mark_replicated = one round trip (CAS delete + leaf-bucket prune + the lock's delete). The
lock holder keeps the node's record (:meth:`UnderReplicationStore.acquired_missing_replicas`), so a
worker needs no second read. The election is :mod:`metadata.underreplication.election`.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from metadata.errors import (
    BadVersionError,
    InvalidMetadataError,
    MetadataError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
)
from metadata.layout import ZkLayout, check_bookie_id, check_ledger_id
from metadata.nodes import Nodes, Op
from metadata.session import SessionEvent, SessionWorker
from metadata.underreplication.election import AuditorElection, ElectionCallback
from metadata.underreplication.paths import CAS_TRIES_MAX, create_path, make_parents
from metadata.underreplication.records import (
    decode_underreplicated,
    encode_lock,
    encode_underreplicated,
)
from metadata.underreplication.switches import ReplicationSwitches
from metadata.underreplication.view import EMPTY_FOR_S, LeafGroup, QueueView

log = logging.getLogger(__name__)

#: A waiting acquire re-scans at least this often even if no watch fired, and no cached listing is
#: used once older than this (belt and braces: a watch lost with a connection is re-armed on
#: reconnection anyway).
RESCAN_S = 5.0
#: ... and never more often than this, however busy the queue (no busy polling).
MIN_SCAN_INTERVAL_S = 0.1
#: A listing outdated by a watch still guides a search for this long before it is fetched again:
#: on a busy queue the buckets and the locks change with every ledger taken or finished, and
#: re-listing them per acquire was the cost this cache removes. Only hints come from it.
REFRESH_S = 0.1
_DRAW_MISSES_MAX = 16  # random draws in a row that hit a taken ledger before a full pass
_DONE_HINTS_MAX = 4096  # completion hints kept before old ones are trimmed

def _raisable(outcome: object) -> BaseException:
    """A pipeline outcome the caller did not expect, as something to raise."""
    if isinstance(outcome, BaseException):
        return outcome
    return MetadataError(f"unexpected ZooKeeper answer {outcome!r}")


# -- per-store state --------------------------------------------------------------------------------
class _Lock(enum.Enum):
    TAKEN_BY_US = "taken by us"
    TAKEN = "someone else's"
    NO_NODE = "no node"  # the ledger's node is not there: finished, or not created yet


@dataclass(frozen=True)
class _HeldLock:
    version: int  # the under-replicated node's version seen when the lock was taken
    session: int | None  # the session owning the lock node
    missing: list[str] | None = None  # the node's missing replicas at that version (None: unreadable)


class UnderReplicationStore:
    """Queue of ledgers missing replicas, their locks, the enable switch, the lost-bookie delay,
    and the auditor election. Same deadline rules as every store: ZooKeeper down means
    MetadataUnavailableError, never a hang. The election, the delay watch and every callback run
    on the store's under-replication thread."""

    def __init__(self, nodes: Nodes, paths: ZkLayout) -> None:
        self._nodes = nodes
        self._paths = paths
        self._worker = SessionWorker(nodes.thread_name("-underreplication"))
        self._mutex = threading.Lock()
        self._held: dict[int, _HeldLock] = {}
        self._claiming: set[int] = set()
        self._done: dict[int, float] = {}  # ledger → when we removed it (hint for listings older than that)
        self._cond = threading.Condition()
        self._generation = 0
        self._view = QueueView(paths.ur_ledgers, paths.ur_locks, self._fetch_listings, max_age_s=RESCAN_S)
        self._election = AuditorElection(nodes, paths, self._worker)
        self._switches = ReplicationSwitches(nodes, paths, self._worker, self._poke)
        nodes.add_session_listener(self._session_event)

    def close(self, *, tell: bool = True) -> None:
        """The session is closing (``tell``: tell the auditor it no longer is) or its process died."""
        with self._mutex:
            self._held.clear()
        self._election.close(tell=tell)
        self._switches.close()
        self._poke()
        self._worker.close()

    def _poke(self, _event: object = None) -> None:
        """Wake every waiting acquire (any thread; never blocks for long)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def _listing_changed(self, path: str | None) -> None:
        """A child watch fired for ``path`` (None: every watch is gone, e.g. with the connection):
        the cached listing is stale; waiting acquires look again. Any thread, never blocks."""
        self._view.invalidate(path)
        self._poke()

    def _on_child_event(self, event: Any) -> None:
        """The node layer's thread: one bound method for every listing, so ZooKeeper keeps one
        watcher per path; a connection-level event (no path) outdates every cached listing."""
        self._listing_changed(getattr(event, "path", None))

    def _session_event(self, event: str) -> None:
        """Session thread. LOST: our locks and votes are gone with the session; forget the locks
        (the holder must not delete a node another worker now owns) and stand again. CONNECTED:
        watches may have been dropped with the connection, so re-arm everything (the queue's
        cached listings and the disable flag are simply fetched again)."""
        self._view.invalidate(None)
        if event == SessionEvent.LOST:
            with self._mutex:
                self._held.clear()
        self._switches.on_session(event)
        self._election.on_session(event)
        self._poke()

    # -- the switches and the election -------------------------------------------------------------
    def set_replication_enabled(self, enabled: bool) -> None:
        """Enable or disable re-replication cluster-wide (the ``disable`` node). Idempotent."""
        self._switches.set_replication_enabled(enabled)

    def is_replication_enabled(self) -> bool:
        """False while the ``disable`` node exists."""
        return self._switches.is_replication_enabled()

    def lost_bookie_recovery_delay_s(self) -> int:
        """The stored delay (0 if never set)."""
        return self._switches.lost_bookie_recovery_delay_s()

    def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        """Store the delay (ValueError if negative or not an int)."""
        self._switches.set_lost_bookie_recovery_delay_s(seconds)

    def watch_lost_bookie_recovery_delay(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(seconds)`` now and whenever the delay changes; returns a cancel function.

        Calls come on a store thread (never ZooKeeper's), one at a time, without repeats; the
        watch survives reconnections and session loss."""
        return self._switches.watch_lost_bookie_recovery_delay(callback)

    def elect_auditor(self, candidate_id: str, on_change: ElectionCallback) -> Callable[[], None]:
        """Stand as auditor candidate: an ephemeral sequential vote; the lowest vote wins.

        ``on_change(True)`` when we become the auditor, ``on_change(False)`` when we stop being it
        (session lost: then we stand again on the new session; withdrawn; store closed). Returns a
        withdraw function (deletes our vote; idempotent). The first vote is cast before this
        returns, so ZooKeeper down (MetadataUnavailableError) or an uninitialised cluster
        (NoNodeError) is the caller's error; later failures are retried in the background."""
        return self._election.elect_auditor(candidate_id, on_change)

    def current_auditor(self) -> str | None:
        """The id of the candidate holding the lowest vote, or None if nobody stands."""
        return self._election.current_auditor()

    # -- helpers --------------------------------------------------------------------------------
    def _fetch_listings(self, paths: list[str]) -> list[list[str] | None]:
        return self._nodes.children_many(paths, watch=self._on_child_event)

    def _applied(self, groups: list[list[Op]], *, retry: bool) -> list[bool]:
        """Send the groups together, each as one multi (applied whole or not at all), and say which
        were applied. One request per group instead of one per op: on a busy queue the client's
        per-request cost was most of a worker's ZooKeeper CPU. A group that failed changed
        nothing; callers fall back to op-by-op paths that find out why."""
        return [failed is None for failed in self._nodes.multi(groups, retry=retry)]

    # -- the queue ----------------------------------------------------------------------------
    def mark_underreplicated(self, ledger_id: int, missing: Iterable[str]) -> None:
        """Add ``missing`` bookie ids to the ledger's under-replication node (created if absent),
        by CAS so concurrent marks merge. Idempotent."""
        self.mark_underreplicated_many({ledger_id: missing})

    def mark_underreplicated_many(self, marks: Mapping[int, Iterable[str]]) -> None:
        """New marks go out together, each a multi creating its leaf bucket and node (each ledger
        id below 2**16 has a leaf bucket of its own: one request per ledger and one round trip for
        all); a ledger marked already, or whose buckets are missing further up, then takes the
        slow path (merge by CAS, make every parent)."""
        items = [(self._paths.ur_ledger(lid), lid, {check_bookie_id(b) for b in missing})
                 for lid, missing in marks.items()]
        if not items:
            return
        now_ms = int(time.time() * 1000)
        groups = [[Op("create", path.rsplit("/", 1)[0]), Op("create", path, encode_underreplicated(wanted, now_ms))]
                  for path, _lid, wanted in items]
        applied = self._applied(groups, retry=True)
        failed = [i for i, ok in enumerate(applied) if not ok]
        if failed:
            # mostly the buckets above the leaves are missing (a new queue, or one pruned when it
            # emptied): make them once per depth-3 bucket, and send those multis again
            leaves = {items[i][0].rsplit("/", 2)[0]: items[i][0].rsplit("/", 1)[0] for i in failed}
            for leaf in leaves.values():
                make_parents(self._nodes, self._paths, leaf)
            for i, ok in zip(failed, self._applied([groups[i] for i in failed], retry=True), strict=True):
                applied[i] = ok
        for (path, lid, wanted), ok in zip(items, applied, strict=True):
            if ok:
                self._listing_changed(path.rsplit("/", 2)[0])  # read our own write at once
            else:
                self._merge_mark(path, lid, wanted, now_ms)

    def _merge_mark(self, path: str, ledger_id: int, wanted: set[str], ctime_ms: int) -> None:
        """After the fast create failed: make the node with every missing parent, or merge into
        it by CAS so concurrent marks all land."""
        for _ in range(CAS_TRIES_MAX - 1):  # the fast create was the first try
            got = self._nodes.get(path)
            if got is None:
                try:
                    create_path(self._nodes, self._paths, path, encode_underreplicated(wanted, ctime_ms))
                except NodeExistsError:
                    continue  # marked meanwhile (by someone, or by our retried create): merge
                bucket = path.rsplit("/", 1)[0]
                for _level in range(4):
                    bucket = bucket.rsplit("/", 1)[0]
                    self._listing_changed(bucket)
                return
            current, first_ctime_ms = decode_underreplicated(got[0], path)
            if wanted <= set(current):
                return
            try:
                self._nodes.set(path, encode_underreplicated(wanted.union(current), first_ctime_ms), got[1])
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataUpdateConflictError(f"marking ledger {ledger_id} lost {CAS_TRIES_MAX} races in a row")

    def list_underreplicated(self) -> dict[int, list[str]]:
        """Every under-replicated ledger → its missing replicas (sorted)."""
        groups, _ = self._view.leaf_groups(0.0, refetch=True)  # exact: other sessions' marks too
        ids = sorted(lid for g in groups for lid in g.ids)
        out: dict[int, list[str]] = {}
        for lid, got in zip(ids, self._nodes.get_many([self._paths.ur_ledger(lid) for lid in ids]), strict=True):
            if got is None:
                continue  # replicated while we listed (or an empty bucket left behind)
            try:
                out[lid] = decode_underreplicated(got[0], self._paths.ur_ledger(lid))[0]
            except InvalidMetadataError as e:
                log.error("%s; listed with no known missing replicas", e)
                out[lid] = []
        return out

    def underreplicated_ids(self) -> list[int]:
        """Ids of the queued ledgers as the bucket names spell them, reading no ledger node and
        re-listing only what a watch said changed: cheap enough to poll (benchmarks, dashboards).
        As current as the watch events received (other sessions' marks show up once their event
        arrives, our own at once); a ledger just replicated may be listed until its bucket is
        pruned. list_underreplicated is exact."""
        self._nodes.ensure_live("list under-replicated ledgers")
        groups, _ = self._view.leaf_groups(0.0)
        return sorted(lid for g in groups for lid in g.ids)

    def missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The ledger's missing replicas, or None if it is not under-replicated."""
        path = self._paths.ur_ledger(ledger_id)
        got = self._nodes.get(path)
        return None if got is None else decode_underreplicated(got[0], path)[0]

    def acquired_missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The missing replicas recorded in the ledger's node when *we* locked it (None if we do
        not hold it, or the record was unreadable): what :meth:`mark_replicated`'s CAS compares
        against, so a worker needs no second read. Marks made after the acquire make that CAS
        fail and the ledger stays queued, to be taken again with the new record."""
        with self._mutex:
            held = self._held.get(ledger_id)
        return None if held is None or held.missing is None else list(held.missing)

    def acquire_underreplicated(self, timeout_ms: int, exclude: Iterable[int] = ()) -> int | None:
        """Lock one under-replicated ledger not locked by anyone (and not in ``exclude``) and return
        its id; None if none became available within ``timeout_ms`` (or replication is disabled).

        Scans, tries to lock, and otherwise waits up to ``timeout_ms`` (0: one look) for a watch: a
        ledger marked, a lock released, the ``disable`` node deleted. While disabled it waits as
        on an empty queue. The lock is ephemeral (dies with this store's session: the holder then
        forgets it) and remembers the node version it saw, for :meth:`mark_replicated`.
        ValueError if ``timeout_ms`` is negative.
        """
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must not be negative, got {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        excluded = {check_ledger_id(lid) for lid in exclude}
        last_scan = -MIN_SCAN_INTERVAL_S
        while True:
            with self._cond:
                generation = self._generation
            pause = last_scan + MIN_SCAN_INTERVAL_S - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            last_scan = time.monotonic()
            self._nodes.ensure_live("acquire an under-replicated ledger")
            if not self._switches.disabled():
                got = self._try_lock_one(excluded)
                if got is not None:
                    return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with self._cond:
                if self._generation == generation:
                    self._cond.wait(min(remaining, RESCAN_S))

    def _try_lock_one(self, excluded: set[int]) -> int | None:
        """BookKeeper's getLedgerToRereplicateFromHierarchy, on the cached listings: ledgers in
        random order (workers scanning together rarely collide) until one is locked. Listings a
        watch has outdated serve for ``REFRESH_S`` more; a search that finds nothing in them
        looks again in fresh ones. A fruitless fresh search has armed a child watch on every
        bucket and on the locks, which wakes the next wait."""
        tried: set[int] = set()
        for max_stale_s in (REFRESH_S, 0.0):
            groups, empty = self._view.leaf_groups(max_stale_s)
            locked = self._view.locked(max_stale_s)
            for lid, listed_at in self._candidates_of(groups, excluded, locked, tried):
                tried.add(lid)
                with self._mutex:
                    if lid in self._held or lid in self._claiming:
                        continue
                    self._claiming.add(lid)
                try:
                    outcome = self._lock(lid)
                finally:
                    with self._mutex:
                        self._claiming.discard(lid)
                if outcome is _Lock.TAKEN_BY_US:
                    return lid
                if outcome is _Lock.NO_NODE:
                    self._node_absent(lid, listed_at)
            if empty and max_stale_s == 0.0:
                self._prune_buckets(empty)
        return None

    def _node_absent(self, ledger_id: int, listed_at: float) -> None:
        """A listed leaf bucket without its node: finished by someone (our listing is behind), or
        being marked right now (bucket made, node next). Leaf buckets are not watched, so watch
        the node itself: its creation wakes waiting acquires. A bucket listed this long ago and
        still empty was left behind: prune it."""
        path = self._paths.ur_ledger(ledger_id)
        if self._nodes.watch(path, self._poke) is not None:
            self._poke()  # it is there now: the next look takes it
        elif time.monotonic() - listed_at >= EMPTY_FOR_S:
            self._prune_buckets([path.rsplit("/", 1)[0]])

    def _candidates_of(self, groups: list[LeafGroup], excluded: set[int], locked: set[int],
                       tried: set[int]) -> Iterator[tuple[int, float]]:
        """Untried ledgers that look free (and when their listing was fetched), in random order:
        random draws while they mostly hit (no pass over a big queue per acquire), then the rest
        shuffled."""
        with self._mutex:
            skip = excluded | set(self._held) | self._claiming
            done = dict(self._done)

        def usable(lid: int, at: float) -> bool:
            return lid not in skip and lid not in locked and lid not in tried and done.get(lid, -1.0) < at

        total = sum(len(g.ids) for g in groups)
        misses = 0
        while total and misses < _DRAW_MISSES_MAX:
            r = random.randrange(total)
            for g in groups:
                if r < len(g.ids):
                    break
                r -= len(g.ids)
            lid = g.ids[r]
            if usable(lid, g.at):
                misses = 0
                yield lid, g.at
            else:
                misses += 1
        rest = [(lid, g.at) for g in groups for lid in g.ids if usable(lid, g.at)]
        random.shuffle(rest)
        yield from rest

    def _lock(self, ledger_id: int) -> _Lock:
        """Take the ephemeral lock of one ledger and read its node in the same round trip (the read
        is applied after the create): the version and missing replicas of the lock's start."""
        lock_path, node_path = self._paths.ur_lock(ledger_id), self._paths.ur_ledger(ledger_id)
        session = self._nodes.live_session()
        created, node = self._nodes.pipeline([Op("create", lock_path, encode_lock(), ephemeral=True),
                                              Op("get", node_path)], retry=True)
        if isinstance(created, NoNodeError):  # no locks directory (an old cluster): the slow path
            return self._lock_slow(ledger_id)
        if isinstance(created, NodeExistsError):
            got = self._nodes.get(lock_path)
            owner = self._nodes.session()
            if got is None or owner is None or got[2] != owner:
                return _Lock.TAKEN  # someone else's (or just released: the next scan sees it)
            # our own lock node, from a create whose answer was lost and that we retried
        elif not isinstance(created, str):
            raise _raisable(created)
        elif session is not None and session == self._nodes.session():
            owner = session  # created on this session, which is still current: its ephemeral
        else:
            got = self._nodes.get(lock_path)
            if got is None:
                return _Lock.TAKEN  # the session that created it is gone already
            owner = got[2]
        return self._hold(ledger_id, lock_path, owner, node if not isinstance(node, Exception) else None)

    def _lock_slow(self, ledger_id: int) -> _Lock:
        lock_path = self._paths.ur_lock(ledger_id)
        try:
            create_path(self._nodes, self._paths, lock_path, encode_lock(), ephemeral=True)
        except NodeExistsError:
            return _Lock.TAKEN
        got = self._nodes.get(lock_path)
        if got is None:
            return _Lock.TAKEN
        return self._hold(ledger_id, lock_path, got[2], self._nodes.get(self._paths.ur_ledger(ledger_id)))

    def _hold(self, ledger_id: int, lock_path: str, owner: int | None, node: object) -> _Lock:
        if not isinstance(node, tuple):  # no node (yet, or any more): give the lock back
            self._delete_own(lock_path, owner)
            return _Lock.NO_NODE
        data, version, _owner = node
        try:
            missing: list[str] | None = decode_underreplicated(data, self._paths.ur_ledger(ledger_id))[0]
        except InvalidMetadataError:
            missing = None  # missing_replicas() reports it to whoever asks
        with self._mutex:
            self._held[ledger_id] = _HeldLock(version=version, session=owner, missing=missing)
        return _Lock.TAKEN_BY_US

    def _delete_own(self, lock_path: str, owner: int | None) -> None:
        """Delete a lock node of session ``owner`` if that is still our session (else it went
        with the session, and the node there now may be another worker's)."""
        live = self._nodes.live_session()
        if live is not None and live == owner:
            try:
                self._nodes.delete(lock_path, retry=False)
            except NoNodeError:
                pass
            return
        got = self._nodes.get(lock_path)  # not connected now: wait for a connection, then look
        if got is not None and got[2] is not None and got[2] == owner and owner == self._nodes.session():
            try:
                self._nodes.delete(lock_path, got[1])
            except (NoNodeError, BadVersionError):
                pass

    def release_underreplicated(self, ledger_id: int) -> None:
        """Delete the lock node only if it still belongs to the session that took it (after a lost
        session it is gone, or another worker's); forget it locally once that is settled."""
        with self._mutex:
            held = self._held.get(ledger_id)
        if held is None:
            return
        self._delete_own(self._paths.ur_lock(ledger_id), held.session)
        self._view.note_unlocked(ledger_id)
        self._forget(ledger_id, held)

    def _forget(self, ledger_id: int, held: _HeldLock) -> None:
        with self._mutex:
            if self._held.get(ledger_id) is held:
                del self._held[ledger_id]

    def mark_replicated(self, ledger_id: int) -> bool:
        """BookKeeper's markLedgerReplicated. A lock we no longer hold (never taken, or gone with
        a lost session) deletes nothing: then True only if the node is already gone. On
        MetadataUnavailableError the lock is kept, so the call can be repeated."""
        path = self._paths.ur_ledger(ledger_id)
        with self._mutex:
            held = self._held.get(ledger_id)
        live = self._nodes.live_session()
        if held is None or live is None or held.session != live:
            node = self._nodes.get(path)  # also waits for a connection, after which the session is known
            if held is None or held.session != self._nodes.session():
                if held is not None:
                    self._forget(ledger_id, held)
                return node is None
        bucket = path.rsplit("/", 1)[0]
        # the node (CAS on the version seen at acquire), if that emptied it its leaf bucket, and
        # (when our session still owns it) the lock, which goes whether or not the node did
        ops = [Op("delete", path, version=held.version), Op("delete", bucket)]
        unlock = held.session is not None and held.session == self._nodes.live_session()
        if unlock:
            ops.append(Op("delete", self._paths.ur_lock(ledger_id)))
        # one multi in the usual case; when any part of it would fail (marked again meanwhile,
        # lock gone) nothing was done, and the ops go again one by one to find out which
        applied = self._applied([ops], retry=False)[0]
        outcomes: list[object] = [None] * len(ops) if applied else self._nodes.pipeline(ops, retry=False)
        node_gone, bucket_gone = outcomes[0], outcomes[1]
        if node_gone is None or isinstance(node_gone, NoNodeError):
            removed = True
        elif isinstance(node_gone, BadVersionError):
            removed = False  # marked again while it was being replicated: it stays queued
        else:
            raise _raisable(node_gone)
        if removed and bucket_gone is None:  # (a node marked again at once keeps its bucket: no hint)
            with self._mutex:
                self._done[ledger_id] = time.monotonic()
                self._trim_done()
            self._prune_above(bucket)
        if unlock and (outcomes[2] is None or isinstance(outcomes[2], NoNodeError)):
            self._view.note_unlocked(ledger_id)
            self._forget(ledger_id, held)
        else:
            self.release_underreplicated(ledger_id)
        return removed

    def _trim_done(self) -> None:
        """Mutex held: forget completion hints older than any listing still in use."""
        if len(self._done) > _DONE_HINTS_MAX:
            cutoff = time.monotonic() - RESCAN_S
            self._done = {k: t for k, t in self._done.items() if t >= cutoff}

    def _prune_above(self, bucket: str) -> None:
        """Delete the emptied buckets above a removed leaf bucket, bottom up (best effort, as
        BookKeeper); skipped where the last listing showed other children (a bucket left empty
        by that guess is pruned by the next search that sees it empty)."""
        path = bucket
        while True:
            path = path.rsplit("/", 1)[0]
            if not path.startswith(self._paths.ur_ledgers + "/"):
                return  # the hierarchy's root stays
            hint = self._view.children_hint(path)
            if hint is not None and hint > 1:
                return
            try:
                self._nodes.delete(path)
            except MetadataError as e:  # NotEmptyError included: someone else's ledger is there
                log.debug("pruning %s: %s", path, e)
                return

    def _prune_buckets(self, buckets: list[str]) -> None:
        """Best-effort deletion of buckets seen empty, and of the parents that emptied (a concurrent
        mark re-creates what it needs)."""
        try:
            outcomes = self._nodes.pipeline([Op("delete", b) for b in buckets], retry=True)
        except MetadataError as e:
            log.debug("pruning %s: %s", buckets, e)
            return
        for bucket, outcome in zip(buckets, outcomes, strict=True):
            if outcome is None:
                self._prune_above(bucket)
