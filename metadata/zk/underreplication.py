"""ZooKeeper primitives for the under-replication queue and the auditor election (kazoo).

The protocol is :class:`~metadata.underreplication.base.UnderReplicationBase`; this mixin of
:class:`~metadata.zk.store.ZkMetadataStore` maps its primitives onto kazoo requests through the
store's deadline machinery (``_call`` / ``_gather``), translating kazoo's errors into
:mod:`metadata.errors`. Watch callbacks are handed straight to kazoo: they run on its event thread
and only poke a condition or queue work on the store's under-replication thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.store import SessionWorker
from metadata.underreplication.base import NodeState, NotEmptyError, Op, UnderReplicationBase, Wake

if TYPE_CHECKING:
    from kazoo.client import KazooClient


def _translate(e: kz.ZookeeperError, path: str) -> MetadataError:
    """kazoo's node errors as ours (callers never see kazoo's exceptions)."""
    if isinstance(e, kz.NoNodeError):
        return NoNodeError(f"{path} does not exist")
    if isinstance(e, kz.NodeExistsError):
        return NodeExistsError(f"{path} already exists")
    if isinstance(e, kz.BadVersionError):
        return BadVersionError(f"{path} changed meanwhile")
    if isinstance(e, kz.NotEmptyError):
        return NotEmptyError(f"{path} has children")
    return MetadataError(f"{path}: {e!r}")


def _node_state(value: Any, stat: Any) -> NodeState:
    return bytes(value), int(stat.version), int(stat.ephemeralOwner) or None


class ZkUnderReplication(UnderReplicationBase):
    """Mixin: needs ``_client``, ``_call``, ``_gather``, ``_deadline`` and ``_session_id`` of the
    ZooKeeper store."""

    _client: KazooClient
    _connected: threading.Event

    if TYPE_CHECKING:

        def _deadline(self) -> float: ...

        def _gather(
            self, what: str, starts: Sequence[Callable[[], Any]], deadline: float, *, idempotent: bool
        ) -> list[Any]: ...

        def _call(
            self, what: str, start: Callable[[], Any], deadline: float | None = None, *, idempotent: bool
        ) -> Any: ...

        def _session_id(self) -> int | None: ...

        def _await_connected(self, what: str, deadline: float) -> None: ...

    def _ur_init_zk(self, name: str) -> None:
        self._ur_init(SessionWorker(name))

    def _ur_node_call(self, what: str, path: str, start: Callable[[], Any], *, idempotent: bool = True) -> Any:
        try:
            return self._call(f"{what} {path}", start, idempotent=idempotent)
        except kz.ZookeeperError as e:
            raise _translate(e, path) from e

    # -- primitives --------------------------------------------------------------------------
    def _ur_get_many(self, paths: list[str]) -> list[NodeState | None]:
        starts = [partial(self._client.get_async, p) for p in paths]
        out: list[NodeState | None] = []
        for path, outcome in zip(
            paths, self._gather("read under-replication", starts, self._deadline(), idempotent=True), strict=True
        ):
            if isinstance(outcome, kz.NoNodeError):
                out.append(None)
            elif isinstance(outcome, kz.ZookeeperError):
                raise _translate(outcome, path)
            else:
                out.append(_node_state(*outcome))
        return out

    def _ur_on_child_event(self, event: Any) -> None:
        """kazoo's event thread: one bound method for every listing, so kazoo keeps one watcher
        per path; a connection-level event (no path) outdates every cached listing."""
        self._ur_listing_changed(getattr(event, "path", None))

    def _ur_children_many(self, paths: list[str], *, watch: bool) -> list[list[str] | None]:
        watcher = self._ur_on_child_event if watch else None
        starts = [partial(self._client.get_children_async, p, watch=watcher) for p in paths]
        out: list[list[str] | None] = []
        for path, outcome in zip(
            paths, self._gather("list under-replication", starts, self._deadline(), idempotent=True), strict=True
        ):
            if isinstance(outcome, kz.NoNodeError):
                out.append(self._ur_watch_absent(path) if watch else None)
            elif isinstance(outcome, kz.ZookeeperError):
                raise _translate(outcome, path)
            else:
                out.append(list(outcome))
        return out

    def _ur_watch_absent(self, path: str) -> list[str] | None:
        """A missing node arms no child watch: arm an exists watch (it fires when the node is
        created, e.g. a bucket a mark is making) so a waiting acquire still hears of it."""
        for _ in range(10):
            stat = self._ur_node_call("watch", path, partial(self._client.exists_async, path,
                                                             watch=self._ur_on_child_event))
            if stat is None:
                return None
            try:  # created meanwhile: list it after all
                return list(self._ur_node_call("list", path, partial(self._client.get_children_async, path,
                                                                   watch=self._ur_on_child_event)))
            except NoNodeError:
                continue
        raise MetadataError(f"list {path}: the node kept appearing and disappearing")

    def _ur_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        start = partial(self._client.create_async, path, data, ephemeral=ephemeral, sequence=sequential)
        return str(self._ur_node_call("create", path, start, idempotent=not sequential))

    def _ur_set(self, path: str, data: bytes, version: int) -> int:
        stat = self._ur_node_call("update", path, partial(self._client.set_async, path, data, version=version))
        return int(stat.version)

    def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        self._ur_node_call("delete", path, partial(self._client.delete_async, path, version=version), idempotent=retry)

    def _ur_pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        starts: list[Callable[[], Any]] = []
        for op in ops:
            if op.kind == "create":
                starts.append(partial(self._client.create_async, op.path, op.data, ephemeral=op.ephemeral))
            elif op.kind == "get":
                starts.append(partial(self._client.get_async, op.path))
            elif op.kind == "delete":
                starts.append(partial(self._client.delete_async, op.path, version=op.version))
            else:
                raise ValueError(f"unknown pipelined request {op.kind!r}")
        outcomes = self._gather("under-replication", starts, self._deadline(), idempotent=retry)
        out: list[object] = []
        for op, outcome in zip(ops, outcomes, strict=True):
            if isinstance(outcome, kz.ZookeeperError):
                if op.kind == "get" and isinstance(outcome, kz.NoNodeError):
                    out.append(None)
                    continue
                error = _translate(outcome, op.path)
                if type(error) is MetadataError:  # not an answer about the node: give up
                    raise error
                out.append(error)
            elif op.kind == "create":
                out.append(str(outcome))
            elif op.kind == "get":
                out.append(_node_state(*outcome))
            else:
                out.append(None)
        return out

    def _ur_multi(self, groups: list[list[Op]], *, retry: bool) -> list[bool]:
        def start(ops: list[Op]) -> Any:
            tx = self._client.transaction()
            for op in ops:
                if op.kind == "create":
                    tx.create(op.path, op.data, ephemeral=op.ephemeral)
                elif op.kind == "delete":
                    tx.delete(op.path, version=op.version)
                else:
                    raise ValueError(f"a multi holds creates and deletes, not {op.kind!r}")
            return tx.commit_async()

        outcomes = self._gather("under-replication", [partial(start, ops) for ops in groups], self._deadline(),
                                idempotent=retry)
        applied = []
        for outcome in outcomes:
            if isinstance(outcome, kz.ZookeeperError):   # the multi as a whole was refused
                error = _translate(outcome, "a multi")
                if type(error) is MetadataError:
                    raise error
                applied.append(False)
            else:   # one result per op: exceptions (the failing op's and RolledBackError) if it failed
                applied.append(not any(isinstance(r, Exception) for r in outcome))
        return applied

    def _ur_watch(self, path: str, wake: Wake) -> NodeState | None:
        """getData with a watch; when absent, exists with a watch (which fires on creation)."""
        for _ in range(10):
            try:
                got = self._ur_node_call("watch", path, partial(self._client.get_async, path, watch=wake))
                return _node_state(*got)
            except NoNodeError:
                pass
            if self._ur_node_call("watch", path, partial(self._client.exists_async, path, watch=wake)) is None:
                return None
        raise MetadataError(f"watch {path}: the node kept appearing and disappearing")

    def _ur_session(self) -> int | None:
        return self._session_id()

    def _ur_live_session(self) -> int | None:
        return self._session_id() if self._connected.is_set() else None

    def _ur_ensure_live(self, what: str) -> None:
        self._await_connected(what, self._deadline())
