"""The ZooKeeper implementation of the metadata store's node layer: the only package that imports kazoo."""

from metadata.zk.store import ZkMetadataStore

__all__ = ["ZkMetadataStore"]
