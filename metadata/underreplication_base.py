"""The backend-independent half of :class:`~metadata.underreplication.UnderReplicationStore`.

The queue, the locks and the election are written once, here, on a handful of ZooKeeper-shaped
primitives (``_ur_get``, ``_ur_create``, ``_ur_watch``, ...) that each backend implements with its
own deadlines and error translation (:mod:`metadata.zk.underreplication`,
:mod:`metadata.memory_underreplication`). So the twin and ZooKeeper cannot differ in the protocol,
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
"""

from __future__ import annotations

import abc
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from metadata.errors import (
    BadVersionError,
    InvalidMetadataError,
    MetadataError,
    MetadataUnavailableError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
    StoreClosedError,
)
from metadata.layout import (
    UR_VOTE_PREFIX,
    ZkLayout,
    check_bookie_id,
    check_ledger_id,
    is_ur_bucket_name,
    ur_ledger_id,
    vote_sequence,
)
from metadata.underreplication import ElectionCallback, UnderReplicationStore

if TYPE_CHECKING:
    from metadata.store import SessionListener, SessionWorker

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
#: A waiting acquire re-scans at least this often even if no watch fired (belt and braces: a
#: watch lost with a connection is re-armed on reconnection anyway).
RESCAN_S = 5.0
#: ... and never more often than this, however busy the queue (no busy polling).
MIN_SCAN_INTERVAL_S = 0.1
RETRY_S = 1.0  # election / delay-watch retry after a ZooKeeper error
CAS_TRIES_MAX = 100  # lost races in a row before mark_underreplicated gives up
_RECHECKS_MAX = 20  # election: votes vanishing under us this many times in a row means retry later

#: A one-shot watch callback. ZooKeeper calls it with its event, the twin with None; it runs on a
#: backend thread and must not block.
Wake = Callable[[object], None]
NodeState = tuple[bytes, int, int | None]  # (data, version, ephemeral owner session or None)


# -- data formats ---------------------------------------------------------------------------------
def encode_underreplicated(missing: Iterable[str], ctime_ms: int) -> bytes:
    body = {"v": FORMAT_VERSION, "missing": sorted(set(missing)), "ctime_ms": int(ctime_ms)}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_underreplicated(data: bytes, where: str) -> tuple[list[str], int]:
    """``(missing, ctime_ms)`` of an under-replicated ledger node; InvalidMetadataError if it is
    not one we can read (a newer format version included: never guess at it)."""
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidMetadataError(f"{where}: not an under-replication record ({e})") from e
    if not isinstance(body, dict) or body.get("v") != FORMAT_VERSION:
        raise InvalidMetadataError(f"{where}: unknown under-replication record format {data[:80]!r}")
    missing, ctime = body.get("missing"), body.get("ctime_ms", 0)
    if not isinstance(missing, list) or not all(isinstance(b, str) for b in missing) or not isinstance(ctime, int):
        raise InvalidMetadataError(f"{where}: malformed under-replication record {data[:80]!r}")
    return sorted(set(missing)), ctime


def encode_lock() -> bytes:
    return json.dumps({"v": FORMAT_VERSION, "host": socket.gethostname(), "pid": os.getpid()}).encode()


def check_delay_s(seconds: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ValueError(f"lost bookie recovery delay must be an int (seconds), got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"lost bookie recovery delay must not be negative, got {seconds}")
    return seconds


def decode_delay_s(data: bytes | None, where: str) -> int:
    if data is None:
        return 0
    try:
        return check_delay_s(int(data.decode().strip()))
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidMetadataError(f"{where}: not a number of seconds: {data[:40]!r}") from e


def ordered_votes(names: Iterable[str]) -> list[str]:
    """Auditor votes by ZooKeeper sequence number, lowest (the auditor) first; other names dropped."""
    seqs = [(seq, name) for name in names if (seq := vote_sequence(name)) is not None]
    return [name for _, name in sorted(seqs)]


# -- per-store state --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _HeldLock:
    version: int  # the under-replicated node's version seen when the lock was taken
    session: int | None  # the session owning the lock node


@dataclass(eq=False)
class _Candidate:
    candidate_id: str
    on_change: ElectionCallback
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards the fields below
    stand_lock: threading.Lock = field(default_factory=threading.Lock)  # one vote creation at a time
    vote: str | None = None  # name of our vote node on the current session
    is_auditor: bool = False  # what on_change was last told
    withdrawn: bool = False
    uncertain: bool = False  # a vote creation's outcome is unknown: an orphan vote may exist
    retry_pending: bool = False
    wake: Wake = field(default=lambda _e: None)


@dataclass(eq=False)
class _DelayWatch:
    callback: Callable[[int], None]
    active: bool = True
    last: int | None = None
    retry_pending: bool = False
    wake: Wake = field(default=lambda _e: None)


class UnderReplicationBase(UnderReplicationStore):
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
        """Each node's children (None if absent); ``watch`` arms a child watch that pokes waiting
        acquires when the list changes."""

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
    def _ur_delete_if_empty(self, path: str) -> bool:
        """Delete ``path`` if it has no children; False if it has some (True if deleted or absent)."""

    @abc.abstractmethod
    def _ur_watch(self, path: str, wake: Wake) -> NodeState | None:
        """Read ``path`` and arm a one-shot watch calling ``wake`` on its next change (creation,
        update or deletion). ``wake`` must be the same object on every call for one subscriber
        (ZooKeeper clients keep one registration per path and callback)."""

    @abc.abstractmethod
    def _ur_session(self) -> int | None:
        """The current session's id (None while there is none)."""

    # -- lifecycle -----------------------------------------------------------------------------
    def _ur_init(self, worker: SessionWorker) -> None:
        """Called by the backend's constructor; ``worker`` is the thread for election steps and
        every callback of this interface (owned, and closed, by us)."""
        self._ur_worker = worker
        self._ur_mutex = threading.Lock()
        self._ur_held: dict[int, _HeldLock] = {}
        self._ur_claiming: set[int] = set()
        self._ur_cond = threading.Condition()
        self._ur_generation = 0
        self._ur_candidates: set[_Candidate] = set()
        self._ur_delay_watches: set[_DelayWatch] = set()
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

    def _ur_session_event(self, event: str) -> None:
        """Session worker thread. LOST: our locks and votes are gone with the session; forget the
        locks (the holder must not delete a node another worker now owns) and stand again.
        CONNECTED: watches may have been dropped with the connection, so re-arm everything."""
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

    def _ur_walk(self, *, watch: bool) -> list[tuple[int, str]]:
        """Every ``(ledger id, node path)`` of the under-replicated hierarchy (4 bucket levels)."""
        level = [self.paths.ur_ledgers]
        for _ in range(4):
            level = [
                f"{parent}/{name}"
                for parent, names in zip(level, self._ur_children_many(level, watch=watch), strict=True)
                for name in names or []
                if is_ur_bucket_name(name)
            ]
        leaves: list[tuple[int, str]] = []
        for parent, names in zip(level, self._ur_children_many(level, watch=watch), strict=True):
            for name in names or []:
                lid = ur_ledger_id(name)
                if lid is not None:
                    leaves.append((lid, f"{parent}/{name}"))
        return leaves

    # -- the queue ----------------------------------------------------------------------------
    def mark_underreplicated(self, ledger_id: int, missing: Iterable[str]) -> None:
        path = self.paths.ur_ledger(ledger_id)
        wanted = {check_bookie_id(b) for b in missing}
        for attempt in range(CAS_TRIES_MAX):
            got = None if attempt == 0 else self._ur_get(path)  # most marks are of a new ledger
            if got is None:
                try:
                    self._ur_create_path(path, encode_underreplicated(wanted, int(time.time() * 1000)))
                    return
                except NodeExistsError:
                    continue  # marked already (by someone, or by our retried create): merge
            current, ctime_ms = decode_underreplicated(got[0], path)
            if wanted <= set(current):
                return
            try:
                self._ur_set(path, encode_underreplicated(wanted.union(current), ctime_ms), got[1])
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataUpdateConflictError(f"marking ledger {ledger_id} lost {CAS_TRIES_MAX} races in a row")

    def list_underreplicated(self) -> dict[int, list[str]]:
        leaves = self._ur_walk(watch=False)
        out: dict[int, list[str]] = {}
        for (lid, path), got in zip(leaves, self._ur_get_many([p for _, p in leaves]), strict=True):
            if got is None:
                continue  # replicated while we listed
            try:
                out[lid] = decode_underreplicated(got[0], path)[0]
            except InvalidMetadataError as e:
                log.error("%s; listed with no known missing replicas", e)
                out[lid] = []
        return dict(sorted(out.items()))

    def missing_replicas(self, ledger_id: int) -> list[str] | None:
        path = self.paths.ur_ledger(ledger_id)
        got = self._ur_get(path)
        return None if got is None else decode_underreplicated(got[0], path)[0]

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
            if self._ur_watch(self.paths.ur_disable, self._ur_poke) is None:
                got = self._ur_try_lock_one(excluded)
                if got is not None:
                    return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with self._ur_cond:
                if self._ur_generation == generation:
                    self._ur_cond.wait(min(remaining, RESCAN_S))

    def _ur_try_lock_one(self, excluded: set[int]) -> int | None:
        """BookKeeper's getLedgerToRereplicateFromHierarchy: a depth-first search in random order
        (workers scanning together rarely collide) that stops at the first ledger it locks. A
        fruitless search has armed a child watch on every bucket, which wakes the next wait."""
        locked = set(self._ur_children_many([self.paths.ur_locks], watch=True)[0] or [])
        return self._ur_search(self.paths.ur_ledgers, 0, excluded, locked)

    def _ur_search(self, parent: str, depth: int, excluded: set[int], locked: set[str]) -> int | None:
        names = self._ur_children_many([parent], watch=True)[0] or []
        random.shuffle(names)
        if depth < 4:
            for name in names:
                if is_ur_bucket_name(name):
                    found = self._ur_search(f"{parent}/{name}", depth + 1, excluded, locked)
                    if found is not None:
                        return found
            return None
        with self._ur_mutex:
            skip = excluded | set(self._ur_held) | self._ur_claiming
        free = [lid for n in names if (lid := ur_ledger_id(n)) is not None and lid not in skip and n not in locked]
        for lid in free:
            with self._ur_mutex:
                if lid in self._ur_held or lid in self._ur_claiming:
                    continue
                self._ur_claiming.add(lid)
            try:
                if self._ur_lock(lid):
                    return lid
            finally:
                with self._ur_mutex:
                    self._ur_claiming.discard(lid)
        return None

    def _ur_lock(self, ledger_id: int) -> bool:
        """Take the ephemeral lock of one ledger and remember the version of its node."""
        lock_path = self.paths.ur_lock(ledger_id)
        try:
            self._ur_create_path(lock_path, encode_lock(), ephemeral=True)
        except NodeExistsError:
            got = self._ur_get(lock_path)
            session = self._ur_session()
            if got is None or session is None or got[2] != session:
                return False  # someone else's (or just released: the next scan sees it)
            # our own lock node, from a create whose answer was lost and that we retried
        node, lock = self._ur_get_many([self.paths.ur_ledger(ledger_id), lock_path])
        if node is None or lock is None:  # replicated meanwhile (or the session is already gone)
            if lock is not None:
                self._ur_delete_lock(lock_path, lock)
            return False
        with self._ur_mutex:
            self._ur_held[ledger_id] = _HeldLock(version=node[1], session=lock[2])
        return True

    def _ur_delete_lock(self, lock_path: str, lock: NodeState) -> None:
        try:
            self._ur_delete(lock_path, lock[1])
        except (NoNodeError, BadVersionError):
            pass

    def release_underreplicated(self, ledger_id: int) -> None:
        """Delete the lock node only if it still belongs to the session that took it (after a lost
        session it is gone, or another worker's); forget it locally once that is settled."""
        with self._ur_mutex:
            held = self._ur_held.get(ledger_id)
        if held is None:
            return
        lock_path = self.paths.ur_lock(ledger_id)
        got = self._ur_get(lock_path)
        if got is not None and got[2] is not None and got[2] == held.session:
            self._ur_delete_lock(lock_path, got)
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
        node = self._ur_get(path)  # also waits for a connection, after which the session is known
        if held is None or held.session != self._ur_session():
            if held is not None:
                self._ur_forget(ledger_id, held)
            return node is None
        removed = True
        if node is not None:
            try:
                self._ur_delete(path, held.version, retry=False)
            except NoNodeError:
                pass
            except BadVersionError:
                removed = False  # marked again while it was being replicated: it stays queued
        if removed:
            self._ur_prune(path)
        self.release_underreplicated(ledger_id)
        return removed

    def _ur_prune(self, path: str) -> None:
        """Delete the emptied buckets above a removed node, bottom up (best effort, as BookKeeper)."""
        for _ in range(4):
            path = path.rsplit("/", 1)[0]
            try:
                if not self._ur_delete_if_empty(path):
                    return
            except MetadataError as e:
                log.debug("pruning %s: %s", path, e)
                return

    # -- switches --------------------------------------------------------------------------------
    def set_replication_enabled(self, enabled: bool) -> None:
        path = self.paths.ur_disable
        if enabled:
            try:
                self._ur_delete(path)
            except NoNodeError:
                pass
        else:
            try:
                self._ur_create_path(path, b"")
            except NodeExistsError:
                pass

    def is_replication_enabled(self) -> bool:
        return self._ur_get(self.paths.ur_disable) is None

    def lost_bookie_recovery_delay_s(self) -> int:
        path = self.paths.ur_lost_bookie_recovery_delay
        got = self._ur_get(path)
        return decode_delay_s(None if got is None else got[0], path)

    def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        data = str(check_delay_s(seconds)).encode()
        path = self.paths.ur_lost_bookie_recovery_delay
        for _ in range(CAS_TRIES_MAX):
            try:
                self._ur_set(path, data, -1)
                return
            except NoNodeError:
                pass
            try:
                self._ur_create_path(path, data)
                return
            except NodeExistsError:
                pass
        raise MetadataUpdateConflictError(f"{path} kept appearing and disappearing")

    def watch_lost_bookie_recovery_delay(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Armed in the caller's thread (ZooKeeper down is the caller's error); every report,
        the first included, comes on the store's under-replication thread, without repeats."""
        watch = _DelayWatch(callback)
        watch.wake = lambda _event: self._ur_worker.submit(partial(self._ur_rearm_delay, watch))
        path = self.paths.ur_lost_bookie_recovery_delay
        got = self._ur_watch(path, watch.wake)
        with self._ur_mutex:
            self._ur_delay_watches.add(watch)
        value = decode_delay_s(None if got is None else got[0], path)
        self._ur_worker.submit(partial(self._ur_deliver_delay, watch, value))

        def cancel() -> None:
            watch.active = False
            with self._ur_mutex:
                self._ur_delay_watches.discard(watch)

        return cancel

    def _ur_rearm_delay(self, watch: _DelayWatch) -> None:
        watch.retry_pending = False
        if not watch.active:
            return
        path = self.paths.ur_lost_bookie_recovery_delay
        try:
            got = self._ur_watch(path, watch.wake)
            value = decode_delay_s(None if got is None else got[0], path)
        except StoreClosedError:
            return
        except InvalidMetadataError as e:
            log.error("%s (ignored until it is fixed)", e)
            return
        except MetadataError as e:
            if not watch.retry_pending:
                watch.retry_pending = True
                log.warning("could not re-arm the lost bookie recovery delay watch (%s); retrying", e)
                self._ur_worker.submit_later(RETRY_S, partial(self._ur_rearm_delay, watch))
            return
        self._ur_deliver_delay(watch, value)

    @staticmethod
    def _ur_deliver_delay(watch: _DelayWatch, value: int) -> None:
        if not watch.active or value == watch.last:
            return
        watch.last = value
        try:
            watch.callback(value)
        except Exception:
            log.exception("lost bookie recovery delay callback %r failed", watch.callback)

    # -- auditor election --------------------------------------------------------------------------
    def elect_auditor(self, candidate_id: str, on_change: ElectionCallback) -> Callable[[], None]:
        """BookKeeper's AuditorElector: an ephemeral sequential vote; the lowest is the auditor and
        every other candidate watches the vote just below its own (no herd when one goes).

        The first vote is cast in the caller's thread (ZooKeeper down or no cluster is the caller's
        error); everything after, and every ``on_change`` call, runs on the store's thread."""
        if not isinstance(candidate_id, str) or not candidate_id:
            raise ValueError(f"candidate id must be a non-empty string, got {candidate_id!r}")
        cand = _Candidate(candidate_id, on_change)
        cand.wake = lambda _event: self._ur_worker.submit(partial(self._ur_step, cand))
        with self._ur_mutex:
            self._ur_candidates.add(cand)
        try:
            self._ur_stand(cand)
        except BaseException:
            self._ur_withdraw(cand)
            if cand.uncertain:
                self._ur_worker.submit(partial(self._ur_remove_orphans_later, cand))
            raise
        self._ur_worker.submit(partial(self._ur_step, cand))
        return partial(self._ur_withdraw, cand)

    def current_auditor(self) -> str | None:
        election = self.paths.auditor_election
        names = ordered_votes(self._ur_children_many([election], watch=False)[0] or [])
        for name in names:  # the lowest may vanish between the listing and the read
            got = self._ur_get(f"{election}/{name}")
            if got is not None:
                return got[0].decode(errors="replace")
        return None

    def _ur_votes(self) -> list[str]:
        return ordered_votes(self._ur_children_many([self.paths.auditor_election], watch=False)[0] or [])

    def _ur_stand(self, cand: _Candidate) -> None:
        """Cast a vote for ``cand`` unless it has one (any thread; one creation at a time)."""
        with cand.stand_lock:
            if cand.vote is not None or cand.withdrawn:
                return
            if cand.uncertain:
                self._ur_remove_orphans(cand)
            prefix = f"{self.paths.auditor_election}/{UR_VOTE_PREFIX}"
            try:
                created = self._ur_create_path(prefix, cand.candidate_id.encode(), ephemeral=True, sequential=True)
            except MetadataUnavailableError:
                cand.uncertain = True  # the vote may exist, unknown to us: clear it before the next
                raise
            name = created.rsplit("/", 1)[1]
            with cand.lock:
                withdrawn = cand.withdrawn
                if not withdrawn:
                    cand.vote = name
        if withdrawn:
            self._ur_delete_vote(name)

    def _ur_remove_orphans(self, cand: _Candidate) -> None:
        """Delete votes of our session holding ``cand``'s id that no candidate of ours knows: left
        by a creation whose answer was lost, they would block the election while we live."""
        election = self.paths.auditor_election
        votes = self._ur_votes()  # waits for a connection: then the session is known
        session = self._ur_session()
        if session is None:
            raise MetadataUnavailableError("looking for orphan auditor votes: no ZooKeeper session")
        with self._ur_mutex:
            known = {c.vote for c in self._ur_candidates}
        for name in votes:
            if name in known:
                continue
            got = self._ur_get(f"{election}/{name}")
            if got is not None and got[2] == session and got[0] == cand.candidate_id.encode():
                self._ur_delete_vote(name)
        cand.uncertain = False

    def _ur_remove_orphans_later(self, cand: _Candidate) -> None:
        """Worker thread: :meth:`_ur_remove_orphans` for a candidacy that failed, until it worked."""
        try:
            self._ur_remove_orphans(cand)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not look for orphan auditor votes (%s); retrying in %g s", e, RETRY_S)
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_remove_orphans_later, cand))

    def _ur_delete_vote(self, name: str) -> None:
        try:
            self._ur_delete(f"{self.paths.auditor_election}/{name}")
        except NoNodeError:
            pass

    def _ur_step(self, cand: _Candidate) -> None:
        """Worker thread: stand if we have no vote, then see whether we lead; retry on errors."""
        cand.retry_pending = False
        if cand.withdrawn:
            return
        try:
            for _ in range(_RECHECKS_MAX):
                self._ur_stand(cand)
                if cand.withdrawn or self._ur_check(cand):
                    return
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("auditor election for %s: %s; retrying in %g s", cand.candidate_id, e, RETRY_S)
        if not cand.retry_pending and not cand.withdrawn:
            cand.retry_pending = True
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_step, cand))

    def _ur_check(self, cand: _Candidate) -> bool:
        """One look at the votes; True when settled (auditor, or watching our predecessor)."""
        vote = cand.vote
        if vote is None:
            return False
        votes = self._ur_votes()
        if vote not in votes:  # gone with a session we had not heard was lost yet
            with cand.lock:
                if cand.vote == vote:
                    cand.vote = None
            self._ur_tell(cand, False)
            return False
        index = votes.index(vote)
        if index == 0:
            self._ur_tell(cand, True)
            return True
        if self._ur_watch(f"{self.paths.auditor_election}/{votes[index - 1]}", cand.wake) is None:
            return False  # the one before us went meanwhile: look again
        self._ur_tell(cand, False)
        return True

    def _ur_lost(self, cand: _Candidate) -> None:
        """Worker thread: the session (and the vote with it) is gone; tell, then stand again."""
        with cand.lock:
            cand.vote = None
        self._ur_tell(cand, False)
        self._ur_step(cand)

    def _ur_tell(self, cand: _Candidate, is_auditor: bool) -> None:
        """Worker thread: tell ``on_change`` about a change of role (never twice the same)."""
        with cand.lock:
            if cand.is_auditor == is_auditor or (is_auditor and cand.withdrawn):
                return
            cand.is_auditor = is_auditor
        try:
            cand.on_change(is_auditor)
        except Exception:
            log.exception("auditor election callback %r failed", cand.on_change)

    def _ur_withdraw(self, cand: _Candidate) -> None:
        """Delete our vote (idempotent); the auditor is told False on the store's thread."""
        with cand.lock:
            if cand.withdrawn:
                return
            cand.withdrawn = True
            vote, cand.vote = cand.vote, None
        with self._ur_mutex:
            self._ur_candidates.discard(cand)
        self._ur_worker.submit(partial(self._ur_tell_withdrawn, cand))
        if vote is not None:
            self._ur_withdraw_vote(vote)

    def _ur_tell_withdrawn(self, cand: _Candidate) -> None:
        self._ur_tell(cand, False)

    def _ur_withdraw_vote(self, vote: str) -> None:
        """Delete a withdrawn candidate's vote, retrying in the background while ZooKeeper is
        unreachable: a vote left behind would keep the auditor's seat until our session ends."""
        try:
            self._ur_delete_vote(vote)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not delete auditor vote %s (%s); retrying in %g s", vote, e, RETRY_S)
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_withdraw_vote, vote))
