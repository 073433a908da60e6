"""ZooKeeper primitives for the under-replication queue and the auditor election (kazoo).

The protocol is :class:`~metadata.underreplication_base.UnderReplicationBase`; this mixin of
:class:`~metadata.zk.store.ZkMetadataStore` maps its primitives onto kazoo requests through the
store's deadline machinery (``_call`` / ``_gather``), translating kazoo's errors into
:mod:`metadata.errors`. Watch callbacks are handed straight to kazoo: they run on its event thread
and only poke a condition or queue work on the store's under-replication thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.store import SessionWorker
from metadata.underreplication_base import NodeState, UnderReplicationBase, Wake

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
        return MetadataError(f"{path} has children")
    return MetadataError(f"{path}: {e!r}")


def _node_state(value: Any, stat: Any) -> NodeState:
    return bytes(value), int(stat.version), int(stat.ephemeralOwner) or None


class ZkUnderReplication(UnderReplicationBase):
    """Mixin: needs ``_client``, ``_call``, ``_gather``, ``_deadline`` and ``_session_id`` of the
    ZooKeeper store."""

    _client: KazooClient

    if TYPE_CHECKING:

        def _deadline(self) -> float: ...

        def _gather(
            self, what: str, starts: Sequence[Callable[[], Any]], deadline: float, *, idempotent: bool
        ) -> list[Any]: ...

        def _call(
            self, what: str, start: Callable[[], Any], deadline: float | None = None, *, idempotent: bool
        ) -> Any: ...

        def _session_id(self) -> int | None: ...

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

    def _ur_children_many(self, paths: list[str], *, watch: bool) -> list[list[str] | None]:
        watcher = self._ur_poke if watch else None
        starts = [partial(self._client.get_children_async, p, watch=watcher) for p in paths]
        out: list[list[str] | None] = []
        for path, outcome in zip(
            paths, self._gather("list under-replication", starts, self._deadline(), idempotent=True), strict=True
        ):
            if isinstance(outcome, kz.NoNodeError):
                out.append(None)
            elif isinstance(outcome, kz.ZookeeperError):
                raise _translate(outcome, path)
            else:
                out.append(list(outcome))
        return out

    def _ur_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        start = partial(self._client.create_async, path, data, ephemeral=ephemeral, sequence=sequential)
        return str(self._ur_node_call("create", path, start, idempotent=not sequential))

    def _ur_set(self, path: str, data: bytes, version: int) -> int:
        stat = self._ur_node_call("update", path, partial(self._client.set_async, path, data, version=version))
        return int(stat.version)

    def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        self._ur_node_call("delete", path, partial(self._client.delete_async, path, version=version), idempotent=retry)

    def _ur_delete_if_empty(self, path: str) -> bool:
        try:
            self._call(f"delete {path}", partial(self._client.delete_async, path), idempotent=True)
        except kz.NotEmptyError:
            return False
        except kz.NoNodeError:
            pass
        except kz.ZookeeperError as e:
            raise _translate(e, path) from e
        return True

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
