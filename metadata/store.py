"""The metadata store: one session on the cluster's metadata, and the stores on it.

A store is composed, not inherited: :attr:`MetadataStore.nodes` is the session's node layer
(:mod:`metadata.nodes`: ZooKeeper in :class:`metadata.zk.store.ZkMetadataStore`, the in-memory
twin in :class:`metadata.memory.store.InMemoryMetadataStore`), and on it, written once for both,

- :attr:`~MetadataStore.cluster` (:class:`~metadata.cluster.ClusterStore`): layout, instance id,
  bookie registrations and their watch, cookies, application data;
- :attr:`~MetadataStore.ledgers` (:class:`~metadata.ledgers.LedgerStore`): ledger metadata,
  ledger ids, ledger watches;
- :attr:`~MetadataStore.streams` (:class:`~metadata.streams.store.StreamStore`): namespaces,
  streams, segments, writer locks;
- :attr:`~MetadataStore.tenants` (:class:`~metadata.tenancy.store.TenantStore`): tenants and each
  namespace's tenant and grants;
- :attr:`~MetadataStore.underreplication`
  (:class:`~metadata.underreplication.store.UnderReplicationStore`): the re-replication queue, its
  switches and the auditor election.

The store itself only opens and closes the session and tells session listeners. A contract test
suite (tests/contract/) runs every store against both implementations so the twin cannot drift
from ZooKeeper's semantics (versions, ephemerals, sessions).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from metadata.cluster import ClusterStore
from metadata.layout import ZkLayout
from metadata.ledgers import LedgerStore
from metadata.nodes import Nodes
from metadata.session import SessionEvent, SessionListener
from metadata.streams.store import StreamStore
from metadata.tenancy.store import TenantStore
from metadata.underreplication.store import UnderReplicationStore
from metadata.watches import WatchKeeper

__all__ = ["MetadataStore", "SessionEvent", "SessionListener"]


class MetadataStore:
    """One session on the cluster's metadata (under ``paths.root``) and the stores on it. Every
    call of every store has a deadline: ZooKeeper down means
    :class:`~metadata.errors.MetadataUnavailableError`, never a hang."""

    def __init__(self, nodes: Nodes, paths: ZkLayout) -> None:
        self.nodes = nodes
        self.paths = paths
        self._watches = WatchKeeper(nodes)
        # Session listeners are told in the order they were added: the registrations are
        # re-created (cluster) before watches are re-armed and anyone else is told CONNECTED.
        self.cluster = ClusterStore(nodes, paths, self._watches)
        nodes.add_session_listener(self._watches.session_event)
        self.ledgers = LedgerStore(nodes, paths, self._watches)
        self.streams = StreamStore(nodes, paths)
        self.tenants = TenantStore(nodes, paths)
        self.underreplication = UnderReplicationStore(nodes, paths)

    def add_session_listener(self, callback: SessionListener) -> None:
        """Call ``callback(event)`` on a store thread for each CONNECTED/SUSPENDED/LOST event.

        After a LOST, CONNECTED is reported once the registrations were re-created.
        """
        self.nodes.add_session_listener(callback)

    def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and stop background threads. Idempotent."""
        if self._wind_down(tell=True):
            self.nodes.end()

    def _wind_down(self, *, tell: bool) -> bool:
        """Refuse further calls and stop the stores' work (``tell``: the auditor is told it no
        longer is); False if the store was closed already."""
        if not self.nodes.close_session():
            return False
        self.cluster.close()
        self.underreplication.close(tell=tell)
        self._watches.close()
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
