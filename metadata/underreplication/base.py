"""The backend-independent half of :class:`~metadata.underreplication.UnderReplicationStore`.

The queue, the locks and the election are written once, here, on a handful of ZooKeeper-shaped
primitives (``_ur_get``, ``_ur_create``, ``_ur_watch``, ...) that each backend implements with its
own deadlines and error translation (:mod:`metadata.zk.underreplication`,
:mod:`metadata.underreplication.memory`). So the twin and ZooKeeper cannot differ in the protocol,
only in the primitives, which the contract suite pins down.

Data formats (small, versioned JSON, UTF-8):

- an under-replicated ledger node: ``{"v": 1, "missing": ["host:port", ...], "ctime_ms": N}``
  (``missing`` sorted, ``ctime_ms`` = when the ledger was first marked; merges keep it);
- a lock node: ``{"v": 1, "host": "...", "pid": N}`` (who holds it, for operators);
- an auditor vote: the candidate id as plain text (BookKeeper keeps the bookie id there too);
- ``lostBookieRecoveryDelay``: the seconds as decimal text, like BookKeeper;
- ``disable``: empty; only its existence matters.

Threads: the election, the delay watch and every callback run on one worker thread per store
(``<store>-underreplication``); backends' watch callbacks only poke a condition or queue work
there, so nothing blocks ZooKeeper's event thread.

Cost per ledger (what bounds re-replication on a busy machine, where each ZooKeeper request costs
~0.2-0.3 ms of client CPU): acquire = one round trip (lock create + node read, pipelined) on top
of the bucket listings cached between child-watch events (:mod:`metadata.underreplication.view`);
mark_replicated = one round trip (CAS delete + leaf-bucket prune + the lock's delete). The
lock holder keeps the node's record (:meth:`UnderReplicationBase.acquired_missing_replicas`), so a
worker needs no second read. The election is :mod:`metadata.underreplication.election`.
"""

from __future__ import annotations

import abc
import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from metadata.errors import (
    BadVersionError,
    InvalidMetadataError,
    MetadataError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
)
from metadata.layout import ZkLayout, check_bookie_id, check_ledger_id
from metadata.underreplication import UnderReplicationStore
from metadata.underreplication.election import AuditorElection, _Candidate
from metadata.underreplication.records import (
    decode_underreplicated,
    encode_lock,
    encode_underreplicated,
)
from metadata.underreplication.switches import CAS_TRIES_MAX, ReplicationSwitches, _DelayWatch
from metadata.underreplication.view import EMPTY_FOR_S, LeafGroup, QueueView

if TYPE_CHECKING:
    from metadata.store import SessionListener, SessionWorker

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

#: A one-shot watch callback. ZooKeeper calls it with its event, the twin with None; it runs on a
#: backend thread and must not block.
Wake = Callable[[object], None]
NodeState = tuple[bytes, int, int | None]  # (data, version, ephemeral owner session or None)


class NotEmptyError(MetadataError):
    """A delete found children under the node (a pipelined prune's expected outcome)."""


@dataclass(frozen=True)
class Op:
    """One request of a :meth:`UnderReplicationBase._ur_pipeline` batch: ``create`` (``data``,
    ``ephemeral``), ``get`` or ``delete`` (CAS on ``version`` unless -1)."""

    kind: str
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


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


class UnderReplicationBase(AuditorElection, ReplicationSwitches, UnderReplicationStore):
    """The queue, locks, switches and election on top of the backend's primitives.

    A backend calls :meth:`_ur_init` once its session worker exists and :meth:`_ur_shutdown` when
    it closes; it implements the ``_ur_*`` primitives below, raising the errors of
    :mod:`metadata.errors` (NoNodeError, NodeExistsError, BadVersionError, MetadataUnavailableError,
    StoreClosedError), never its own.
    """

    paths: ZkLayout

    if TYPE_CHECKING:

        def add_session_listener(self, callback: SessionListener) -> None: ...

    # -- primitives (backend) ----------------------------------------------------------------
    @abc.abstractmethod
    def _ur_get_many(self, paths: list[str]) -> list[NodeState | None]:
        """Each node's ``(data, version, ephemeral owner)``, None if absent."""

    @abc.abstractmethod
    def _ur_children_many(self, paths: list[str], *, watch: bool) -> list[list[str] | None]:
        """Each node's children (None if absent); ``watch`` arms a child watch per path whose
        event reaches :meth:`_ur_listing_changed` (and wakes waiting acquires)."""

    @abc.abstractmethod
    def _ur_pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        """Send ``ops`` together, in order (ZooKeeper applies one session's requests in order, so a
        later op sees the effect of an earlier one), and return one outcome per op: a create's
        path, a get's NodeState (None if absent), a delete's None, or the node error as an
        *instance* (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError), never raised.
        Connection trouble raises: MetadataUnavailableError (after retrying the whole batch on a
        new connection if ``retry``), StoreClosedError."""

    @abc.abstractmethod
    def _ur_multi(self, groups: list[list[Op]], *, retry: bool) -> list[bool]:
        """Send the groups together, each as one ZooKeeper multi of creates and deletes (applied
        whole or not at all), and say which were applied. One request per group instead of one
        per op: on a busy queue the client's per-request cost was most of a worker's ZooKeeper
        CPU. A group that failed changed nothing; callers fall back to op-by-op paths that find
        out why. Connection trouble raises as for :meth:`_ur_pipeline`."""

    @abc.abstractmethod
    def _ur_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        """Create one node (its parent must exist: NoNodeError); returns the path created (with
        the sequence suffix). NodeExistsError if present. A non-sequential create may be retried
        on connection loss (callers treat "exists" as possibly their own); a sequential one raises
        MetadataUnavailableError when its outcome is unknown."""

    @abc.abstractmethod
    def _ur_set(self, path: str, data: bytes, version: int) -> int:
        """CAS-update (``version=-1``: any); returns the new version."""

    @abc.abstractmethod
    def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        """Delete a childless node (CAS unless ``version=-1``). ``retry=False``: a lost answer is
        MetadataUnavailableError rather than a retry (for a CAS delete whose retry could hit a
        re-created node of the same version)."""

    @abc.abstractmethod
    def _ur_watch(self, path: str, wake: Wake) -> NodeState | None:
        """Read ``path`` and arm a one-shot watch calling ``wake`` on its next change (creation,
        update or deletion). ``wake`` must be the same object on every call for one subscriber
        (ZooKeeper clients keep one registration per path and callback)."""

    @abc.abstractmethod
    def _ur_session(self) -> int | None:
        """The current session's id (None while there is none)."""

    @abc.abstractmethod
    def _ur_live_session(self) -> int | None:
        """The session's id if connected right now, else None. A request issued at once (without
        retry) then runs on that session or fails: what lets a lock holder skip re-reading its
        lock node before deleting it."""

    @abc.abstractmethod
    def _ur_ensure_live(self, what: str) -> None:
        """Return at once when connected; else wait for a connection within the operation deadline
        (MetadataUnavailableError): answers from the cache must not hide an outage."""

    # -- lifecycle -----------------------------------------------------------------------------
    def _ur_init(self, worker: SessionWorker) -> None:
        """Called by the backend's constructor; ``worker`` is the thread for election steps and
        every callback of this interface (owned, and closed, by us)."""
        self._ur_worker = worker
        self._ur_mutex = threading.Lock()
        self._ur_held: dict[int, _HeldLock] = {}
        self._ur_claiming: set[int] = set()
        self._ur_done: dict[int, float] = {}  # ledger → when we removed it (hint for listings older than that)
        self._ur_cond = threading.Condition()
        self._ur_generation = 0
        self._ur_candidates: set[_Candidate] = set()
        self._ur_delay_watches: set[_DelayWatch] = set()
        self._ur_view = QueueView(self.paths.ur_ledgers, self.paths.ur_locks, self._ur_fetch_listings,
                                  max_age_s=RESCAN_S)
        self._ur_disabled: bool | None = None  # cached existence of the disable node (None: look)
        self._ur_disable_epoch = 0
        self.add_session_listener(self._ur_session_event)

    def _ur_shutdown(self, *, tell: bool) -> None:
        """The store is closing (``tell``: tell the auditor it no longer is) or its process died."""
        with self._ur_mutex:
            candidates = list(self._ur_candidates)
            self._ur_candidates.clear()
            self._ur_held.clear()
            for watch in self._ur_delay_watches:
                watch.active = False
            self._ur_delay_watches.clear()
        for cand in candidates:
            with cand.lock:
                cand.withdrawn = True
            if tell:
                self._ur_worker.submit(partial(self._ur_tell, cand, False))
        self._ur_poke()
        self._ur_worker.close()

    def _ur_poke(self, _event: object = None) -> None:
        """Wake every waiting acquire (any thread; never blocks for long)."""
        with self._ur_cond:
            self._ur_generation += 1
            self._ur_cond.notify_all()

    def _ur_listing_changed(self, path: str | None) -> None:
        """A child watch fired for ``path`` (None: every watch is gone, e.g. with the connection):
        the cached listing is stale; waiting acquires look again. Any thread, never blocks."""
        self._ur_view.invalidate(path)
        self._ur_poke()

    def _ur_disable_changed(self, _event: object = None) -> None:
        """The disable node's watch fired: look at it again on the next acquire."""
        with self._ur_mutex:
            self._ur_disabled = None
            self._ur_disable_epoch += 1
        self._ur_poke()

    def _ur_session_event(self, event: str) -> None:
        """Session worker thread. LOST: our locks and votes are gone with the session; forget the
        locks (the holder must not delete a node another worker now owns) and stand again.
        CONNECTED: watches may have been dropped with the connection, so re-arm everything (the
        queue's cached listings and the disable flag are simply fetched again)."""
        self._ur_view.invalidate(None)
        self._ur_disable_changed()
        with self._ur_mutex:
            candidates = list(self._ur_candidates)
            watches = list(self._ur_delay_watches)
            if event == "LOST":
                self._ur_held.clear()
        if event == "LOST":
            for cand in candidates:
                self._ur_worker.submit(partial(self._ur_lost, cand))
        elif event == "CONNECTED":
            for cand in candidates:
                self._ur_worker.submit(partial(self._ur_step, cand))
            for watch in watches:
                self._ur_worker.submit(partial(self._ur_rearm_delay, watch))
        self._ur_poke()

    # -- helpers --------------------------------------------------------------------------------
    def _ur_get(self, path: str) -> NodeState | None:
        return self._ur_get_many([path])[0]

    def _ur_fetch_listings(self, paths: list[str]) -> list[list[str] | None]:
        return self._ur_children_many(paths, watch=True)

    def _ur_create_path(
        self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False
    ) -> str:
        """Create ``path``, making its missing parents below ``underreplication`` (clusters
        initialised before the queue existed, buckets pruned by a concurrent mark_replicated).
        NoNodeError if ``underreplication`` itself is missing: the cluster is not initialised."""
        for _ in range(CAS_TRIES_MAX):
            try:
                return self._ur_create(path, data, ephemeral=ephemeral, sequential=sequential)
            except NoNodeError:
                self._ur_make_parents(path)
        raise MetadataUpdateConflictError(f"create {path}: its parents kept disappearing")

    def _ur_make_parents(self, path: str) -> None:
        """Create the missing ancestors of ``path`` below ``underreplication``, looking bottom up
        (usually only the last bucket or two are missing: two or three round trips, not five)."""
        base = self.paths.underreplication
        missing: list[str] = []
        parent = path.rsplit("/", 1)[0]
        while True:
            if parent == base:
                raise NoNodeError(f"no cluster at {base}: run `spark-bookie init` first")
            try:
                self._ur_create(parent, b"")
                break
            except NodeExistsError:
                break
            except NoNodeError:
                missing.append(parent)
                parent = parent.rsplit("/", 1)[0]
        for parent in reversed(missing):
            try:
                self._ur_create(parent, b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                return  # pruned by a concurrent mark_replicated: the caller tries again

    # -- the queue ----------------------------------------------------------------------------
    def mark_underreplicated(self, ledger_id: int, missing: Iterable[str]) -> None:
        self.mark_underreplicated_many({ledger_id: missing})

    def mark_underreplicated_many(self, marks: Mapping[int, Iterable[str]]) -> None:
        """New marks go out together, each a multi creating its leaf bucket and node (each ledger
        id below 2**16 has a leaf bucket of its own: one request per ledger and one round trip for
        all); a ledger marked already, or whose buckets are missing further up, then takes the
        slow path (merge by CAS, make every parent)."""
        items = [(self.paths.ur_ledger(lid), lid, {check_bookie_id(b) for b in missing})
                 for lid, missing in marks.items()]
        if not items:
            return
        now_ms = int(time.time() * 1000)
        groups = [[Op("create", path.rsplit("/", 1)[0]), Op("create", path, encode_underreplicated(wanted, now_ms))]
                  for path, _lid, wanted in items]
        applied = self._ur_multi(groups, retry=True)
        failed = [i for i, ok in enumerate(applied) if not ok]
        if failed:
            # mostly the buckets above the leaves are missing (a new queue, or one pruned when it
            # emptied): make them once per depth-3 bucket, and send those multis again
            leaves = {items[i][0].rsplit("/", 2)[0]: items[i][0].rsplit("/", 1)[0] for i in failed}
            for leaf in leaves.values():
                self._ur_make_parents(leaf)
            for i, ok in zip(failed, self._ur_multi([groups[i] for i in failed], retry=True), strict=True):
                applied[i] = ok
        for (path, lid, wanted), ok in zip(items, applied, strict=True):
            if ok:
                self._ur_listing_changed(path.rsplit("/", 2)[0])  # read our own write at once
            else:
                self._ur_merge_mark(path, lid, wanted, now_ms)

    def _ur_merge_mark(self, path: str, ledger_id: int, wanted: set[str], ctime_ms: int) -> None:
        """After the fast create failed: make the node with every missing parent, or merge into
        it by CAS so concurrent marks all land."""
        for _ in range(CAS_TRIES_MAX - 1):  # the fast create was the first try
            got = self._ur_get(path)
            if got is None:
                try:
                    self._ur_create_path(path, encode_underreplicated(wanted, ctime_ms))
                except NodeExistsError:
                    continue  # marked meanwhile (by someone, or by our retried create): merge
                bucket = path.rsplit("/", 1)[0]
                for _level in range(4):
                    bucket = bucket.rsplit("/", 1)[0]
                    self._ur_listing_changed(bucket)
                return
            current, first_ctime_ms = decode_underreplicated(got[0], path)
            if wanted <= set(current):
                return
            try:
                self._ur_set(path, encode_underreplicated(wanted.union(current), first_ctime_ms), got[1])
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataUpdateConflictError(f"marking ledger {ledger_id} lost {CAS_TRIES_MAX} races in a row")

    def list_underreplicated(self) -> dict[int, list[str]]:
        groups, _ = self._ur_view.leaf_groups(0.0, refetch=True)  # exact: other sessions' marks too
        ids = sorted(lid for g in groups for lid in g.ids)
        out: dict[int, list[str]] = {}
        for lid, got in zip(ids, self._ur_get_many([self.paths.ur_ledger(lid) for lid in ids]), strict=True):
            if got is None:
                continue  # replicated while we listed (or an empty bucket left behind)
            try:
                out[lid] = decode_underreplicated(got[0], self.paths.ur_ledger(lid))[0]
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
        self._ur_ensure_live("list under-replicated ledgers")
        groups, _ = self._ur_view.leaf_groups(0.0)
        return sorted(lid for g in groups for lid in g.ids)

    def missing_replicas(self, ledger_id: int) -> list[str] | None:
        path = self.paths.ur_ledger(ledger_id)
        got = self._ur_get(path)
        return None if got is None else decode_underreplicated(got[0], path)[0]

    def acquired_missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The missing replicas recorded in the ledger's node when *we* locked it (None if we do
        not hold it, or the record was unreadable): what :meth:`mark_replicated`'s CAS compares
        against, so a worker needs no second read. Marks made after the acquire make that CAS
        fail and the ledger stays queued, to be taken again with the new record."""
        with self._ur_mutex:
            held = self._ur_held.get(ledger_id)
        return None if held is None or held.missing is None else list(held.missing)

    def acquire_underreplicated(self, timeout_ms: int, exclude: Iterable[int] = ()) -> int | None:
        """Scan, try to lock, and otherwise wait for a watch (a ledger marked, a lock released, the
        ``disable`` node deleted) or the deadline. While disabled this waits like an empty queue."""
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must not be negative, got {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        excluded = {check_ledger_id(lid) for lid in exclude}
        last_scan = -MIN_SCAN_INTERVAL_S
        while True:
            with self._ur_cond:
                generation = self._ur_generation
            pause = last_scan + MIN_SCAN_INTERVAL_S - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            last_scan = time.monotonic()
            self._ur_ensure_live("acquire an under-replicated ledger")
            if not self._ur_is_disabled():
                got = self._ur_try_lock_one(excluded)
                if got is not None:
                    return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with self._ur_cond:
                if self._ur_generation == generation:
                    self._ur_cond.wait(min(remaining, RESCAN_S))

    def _ur_is_disabled(self) -> bool:
        """Whether the ``disable`` node exists: cached until its watch fires."""
        with self._ur_mutex:
            known, epoch = self._ur_disabled, self._ur_disable_epoch
        if known is not None:
            return known
        disabled = self._ur_watch(self.paths.ur_disable, self._ur_disable_changed) is not None
        with self._ur_mutex:
            if self._ur_disable_epoch == epoch:
                self._ur_disabled = disabled
        return disabled

    def _ur_try_lock_one(self, excluded: set[int]) -> int | None:
        """BookKeeper's getLedgerToRereplicateFromHierarchy, on the cached listings: ledgers in
        random order (workers scanning together rarely collide) until one is locked. Listings a
        watch has outdated serve for ``REFRESH_S`` more; a search that finds nothing in them
        looks again in fresh ones. A fruitless fresh search has armed a child watch on every
        bucket and on the locks, which wakes the next wait."""
        tried: set[int] = set()
        for max_stale_s in (REFRESH_S, 0.0):
            groups, empty = self._ur_view.leaf_groups(max_stale_s)
            locked = self._ur_view.locked(max_stale_s)
            for lid, listed_at in self._ur_candidates_of(groups, excluded, locked, tried):
                tried.add(lid)
                with self._ur_mutex:
                    if lid in self._ur_held or lid in self._ur_claiming:
                        continue
                    self._ur_claiming.add(lid)
                try:
                    outcome = self._ur_lock(lid)
                finally:
                    with self._ur_mutex:
                        self._ur_claiming.discard(lid)
                if outcome is _Lock.TAKEN_BY_US:
                    return lid
                if outcome is _Lock.NO_NODE:
                    self._ur_node_absent(lid, listed_at)
            if empty and max_stale_s == 0.0:
                self._ur_prune_buckets(empty)
        return None

    def _ur_node_absent(self, ledger_id: int, listed_at: float) -> None:
        """A listed leaf bucket without its node: finished by someone (our listing is behind), or
        being marked right now (bucket made, node next). Leaf buckets are not watched, so watch
        the node itself: its creation wakes waiting acquires. A bucket listed this long ago and
        still empty was left behind: prune it."""
        path = self.paths.ur_ledger(ledger_id)
        if self._ur_watch(path, self._ur_poke) is not None:
            self._ur_poke()  # it is there now: the next look takes it
        elif time.monotonic() - listed_at >= EMPTY_FOR_S:
            self._ur_prune_buckets([path.rsplit("/", 1)[0]])

    def _ur_candidates_of(self, groups: list[LeafGroup], excluded: set[int], locked: set[int],
                          tried: set[int]) -> Iterator[tuple[int, float]]:
        """Untried ledgers that look free (and when their listing was fetched), in random order:
        random draws while they mostly hit (no pass over a big queue per acquire), then the rest
        shuffled."""
        with self._ur_mutex:
            skip = excluded | set(self._ur_held) | self._ur_claiming
            done = dict(self._ur_done)

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

    def _ur_lock(self, ledger_id: int) -> _Lock:
        """Take the ephemeral lock of one ledger and read its node in the same round trip (the read
        is applied after the create): the version and missing replicas of the lock's start."""
        lock_path, node_path = self.paths.ur_lock(ledger_id), self.paths.ur_ledger(ledger_id)
        session = self._ur_live_session()
        created, node = self._ur_pipeline([Op("create", lock_path, encode_lock(), ephemeral=True),
                                           Op("get", node_path)], retry=True)
        if isinstance(created, NoNodeError):  # no locks directory (an old cluster): the slow path
            return self._ur_lock_slow(ledger_id)
        if isinstance(created, NodeExistsError):
            got = self._ur_get(lock_path)
            owner = self._ur_session()
            if got is None or owner is None or got[2] != owner:
                return _Lock.TAKEN  # someone else's (or just released: the next scan sees it)
            # our own lock node, from a create whose answer was lost and that we retried
        elif not isinstance(created, str):
            raise _raisable(created)
        elif session is not None and session == self._ur_session():
            owner = session  # created on this session, which is still current: its ephemeral
        else:
            got = self._ur_get(lock_path)
            if got is None:
                return _Lock.TAKEN  # the session that created it is gone already
            owner = got[2]
        return self._ur_hold(ledger_id, lock_path, owner, node if not isinstance(node, Exception) else None)

    def _ur_lock_slow(self, ledger_id: int) -> _Lock:
        lock_path = self.paths.ur_lock(ledger_id)
        try:
            self._ur_create_path(lock_path, encode_lock(), ephemeral=True)
        except NodeExistsError:
            return _Lock.TAKEN
        got = self._ur_get(lock_path)
        if got is None:
            return _Lock.TAKEN
        return self._ur_hold(ledger_id, lock_path, got[2], self._ur_get(self.paths.ur_ledger(ledger_id)))

    def _ur_hold(self, ledger_id: int, lock_path: str, owner: int | None, node: object) -> _Lock:
        if not isinstance(node, tuple):  # no node (yet, or any more): give the lock back
            self._ur_delete_own(lock_path, owner)
            return _Lock.NO_NODE
        data, version, _owner = node
        try:
            missing: list[str] | None = decode_underreplicated(data, self.paths.ur_ledger(ledger_id))[0]
        except InvalidMetadataError:
            missing = None  # missing_replicas() reports it to whoever asks
        with self._ur_mutex:
            self._ur_held[ledger_id] = _HeldLock(version=version, session=owner, missing=missing)
        return _Lock.TAKEN_BY_US

    def _ur_delete_own(self, lock_path: str, owner: int | None) -> None:
        """Delete a lock node of session ``owner`` if that is still our session (else it went
        with the session, and the node there now may be another worker's)."""
        live = self._ur_live_session()
        if live is not None and live == owner:
            try:
                self._ur_delete(lock_path, retry=False)
            except NoNodeError:
                pass
            return
        got = self._ur_get(lock_path)  # not connected now: wait for a connection, then look
        if got is not None and got[2] is not None and got[2] == owner and owner == self._ur_session():
            try:
                self._ur_delete(lock_path, got[1])
            except (NoNodeError, BadVersionError):
                pass

    def release_underreplicated(self, ledger_id: int) -> None:
        """Delete the lock node only if it still belongs to the session that took it (after a lost
        session it is gone, or another worker's); forget it locally once that is settled."""
        with self._ur_mutex:
            held = self._ur_held.get(ledger_id)
        if held is None:
            return
        self._ur_delete_own(self.paths.ur_lock(ledger_id), held.session)
        self._ur_view.note_unlocked(ledger_id)
        self._ur_forget(ledger_id, held)

    def _ur_forget(self, ledger_id: int, held: _HeldLock) -> None:
        with self._ur_mutex:
            if self._ur_held.get(ledger_id) is held:
                del self._ur_held[ledger_id]

    def mark_replicated(self, ledger_id: int) -> bool:
        """BookKeeper's markLedgerReplicated. A lock we no longer hold (never taken, or gone with
        a lost session) deletes nothing: then True only if the node is already gone. On
        MetadataUnavailableError the lock is kept, so the call can be repeated."""
        path = self.paths.ur_ledger(ledger_id)
        with self._ur_mutex:
            held = self._ur_held.get(ledger_id)
        live = self._ur_live_session()
        if held is None or live is None or held.session != live:
            node = self._ur_get(path)  # also waits for a connection, after which the session is known
            if held is None or held.session != self._ur_session():
                if held is not None:
                    self._ur_forget(ledger_id, held)
                return node is None
        bucket = path.rsplit("/", 1)[0]
        # the node (CAS on the version seen at acquire), if that emptied it its leaf bucket, and
        # (when our session still owns it) the lock, which goes whether or not the node did
        ops = [Op("delete", path, version=held.version), Op("delete", bucket)]
        unlock = held.session is not None and held.session == self._ur_live_session()
        if unlock:
            ops.append(Op("delete", self.paths.ur_lock(ledger_id)))
        # one multi in the usual case; when any part of it would fail (marked again meanwhile,
        # lock gone) nothing was done, and the ops go again one by one to find out which
        applied = self._ur_multi([ops], retry=False)[0]
        outcomes: list[object] = [None] * len(ops) if applied else self._ur_pipeline(ops, retry=False)
        node_gone, bucket_gone = outcomes[0], outcomes[1]
        if node_gone is None or isinstance(node_gone, NoNodeError):
            removed = True
        elif isinstance(node_gone, BadVersionError):
            removed = False  # marked again while it was being replicated: it stays queued
        else:
            raise _raisable(node_gone)
        if removed and bucket_gone is None:  # (a node marked again at once keeps its bucket: no hint)
            with self._ur_mutex:
                self._ur_done[ledger_id] = time.monotonic()
                self._ur_trim_done()
            self._ur_prune_above(bucket)
        if unlock and (outcomes[2] is None or isinstance(outcomes[2], NoNodeError)):
            self._ur_view.note_unlocked(ledger_id)
            self._ur_forget(ledger_id, held)
        else:
            self.release_underreplicated(ledger_id)
        return removed

    def _ur_trim_done(self) -> None:
        """Mutex held: forget completion hints older than any listing still in use."""
        if len(self._ur_done) > _DONE_HINTS_MAX:
            cutoff = time.monotonic() - RESCAN_S
            self._ur_done = {k: t for k, t in self._ur_done.items() if t >= cutoff}

    def _ur_prune_above(self, bucket: str) -> None:
        """Delete the emptied buckets above a removed leaf bucket, bottom up (best effort, as
        BookKeeper); skipped where the last listing showed other children (a bucket left empty
        by that guess is pruned by the next search that sees it empty)."""
        path = bucket
        while True:
            path = path.rsplit("/", 1)[0]
            if not path.startswith(self.paths.ur_ledgers + "/"):
                return  # the hierarchy's root stays
            hint = self._ur_view.children_hint(path)
            if hint is not None and hint > 1:
                return
            try:
                self._ur_delete(path)
            except MetadataError as e:  # NotEmptyError included: someone else's ledger is there
                log.debug("pruning %s: %s", path, e)
                return

    def _ur_prune_buckets(self, buckets: list[str]) -> None:
        """Best-effort deletion of buckets seen empty, and of the parents that emptied (a concurrent
        mark re-creates what it needs)."""
        try:
            outcomes = self._ur_pipeline([Op("delete", b) for b in buckets], retry=True)
        except MetadataError as e:
            log.debug("pruning %s: %s", buckets, e)
            return
        for bucket, outcome in zip(buckets, outcomes, strict=True):
            if outcome is None:
                self._ur_prune_above(bucket)
