"""Under-replication queue and auditor election, as one sub-package: the interface (`interface`,
re-exported here), the implementation both backends share (`base`, with `election`, `records`,
`view`), and the in-memory twin (`memory`). The ZooKeeper backend is `metadata.zk.underreplication`
(kazoo stays under `metadata/zk/`)."""

from metadata.underreplication.interface import ElectionCallback, UnderReplicationStore

__all__ = ["ElectionCallback", "UnderReplicationStore"]
