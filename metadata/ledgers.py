"""Ledger metadata (``store.ledgers``): one node per ledger under BookKeeper's hierarchical path
(:meth:`metadata.layout.ZkLayout.ledger`), its ids, and watches on it.

Written once on the node layer (:mod:`metadata.nodes`), for ZooKeeper and the in-memory twin.
Versions are znode versions (0 on create, +1 per write) and every change takes the version it was
based on, which is how invariant 5 (every change is a CAS) is enforced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from metadata.errors import (
    BadVersionError,
    MetadataAccessDeniedError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from metadata.idgen import LedgerIdGenerator
from metadata.layout import DELETED, ZkLayout, is_bucket_name, is_ledger_node_name
from metadata.model import TOMBSTONE, LedgerMetadata, decode, encode
from metadata.nodes import Nodes
from metadata.watches import LedgerWatch, LedgerWatchCallback, LedgerWatchState, WatchKeeper

_BATCH = 256  # outstanding requests per round trip when walking the ledger tree


class LedgerStore:
    """Ledger metadata operations. Every call has a deadline: ZooKeeper down means
    :class:`~metadata.errors.MetadataUnavailableError`, never a hang."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, watches: WatchKeeper) -> None:
        self._nodes = nodes
        self._paths = paths
        self._watches = watches
        self.id_generator = LedgerIdGenerator(nodes, paths)

    # -- ids ------------------------------------------------------------------------------------
    def ledger_ids(self) -> set[int]:
        """Every ledger that has a metadata node. Complete or an exception, never partial:
        the bookie's garbage collector deletes data of ledgers missing from this set."""
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
        """Create the ledger's metadata node (NodeExistsError if present); returns its version (0)."""
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
        """
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
        if got is None or got[0].startswith(TOMBSTONE):
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})")
        try:
            self._nodes.set(path, TOMBSTONE, got[1] if version < 0 else version, retry=False)
        except BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e
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
