"""The in-memory twin's primitives for stream metadata.

The protocol is :class:`~metadata.streams.base.StreamsBase`; this mixin of
:class:`~metadata.memory.InMemoryMetadataStore` maps its primitives onto the fake ensemble's tree
through the under-replication mixin's node primitives, and checks a multi-op against the tree
before applying any of it, as ZooKeeper does.
"""

from __future__ import annotations

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.streams.base import MultiOpFailed, NodeState, StOp, StreamsBase
from metadata.underreplication.memory import InMemoryUnderReplication


class InMemoryStreams(StreamsBase, InMemoryUnderReplication):
    """Mixin: the in-memory store's tree (``zk``) and session."""

    def _st_get_many(self, paths: list[str]) -> list[NodeState | None]:
        return self._ur_get_many(paths)

    def _st_children(self, path: str) -> list[str] | None:
        return self._ur_children_many([path], watch=False)[0]

    def _st_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        return self._ur_create(path, data, ephemeral=ephemeral, sequential=sequential)

    def _st_set(self, path: str, data: bytes, version: int) -> int:
        return self._ur_set(path, data, version)

    def _st_delete(self, path: str, version: int = -1) -> None:
        self._ur_delete(path, version)

    def _st_watch(self, path: str, wake: object) -> NodeState | None:
        return self._ur_watch(path, wake)  # type: ignore[arg-type]

    def _st_multi(self, ops: list[StOp]) -> None:
        with self.zk.lock:
            self._check("stream metadata change")
            self.zk.check_available("stream metadata change")
            failed = self._first_failure(ops)
            if failed is not None:
                raise MultiOpFailed(*failed)
            for op in ops:
                if op.kind == "create":
                    self.zk.create(op.path, op.data)
                elif op.kind == "set":
                    self.zk.set(op.path, op.data, op.version)
                elif op.kind == "delete":
                    self.zk.delete(op.path, op.version)

    def _first_failure(self, ops: list[StOp]) -> tuple[int, MetadataError] | None:
        """Tree lock held: the first op that would fail after the ones before it."""
        created: set[str] = set()
        deleted: set[str] = set()

        def current(path: str) -> tuple[bytes, int] | None:
            if path in deleted:
                return None
            return (b"", 0) if path in created else self.zk.peek(path)

        for i, op in enumerate(ops):
            node = current(op.path)
            if op.kind == "create":
                if node is not None:
                    return i, NodeExistsError(f"{op.path} already exists")
                if current(op.path.rpartition("/")[0] or "/") is None:
                    return i, NoNodeError(f"parent of {op.path} does not exist")
                created.add(op.path)
                continue
            if node is None:
                return i, NoNodeError(f"{op.path} does not exist")
            if op.version != -1 and op.path not in created and node[1] != op.version:
                return i, BadVersionError(f"{op.path} is at version {node[1]}, not {op.version}")
            if op.kind == "delete":
                kids = {f"{op.path}/{c}" for c in self.zk.peek_children(op.path)[0]} - deleted
                if kids or any(c.rpartition("/")[0] == op.path for c in created):
                    return i, MetadataError(f"{op.path} has children")
                deleted.add(op.path)
                created.discard(op.path)
        return None
