"""Cluster metadata: the store interface, its ZooKeeper implementation and an in-memory twin.

Imports nothing else of the project. kazoo is imported only under ``metadata.zk`` and only when a
ZooKeeper store is actually made, so the pure parts (layout, errors, the in-memory twin) stay cheap.
"""

from __future__ import annotations

from metadata.errors import (
    BadVersionError,
    InvalidConnectStringError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    StoreClosedError,
)
from metadata.layout import ConnectInfo, ZkLayout, parse_connect_string
from metadata.memory import InMemoryMetadataStore, InMemoryZooKeeper
from metadata.store import MetadataStore, SessionEvent, SessionListener

__all__ = [
    "BadVersionError",
    "ConnectInfo",
    "InMemoryMetadataStore",
    "InMemoryZooKeeper",
    "InvalidConnectStringError",
    "MetadataError",
    "MetadataStore",
    "MetadataUnavailableError",
    "NoNodeError",
    "NodeExistsError",
    "SessionEvent",
    "SessionExpiredError",
    "SessionListener",
    "StoreClosedError",
    "ZkLayout",
    "connect",
    "parse_connect_string",
]

MEMORY_SCHEME = "memory://"


def connect(
    connect_string: str,
    *,
    session_timeout_ms: int = 10000,
    connect_timeout_ms: int = 15000,
    op_timeout_ms: int | None = None,
) -> MetadataStore:
    """Open a store for a connect string: ``host:port[,...][/root]`` or ``zk://...`` for ZooKeeper,
    ``memory://NAME[/root]`` for the process-wide in-memory ensemble NAME (tests, notebooks).

    Raises InvalidConnectStringError for a malformed string and MetadataUnavailableError when
    ZooKeeper cannot be reached within ``connect_timeout_ms``.
    """
    if connect_string.startswith(MEMORY_SCHEME):
        name, _, root = connect_string[len(MEMORY_SCHEME) :].partition("/")
        info = parse_connect_string(f"127.0.0.1:1/{root}")  # reuse the root rules only
        return InMemoryMetadataStore(InMemoryZooKeeper.named(name or "default"), root=info.root)
    from metadata.zk.store import ZkMetadataStore

    return ZkMetadataStore(
        connect_string,
        session_timeout_ms=session_timeout_ms,
        connect_timeout_ms=connect_timeout_ms,
        op_timeout_ms=op_timeout_ms,
    )
