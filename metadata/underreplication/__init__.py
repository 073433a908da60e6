"""Under-replication queue and auditor election (``store.underreplication``), as one sub-package:
the store (`store`, with its `switches` and `election`), the record formats (`records`), the
cached picture of the queue (`view`) and node creation with parents (`paths`), all written once
on the node layer (:mod:`metadata.nodes`)."""

from metadata.underreplication.election import ElectionCallback
from metadata.underreplication.store import UnderReplicationStore

__all__ = ["ElectionCallback", "UnderReplicationStore"]
