"""ZooKeeper primitives for stream metadata (kazoo).

The protocol is :class:`~metadata.streams.base.StreamsBase`; this mixin of
:class:`~metadata.zk.store.ZkMetadataStore` maps its primitives onto the store's kazoo requests
(the under-replication mixin's, where they are the same) and ZooKeeper's multi-op.
"""

from __future__ import annotations

from typing import Any

from kazoo import exceptions as kz

from metadata.errors import MetadataError
from metadata.streams.base import MultiOpFailed, NodeState, StOp, StreamsBase
from metadata.zk.underreplication import ZkUnderReplication, _translate


class ZkStreams(StreamsBase, ZkUnderReplication):
    """Mixin: the ZooKeeper store's requests (``_call``, ``_gather``, ``_client``) through the
    under-replication mixin's node primitives."""

    def _st_get_many(self, paths: list[str]) -> list[NodeState | None]:
        return self._ur_get_many(paths)

    def _st_children(self, path: str) -> list[str] | None:
        return self._ur_children_many([path], watch=False)[0]

    def _st_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        return self._ur_create(path, data, ephemeral=ephemeral, sequential=sequential)

    def _st_set(self, path: str, data: bytes, version: int) -> int:
        return self._ur_set(path, data, version)

    def _st_delete(self, path: str, version: int = -1) -> None:
        self._ur_delete(path, version, retry=False)

    def _st_watch(self, path: str, wake: object) -> NodeState | None:
        return self._ur_watch(path, wake)  # type: ignore[arg-type]

    def _st_multi(self, ops: list[StOp]) -> None:
        def start() -> Any:
            tx = self._client.transaction()
            for op in ops:
                if op.kind == "create":
                    tx.create(op.path, op.data)
                elif op.kind == "set":
                    tx.set_data(op.path, op.data, version=op.version)
                elif op.kind == "delete":
                    tx.delete(op.path, version=op.version)
                elif op.kind == "check":
                    tx.check(op.path, version=op.version)
                else:
                    raise ValueError(f"unknown multi op {op.kind!r}")
            return tx.commit_async()

        outcome = self._call("stream metadata change", start, idempotent=False)
        if isinstance(outcome, kz.ZookeeperError):
            raise MetadataError(f"stream metadata change refused: {outcome!r}")
        for i, (op, result) in enumerate(zip(ops, outcome, strict=True)):
            if isinstance(result, kz.RolledBackError):
                continue
            if isinstance(result, kz.ZookeeperError):
                error = _translate(result, op.path)
                if type(error) is MetadataError:
                    raise error
                raise MultiOpFailed(i, error)
