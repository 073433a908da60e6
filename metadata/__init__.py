"""Cluster metadata: the ledger metadata model (:mod:`metadata.model`), its pure transitions
(:mod:`metadata.transitions`), the one CAS update loop (:func:`update_ledger`), and the metadata
store (:mod:`metadata.store`): the cluster, ledger, stream and under-replication stores composed on
one node layer, with a ZooKeeper implementation and an in-memory twin.

Imports nothing else of the project. kazoo is imported only under ``metadata.zk`` and only when a
ZooKeeper store is actually made, so the pure parts (layout, errors, the in-memory twin) stay cheap.
"""

from __future__ import annotations

from metadata import transitions
from metadata.cluster import ClusterStore
from metadata.errors import (
    BadVersionError,
    InvalidConnectStringError,
    InvalidMetadataError,
    LedgerAlreadyClosedError,
    LedgerClosedConflict,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    StoreClosedError,
)
from metadata.layout import ConnectInfo, ZkLayout, parse_connect_string
from metadata.ledgers import LedgerStore
from metadata.memory import InMemoryMetadataStore, InMemoryZooKeeper
from metadata.model import DigestType, LedgerMetadata, LedgerState, decode, encode, master_key
from metadata.nodes import Nodes
from metadata.session import SessionEvent, SessionListener
from metadata.store import MetadataStore
from metadata.streams.store import StreamStore
from metadata.tls import ZkTls, ZkTlsError
from metadata.transitions import begin_recovery, close, replace_bookie, set_fragment, unchanged
from metadata.underreplication import ElectionCallback, UnderReplicationStore
from metadata.update import update_ledger

__all__ = [
    "BadVersionError",
    "ClusterStore",
    "ConnectInfo",
    "DigestType",
    "ElectionCallback",
    "InMemoryMetadataStore",
    "InMemoryZooKeeper",
    "InvalidConnectStringError",
    "InvalidMetadataError",
    "LedgerAlreadyClosedError",
    "LedgerClosedConflict",
    "LedgerMetadata",
    "LedgerState",
    "LedgerStore",
    "MetadataAccessDeniedError",
    "MetadataError",
    "MetadataStore",
    "MetadataUnavailableError",
    "MetadataUpdateConflictError",
    "NoNodeError",
    "NodeExistsError",
    "Nodes",
    "SessionEvent",
    "SessionExpiredError",
    "SessionListener",
    "StoreClosedError",
    "StreamStore",
    "UnderReplicationStore",
    "ZkLayout",
    "ZkTls",
    "ZkTlsError",
    "begin_recovery",
    "close",
    "connect",
    "decode",
    "encode",
    "master_key",
    "parse_connect_string",
    "replace_bookie",
    "set_fragment",
    "transitions",
    "unchanged",
    "update_ledger",
]

MEMORY_SCHEME = "memory://"


def connect(
    connect_string: str,
    *,
    session_timeout_ms: int = 10000,
    connect_timeout_ms: int = 15000,
    op_timeout_ms: int | None = None,
    zk_auth: str | None = None,
    zk_tls: ZkTls | None = None,
    zk_member_auth: str | None = None,
) -> MetadataStore:
    """Open a store for a connect string: ``host:port[,...][/root]`` or ``zk://...`` for ZooKeeper,
    ``memory://NAME[/root]`` for the process-wide in-memory ensemble NAME (tests, notebooks).

    Raises InvalidConnectStringError for a malformed string and MetadataUnavailableError when
    ZooKeeper cannot be reached within ``connect_timeout_ms``. ``zk_auth`` (``user:password``)
    authenticates the session and puts a digest ACL on every node it creates (the in-memory twin
    has no ACLs and ignores it). ``zk_tls``: the session goes to ZooKeeper's secure client port
    over TLS (ZkTlsError at once when its files do not load; the twin ignores it).
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
        zk_auth=zk_auth,
        zk_tls=zk_tls,
        zk_member_auth=zk_member_auth,
    )
