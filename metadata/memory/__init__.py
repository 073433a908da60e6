"""The in-memory twin of ZooKeeper: the fake ensemble (`tree`), its node layer (`nodes`) and the
store on it (`store`)."""

from metadata.memory.store import InMemoryMetadataStore
from metadata.memory.tree import InMemoryZooKeeper

__all__ = ["InMemoryMetadataStore", "InMemoryZooKeeper"]
