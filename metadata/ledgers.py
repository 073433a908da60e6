"""Ledger metadata (``store.ledgers``): one node per ledger under BookKeeper's hierarchical path
(:meth:`metadata.layout.ZkLayout.ledger`), its ids, and watches on it.

Written once on the node layer (:mod:`metadata.nodes`), for ZooKeeper and the in-memory twin.
Versions are znode versions (0 on create, +1 per write) and every change takes the version it was
based on, which is how invariant 5 (every change is a CAS) is enforced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from metadata.errors import (
    BadVersionError,
    MetadataAccessDeniedError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from metadata.group_commit import GroupCommit
from metadata.idgen import LedgerIdGenerator
from metadata.layout import DELETED, ZkLayout, is_bucket_name, is_ledger_node_name, ledger_path_components
from metadata.model import TOMBSTONE, LedgerMetadata, decode, encode
from metadata.nodes import Nodes, NodeStat, Op
from metadata.watches import LedgerWatch, LedgerWatchCallback, LedgerWatchState, WatchKeeper

_BATCH = 256  # outstanding requests per round trip when walking the ledger tree
_LIST_BATCH = 4  # bucket listings per round trip (up to 10,000 names each: bounded memory)
#: A changed bucket is listed (one request, ~9 bytes a child) rather than read ledger by ledger
#: (one request and ~250 bytes each) once it holds fewer than this many children per ledger asked.
_LIST_RATIO = 32


@dataclass
class LedgerPresence:
    """What a bookie's GC remembers of the ledger tree between rounds (:meth:`LedgerStore.missing_ledgers`).

    Per leaf bucket (``<root>/000/0000/0000/0000``, up to 10,000 ledger nodes) holding ledgers the
    bookie asked about: the bucket's children stamp (:attr:`metadata.nodes.NodeStat.children_stamp`)
    taken *before* its ledgers were last checked, and the ones found then. While the stamp stays
    the same no child of the bucket was created or deleted, so those ledgers still exist. Memory is
    one entry per such bucket and one id per such ledger: nothing of the ledgers it does not hold.

    ``session`` is the session that took the stamps: a new session (after an expiry, possibly onto
    an ensemble restored from a backup, whose counters went back) starts over with a full check,
    as does a fresh presence. ``requests`` and ``nodes_read`` (stats, nodes read and names listed)
    are what the last call cost, and ``full`` whether it was a full check.
    """

    session: int | None = None
    buckets: dict[str, tuple[tuple[int, int], frozenset[int]]] = field(default_factory=dict)
    requests: int = 0
    nodes_read: int = 0
    full: bool = True


class LedgerStore:
    """Ledger metadata operations. Every call has a deadline: ZooKeeper down means
    :class:`~metadata.errors.MetadataUnavailableError`, never a hang."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, watches: WatchKeeper) -> None:
        self._nodes = nodes
        self._paths = paths
        self._watches = watches
        self.id_generator = LedgerIdGenerator(nodes, paths)
        self._creates: GroupCommit[tuple[int, bytes], int] = GroupCommit(self._create_batch)
        self._writes: GroupCommit[tuple[int, bytes, int], int] = GroupCommit(self._write_batch)

    # -- ids ------------------------------------------------------------------------------------
    def ledger_ids(self) -> set[int]:
        """Every ledger that has a metadata node. Complete or an exception, never partial: tools
        act on what it leaves out (a bookie's GC asks :meth:`missing_ledgers` instead)."""
        root = self._paths.root
        with self._nodes.deadline():
            if self._nodes.get(root) is None:
                raise NoNodeError(f"no cluster at {root}: run `spark-bookie init` first")
            level = [root]
            for depth in range(4):
                level = [f"{parent}/{name}" for parent, names in self._children_many(level) for name in names
                         if is_bucket_name(depth, name)]
            return {self._paths.ledger_id(f"{parent}/{name}") for parent, names in self._children_many(level)
                    for name in names if is_ledger_node_name(name)}

    def _children_many(self, parents: list[str]) -> list[tuple[str, list[str]]]:
        """Children of many nodes, ``_BATCH`` requests per round trip; vanished nodes have none
        (deleted while we walked: they had no ledgers any more)."""
        out: list[tuple[str, list[str]]] = []
        for i in range(0, len(parents), _BATCH):
            chunk = parents[i : i + _BATCH]
            out += [(parent, names) for parent, names in zip(chunk, self._nodes.children_many(chunk), strict=True)
                    if names is not None]
        return out

    # -- existence (a bookie's GC) --------------------------------------------------------------
    def missing_ledgers(self, ledger_ids: Iterable[int], since: LedgerPresence | None = None) -> set[int]:
        """Which of ``ledger_ids`` have no metadata node, or a tombstone: complete or an exception,
        never partial (the bookie's GC deletes the data of what this returns).

        It asks about these ledgers only, never lists the cluster: a bookie's GC then costs in
        proportion to the ledgers it holds, not to every ledger in the cluster. Without ``since``
        every ledger's node is read (``_BATCH`` per round trip). With ``since``, which the caller
        keeps between calls (:class:`LedgerPresence`), only what changed is: each leaf bucket of
        the ledgers asked about is stat'ed (one small request per bucket, pipelined); where its
        children stamp is the one remembered only ledgers not confirmed then are read; a changed
        bucket has its ledgers read, or is listed once if that is cheaper (``_LIST_RATIO``). The
        first call on a presence, or the first in a new session, reads every ledger (a full check,
        which also sees tombstones). A listing does not tell a tombstone from a ledger: tombstoned
        nodes are removed by :meth:`reap_deleted`, which each bookie's GC runs before this, and
        that removal changes their bucket.
        """
        memo = since if since is not None else LedgerPresence()
        memo.requests = memo.nodes_read = 0
        groups: dict[str, set[int]] = {}
        for lid in ledger_ids:
            groups.setdefault(self._paths.ledger(lid).rsplit("/", 1)[0], set()).add(lid)
        if since is None:
            return self._read_missing([lid for ids in groups.values() for lid in ids], memo)
        session = self._nodes.session()
        memo.full = memo.session is None or memo.session != session
        paths = sorted(groups)
        stats = self._stat_buckets(paths, memo)   # FIRST: a stamp older than the check is safe
        missing: set[int] = set()
        to_read: list[int] = []
        to_list: list[str] = []
        for path, stat in zip(paths, stats, strict=True):
            known = None if memo.full else memo.buckets.get(path)
            if stat is None:   # the bucket is gone, and every ledger node in it
                missing |= groups[path]
            elif known is not None and known[0] == stat.children_stamp:
                to_read += groups[path] - known[1]
            elif memo.full or len(groups[path]) * _LIST_RATIO < stat.children:
                to_read += groups[path]
            else:
                to_list.append(path)
        missing |= self._read_missing(to_read, memo)
        missing |= self._list_missing(to_list, groups, memo)
        memo.buckets = {path: (stat.children_stamp, frozenset(groups[path] - missing))
                        for path, stat in zip(paths, stats, strict=True)
                        if stat is not None and groups[path] - missing}
        memo.session = session
        return missing

    def _stat_buckets(self, paths: list[str], memo: LedgerPresence) -> list[NodeStat | None]:
        out: list[NodeStat | None] = []
        for i in range(0, len(paths), _BATCH):
            out += self._nodes.stat_many(paths[i : i + _BATCH])
        memo.requests += len(paths)
        memo.nodes_read += len(paths)
        return out

    def _read_missing(self, ledger_ids: list[int], memo: LedgerPresence) -> set[int]:
        missing: set[int] = set()
        for i in range(0, len(ledger_ids), _BATCH):
            chunk = ledger_ids[i : i + _BATCH]
            missing.update(lid for lid, got in zip(chunk, self.read_ledger_nodes(chunk), strict=True) if got is None)
        memo.requests += len(ledger_ids)
        memo.nodes_read += len(ledger_ids)
        return missing

    def _list_missing(self, paths: list[str], groups: dict[str, set[int]], memo: LedgerPresence) -> set[int]:
        missing: set[int] = set()
        for i in range(0, len(paths), _LIST_BATCH):
            chunk = paths[i : i + _LIST_BATCH]
            for path, names in zip(chunk, self._nodes.children_many(chunk), strict=True):
                present = set(names or ())
                missing.update(lid for lid in groups[path] if ledger_path_components(lid)[4] not in present)
                memo.nodes_read += len(present)
        memo.requests += len(paths)
        return missing

    def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending (complete or an exception, like :meth:`ledger_ids`)."""
        return sorted(self.ledger_ids())

    def generate_ledger_id(self) -> int:
        """A new ledger id: positive, never handed out before in this cluster, roughly increasing.

        NoNodeError if the cluster was never initialised.
        """
        return self.id_generator.next_id()

    # -- the raw nodes -------------------------------------------------------------------------
    def create_ledger_node(self, ledger_id: int, data: bytes) -> int:
        """Create the ledger's metadata node (NodeExistsError if present); returns its version (0).
        Creates that threads of this session ask for together go as one multi-op (group_commit)."""
        return self._creates.submit((ledger_id, data))

    def _create_batch(self, items: list[tuple[int, bytes]]) -> list[int | BaseException]:
        ops = [Op("create", self._paths.ledger(lid), data) for lid, data in items]
        return self._multi_each(ops, lambda i: self._create_one(*items[i]), lambda i: 0)

    def _create_one(self, ledger_id: int, data: bytes) -> int:
        path = self._paths.ledger(ledger_id)
        try:
            self._nodes.create(path, data, makepath=True, retry=False)
        except NodeExistsError as e:
            raise NodeExistsError(f"ledger {ledger_id} already exists ({path})") from e
        return 0

    def read_ledger_node(self, ledger_id: int) -> tuple[bytes, int] | None:
        """``(data, version)`` of the ledger's metadata node, or None."""
        return self.read_ledger_nodes([ledger_id])[0]

    def read_ledger_nodes(self, ledger_ids: Sequence[int]) -> list[tuple[bytes, int] | None]:
        """read_ledger_node for many ledgers, in order, in one round trip (a scan of every ledger,
        the auditor's, then costs one round trip per batch, not one per ledger)."""
        got = self._nodes.get_many([self._paths.ledger(lid) for lid in ledger_ids])
        return [None if g is None or g[0].startswith(TOMBSTONE) else (g[0], g[1]) for g in got]

    def write_ledger_node(self, ledger_id: int, data: bytes, version: int) -> int:
        """CAS-update the ledger's metadata node; returns the new version.

        BadVersionError if the node is not at ``version``, NoNodeError if it does not exist.
        Writes that threads of this session ask for together go as one multi-op (group_commit).
        """
        if version < 0:
            return self._write_one(ledger_id, data, version)
        return self._writes.submit((ledger_id, data, version))

    def _write_batch(self, items: list[tuple[int, bytes, int]]) -> list[int | BaseException]:
        ops = [Op("set", self._paths.ledger(lid), data, version) for lid, data, version in items]
        return self._multi_each(ops, lambda i: self._write_one(*items[i]), lambda i: items[i][2] + 1)

    def _multi_each(self, ops: list[Op], alone: Callable[[int], int],
                    applied: Callable[[int], int]) -> list[int | BaseException]:
        """Each op's outcome, the ops sent as one multi: a multi is all or nothing, so the op that
        failed it is done alone (which gives it its own exact answer, or makes a missing bucket)
        and the rest are sent again. ``applied(i)``: op i's result when the multi was applied."""
        out: list[int | BaseException] = [0] * len(ops)
        pending = list(range(len(ops)))
        while len(pending) > 1:
            failed = self._nodes.multi([[ops[i] for i in pending]], retry=False)[0]
            if failed is None:
                for i in pending:
                    out[i] = applied(i)
                return out
            if failed.index < 0:
                break
            j = pending.pop(failed.index)
            out[j] = _outcome(alone, j)
        for i in pending:
            out[i] = _outcome(alone, i)
        return out

    def _write_one(self, ledger_id: int, data: bytes, version: int) -> int:
        path = self._paths.ledger(ledger_id)
        try:
            return self._nodes.set(path, data, version, retry=False)
        except BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e
        except NoNodeError as e:
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})") from e

    def delete_ledger_node(self, ledger_id: int, version: int = -1) -> None:
        """Delete the ledger's metadata node (CAS unless ``version=-1``); NoNodeError if absent."""
        path = self._paths.ledger(ledger_id)
        try:
            self._nodes.delete(path, version, retry=False)
        except MetadataAccessDeniedError:
            if not self._nodes.tenant_acls_active():
                raise
            self._mark_deleted(ledger_id, path, version)
        except NoNodeError as e:
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})") from e
        except BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e
        except NotEmptyError as e:
            raise MetadataError(f"ledger {ledger_id} has children ({path})") from e

    def _mark_deleted(self, ledger_id: int, path: str, version: int) -> None:
        """A role may write its ledger's node but not delete it (ZooKeeper checks a delete against
        the parent, which every member shares): write the tombstone, which every reader takes for
        absent, and leave a marker for a bookie to remove the node (:meth:`reap_deleted`)."""
        got = self._nodes.get(path)
        if got is None:
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})")
        if got[0].startswith(TOMBSTONE):
            # A retry after the marker's create failed: leave it now, or no bookie reaps the node
            # (and a GC that lists the node's bucket would keep the ledger's data).
            self._leave_marker(ledger_id)
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})")
        try:
            self._nodes.set(path, TOMBSTONE, got[1] if version < 0 else version, retry=False)
        except BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e
        self._leave_marker(ledger_id)

    def _leave_marker(self, ledger_id: int) -> None:
        try:
            self._nodes.create(f"{self._paths.root}/{DELETED}/{ledger_id}", makepath=True)
        except NodeExistsError:
            pass

    def reap_deleted(self) -> int:
        """Remove the nodes of ledgers marked deleted (a bookie's GC does, as the superuser); a
        marker naming a ledger that is not a tombstone is dropped. How many nodes went."""
        parent = f"{self._paths.root}/{DELETED}"
        reaped = 0
        for name in self._nodes.children(parent) or []:
            try:
                lid = int(name)
                got = self._nodes.get(self._paths.ledger(lid))
                if got is not None and got[0].startswith(TOMBSTONE):
                    self._nodes.delete(self._paths.ledger(lid), got[1], retry=False)
                    reaped += 1
                self._nodes.delete(f"{parent}/{name}", retry=False)
            except (ValueError, NoNodeError, BadVersionError, NotEmptyError):
                continue
        return reaped

    # -- typed metadata (the raw nodes hold :func:`metadata.model.encode` bytes) -----------------
    def create_ledger_metadata(self, md: LedgerMetadata) -> int:
        """Store a new ledger's metadata; returns its version (0). NodeExistsError if the id is taken."""
        return self.create_ledger_node(md.ledger_id, encode(md))

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """``(metadata, version)``; NoNodeError if the ledger does not exist, InvalidMetadataError
        if its node cannot be decoded."""
        got = self.read_ledger_node(ledger_id)
        if got is None:
            raise NoNodeError(f"ledger {ledger_id} does not exist")
        return decode(got[0], ledger_id), got[1]

    def read_ledger_metadata_many(self, ledger_ids: Sequence[int]) -> list[tuple[LedgerMetadata, int] | None]:
        """read_ledger_metadata for many ledgers, in order; None for one that does not exist."""
        return [None if got is None else (decode(got[0], lid), got[1])
                for lid, got in zip(ledger_ids, self.read_ledger_nodes(ledger_ids), strict=True)]

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        """CAS-replace the ledger's metadata (BadVersionError if it moved on); returns the new version.

        Use :func:`metadata.update.update_ledger` rather than calling this directly: it retries
        lost races through the transition that decides what may change.
        """
        if version < 0:
            raise ValueError(f"ledger metadata is only written by compare-and-set, got version {version}")
        return self.write_ledger_node(md.ledger_id, encode(md), version)

    def delete_ledger_metadata(self, ledger_id: int, version: int = -1) -> None:
        """Delete the ledger's metadata (CAS unless ``version=-1``); NoNodeError if absent."""
        self.delete_ledger_node(ledger_id, version)

    def watch_ledger_metadata(self, ledger_id: int, callback: LedgerWatchCallback) -> Callable[[], None]:
        """Call ``callback(metadata, version)`` now and on every later change of the ledger.

        ``(None, -1)`` is reported once when the ledger does not exist or is deleted, and ends the
        watch. Callbacks run on the store's watch thread (never the ZooKeeper client's), one at a
        time, in order; they survive reconnections and session loss. Returns a cancel function
        (idempotent) after which no callback starts. Raises MetadataUnavailableError if the watch
        could not be set within the store's deadline.
        """
        state = LedgerWatchState(ledger_id, callback)
        return self._watches.start(LedgerWatch(self._watches, state, self._paths.ledger(ledger_id)))


def _outcome(fn: Callable[[int], int], i: int) -> int | BaseException:
    """``fn(i)``, or the metadata error it raised (a batched request's own answer)."""
    try:
        return fn(i)
    except MetadataError as e:
        return e
