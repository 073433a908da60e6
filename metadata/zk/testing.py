"""Fault injection for tests: expire a ZooKeeper session as a long network partition would.

Lives here so that kazoo stays imported only under metadata/zk/ (tests included).
"""

from __future__ import annotations

from kazoo.client import KazooClient

from metadata.store import MetadataStore
from metadata.zk.nodes import ZkNodes


def expire_session(store: MetadataStore, timeout_s: float = 10.0) -> None:
    """Close the store's session from a second client that reuses its id and password: the server
    expires it, and the store sees LOST on its next contact and must build a new session."""
    nodes = store.nodes
    if not isinstance(nodes, ZkNodes):
        raise TypeError(f"expire_session needs a store on ZooKeeper, not on {type(nodes).__name__}")
    client_id = nodes.client_id
    if client_id is None:
        raise RuntimeError("the store has no session to expire")
    twin = KazooClient(hosts=nodes.connect_info.hosts_string, client_id=client_id, timeout=timeout_s)
    twin.start(timeout=timeout_s)
    twin.stop()
    twin.close()
