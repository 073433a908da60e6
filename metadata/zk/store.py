"""The ZooKeeper metadata store: the stores of :mod:`metadata.store` on a kazoo session
(:class:`~metadata.zk.nodes.ZkNodes`)."""

from __future__ import annotations

from metadata.layout import ZkLayout, parse_connect_string
from metadata.store import MetadataStore
from metadata.tls import ZkTls
from metadata.zk.nodes import ZkNodes


class ZkMetadataStore(MetadataStore):
    """:class:`~metadata.store.MetadataStore` on a ZooKeeper ensemble; one kazoo session per store.

    ``op_timeout_ms`` (default: the session timeout) bounds every call, waiting for a connection
    included. Reads are retried on connection loss within that deadline; a write that loses its
    connection raises MetadataUnavailableError because its outcome is unknown. ``zk_auth``
    (``user:password``) authenticates the session and puts a digest ACL on every node it creates;
    ``zk_tls`` puts the session on TLS (ZooKeeper's secure client port).
    """

    nodes: ZkNodes

    def __init__(
        self,
        connect_string: str,
        *,
        session_timeout_ms: int = 10000,
        connect_timeout_ms: int = 15000,
        op_timeout_ms: int | None = None,
        zk_auth: str | None = None,
        zk_tls: ZkTls | None = None,
        zk_member_auth: str | None = None,
    ) -> None:
        info = parse_connect_string(connect_string)
        self.connect_info = info
        super().__init__(ZkNodes(info, session_timeout_ms=session_timeout_ms, op_timeout_ms=op_timeout_ms,
                                 zk_auth=zk_auth, zk_tls=zk_tls, zk_member_auth=zk_member_auth),
                         ZkLayout(info.root))
        try:
            self.nodes.start(connect_timeout_ms)
        except BaseException:
            self._wind_down(tell=False)
            self.nodes.worker.close()
            raise

    def __repr__(self) -> str:
        return f"ZkMetadataStore({self.connect_info.hosts_string}{self.paths.root})"
