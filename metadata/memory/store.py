"""The in-memory twin of the ZooKeeper store, for fast tests of everything above the metadata layer.

The stores on it are the very ones ZooKeeper's store has (:mod:`metadata.store`); only the node
layer differs (:class:`~metadata.memory.nodes.MemoryNodes` on a fake ensemble). The same contract
tests run against it and against a real ZooKeeper.
"""

from __future__ import annotations

from metadata.layout import ZkLayout
from metadata.memory.nodes import MemoryNodes
from metadata.memory.tree import InMemoryZooKeeper
from metadata.store import MetadataStore


class InMemoryMetadataStore(MetadataStore):
    """:class:`~metadata.store.MetadataStore` on an :class:`InMemoryZooKeeper`; one fake session.

    Test hooks: :meth:`expire_session` (server-side expiry, like ZooKeeper's), :meth:`crash` (the
    process dies: the session lingers until its timeout) and ``zk.set_available(False)``.
    """

    nodes: MemoryNodes

    def __init__(self, zk: InMemoryZooKeeper | None = None, *, root: str = "/ledgers") -> None:
        self.zk = zk if zk is not None else InMemoryZooKeeper()
        super().__init__(MemoryNodes(self.zk), ZkLayout(root))

    def __repr__(self) -> str:
        return f"InMemoryMetadataStore(session={self.nodes.session()}, root={self.paths.root})"

    def expire_session(self) -> None:
        """Expire this store's session now (ephemerals vanish, LOST, then a new session)."""
        session = self.nodes.session()
        if session is not None:
            self.zk.expire_session(session)

    def crash(self) -> None:
        """Simulate the owning process dying: no more calls, nodes live until the session times out."""
        if self._wind_down(tell=False):
            self.nodes.crash()
