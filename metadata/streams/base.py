"""The backend-independent half of :class:`~metadata.streams.store.StreamStore`.

The layout, the multi-ops and the writer lock are written once, here, on a few ZooKeeper-shaped
primitives (``_st_get_many``, ``_st_children``, ``_st_create``, ``_st_set``, ``_st_delete``,
``_st_watch``, ``_st_multi``) that each backend implements with its own deadlines and error
translation, as :mod:`metadata.underreplication.base` does for the re-replication queue.

The lock is ZooKeeper's recipe: an ephemeral sequential node per contender under
``<stream>/lock``; the lowest holds the stream; a waiter watches only its predecessor (no herd).
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.layout import ZkLayout
from metadata.streams.model import (
    StreamMeta,
    check_name,
    decode_segment,
    decode_stream,
    encode_segment,
    encode_stream,
)
from metadata.streams.store import (
    NamespaceGoneError,
    StreamGoneError,
    StreamLockInfo,
    StreamLockTimeoutError,
    StreamStore,
)
from metadata.streams.transitions import Change, StreamView

STREAMS = "streams"
SEGMENTS = "segments"
LOCK = "lock"
_READ_TRIES_MAX = 20   # a stream changing under read_stream this many times in a row is an error

NodeState = tuple[bytes, int, int | None]  # (data, version, ephemeral owner session or None)


@dataclass(frozen=True)
class StOp:
    """One op of a multi: ``create`` (data), ``set`` / ``delete`` / ``check`` (CAS on version, -1 any)."""

    kind: str
    path: str
    data: bytes = b""
    version: int = -1


class MultiOpFailed(MetadataError):
    """A multi-op was not applied: op ``index`` failed with ``cause`` (NoNode, NodeExists, BadVersion)."""

    def __init__(self, index: int, cause: MetadataError) -> None:
        super().__init__(f"op {index}: {cause}")
        self.index, self.cause = index, cause


class StreamsBase(StreamStore):
    """Mixin of a metadata store: needs ``paths`` and the ``_st_*`` primitives."""

    paths: ZkLayout

    # -- primitives (each backend) ----------------------------------------------------------
    @abc.abstractmethod
    def _st_get_many(self, paths: list[str]) -> list[NodeState | None]: ...

    @abc.abstractmethod
    def _st_children(self, path: str) -> list[str] | None: ...

    @abc.abstractmethod
    def _st_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str: ...

    @abc.abstractmethod
    def _st_set(self, path: str, data: bytes, version: int) -> int: ...

    @abc.abstractmethod
    def _st_delete(self, path: str, version: int = -1) -> None: ...

    @abc.abstractmethod
    def _st_watch(self, path: str, wake: object) -> NodeState | None:
        """Read with a one-shot watch (fires on change or deletion; on creation when absent)."""

    @abc.abstractmethod
    def _st_multi(self, ops: list[StOp]) -> None:
        """All or nothing; MultiOpFailed naming the first op that failed."""

    # -- paths ------------------------------------------------------------------------------
    def _st_root(self) -> str:
        return f"{self.paths.root}/{STREAMS}"

    def _ns_path(self, ns: str) -> str:
        return f"{self._st_root()}/{check_name(ns, 'namespace')}"

    def _stream_path(self, ns: str, name: str) -> str:
        return f"{self._ns_path(ns)}/{check_name(name, 'stream')}"

    def _segment_path(self, ns: str, name: str, sequence: int) -> str:
        return f"{self._stream_path(ns, name)}/{SEGMENTS}/{sequence:020d}"

    # -- namespaces -------------------------------------------------------------------------
    def create_namespace(self, name: str, settings: bytes) -> None:
        path = self._ns_path(name)
        try:
            self._st_create(self._st_root(), b"")
        except NodeExistsError:
            pass
        self._st_create(path, settings)

    def read_namespace(self, name: str) -> tuple[bytes, int] | None:
        got = self._st_get_many([self._ns_path(name)])[0]
        return None if got is None else (got[0], got[1])

    def write_namespace(self, name: str, settings: bytes, version: int) -> int:
        try:
            return self._st_set(self._ns_path(name), settings, version)
        except NoNodeError as e:
            raise NamespaceGoneError(f"namespace {name!r} does not exist") from e

    def list_namespaces(self) -> list[str]:
        return sorted(self._st_children(self._st_root()) or [])

    def delete_namespace(self, name: str) -> None:
        path = self._ns_path(name)
        kids = self._st_children(path)
        if kids is None:
            raise NamespaceGoneError(f"namespace {name!r} does not exist")
        if kids:
            raise MetadataError(f"namespace {name!r} still has streams: {sorted(kids)[:5]}")
        try:
            self._st_delete(path)
        except NoNodeError as e:
            raise NamespaceGoneError(f"namespace {name!r} does not exist") from e

    # -- streams ----------------------------------------------------------------------------
    def create_stream(self, ns: str, name: str, meta: StreamMeta) -> None:
        path = self._stream_path(ns, name)
        ops = [StOp("create", path, encode_stream(meta)), StOp("create", f"{path}/{SEGMENTS}"),
               StOp("create", f"{path}/{LOCK}")]
        try:
            self._st_multi(ops)
        except MultiOpFailed as e:
            if isinstance(e.cause, NoNodeError):
                raise NamespaceGoneError(f"namespace {ns!r} does not exist") from e
            raise e.cause from e

    def list_streams(self, ns: str) -> list[str]:
        kids = self._st_children(self._ns_path(ns))
        if kids is None:
            raise NamespaceGoneError(f"namespace {ns!r} does not exist")
        return sorted(kids)

    def read_stream(self, ns: str, name: str) -> StreamView | None:
        path = self._stream_path(ns, name)
        for _ in range(_READ_TRIES_MAX):
            head = self._st_get_many([path])[0]
            if head is None:
                return None
            names = sorted(self._st_children(f"{path}/{SEGMENTS}") or [])
            got = self._st_get_many([f"{path}/{SEGMENTS}/{n}" for n in names] + [path])
            tail = got[-1]
            if tail is None:
                return None
            if tail[1] != head[1] or any(g is None for g in got[:-1]):
                continue  # changed while listed: read again
            segments = {}
            for n, g in zip(names, [g for g in got[:-1] if g is not None], strict=True):
                seg = decode_segment(g[0], f"segment {path}/{n}")
                segments[seg.sequence] = (seg, g[1])
            return StreamView(decode_stream(head[0], f"stream {path}"), head[1], segments)
        raise MetadataError(f"stream {ns}/{name} kept changing while it was read")

    def read_stream_meta(self, ns: str, name: str) -> tuple[StreamMeta, int] | None:
        path = self._stream_path(ns, name)
        got = self._st_get_many([path])[0]
        return None if got is None else (decode_stream(got[0], f"stream {path}"), got[1])

    def commit_stream(self, ns: str, name: str, base_version: int, change: Change,
                      lock: StreamLockInfo | None = None) -> int:
        path = self._stream_path(ns, name)
        ops = [StOp("check", lock.path)] if lock is not None else []
        ops.append(StOp("set", path, encode_stream(change.meta), base_version))
        ops += [StOp("create", self._segment_path(ns, name, s.sequence), encode_segment(s)) for s in change.create]
        ops += [StOp("set", self._segment_path(ns, name, s.sequence), encode_segment(s), v) for s, v in change.update]
        ops += [StOp("delete", self._segment_path(ns, name, seq), b"", v) for seq, v in change.delete]
        try:
            self._st_multi(ops)
        except MultiOpFailed as e:
            op = ops[e.index]
            if op.kind == "check":
                raise NoNodeError(f"the writer lock of {ns}/{name} is gone ({lock.path if lock else ''}): "
                                  "its ZooKeeper session expired") from e
            if op.path == path and isinstance(e.cause, NoNodeError):
                raise StreamGoneError(f"stream {ns}/{name} does not exist") from e
            if isinstance(e.cause, BadVersionError):
                raise BadVersionError(f"stream {ns}/{name} changed since version {base_version}") from e
            raise e.cause from e
        return base_version + 1

    def delete_stream(self, ns: str, name: str) -> None:
        path = self._stream_path(ns, name)
        if self._st_get_many([path])[0] is None:
            raise StreamGoneError(f"stream {ns}/{name} does not exist")
        for sub in (SEGMENTS, LOCK):
            for child in self._st_children(f"{path}/{sub}") or []:
                self._delete_quietly(f"{path}/{sub}/{child}")
            self._delete_quietly(f"{path}/{sub}")
        self._delete_quietly(path)

    def _delete_quietly(self, path: str) -> None:
        try:
            self._st_delete(path)
        except NoNodeError:
            pass

    # -- the writer lock --------------------------------------------------------------------
    def lock_stream(self, ns: str, name: str, owner: str, timeout_s: float) -> StreamLockInfo:
        lock_dir = f"{self._stream_path(ns, name)}/{LOCK}"
        try:
            mine = self._st_create(f"{lock_dir}/lock-", owner.encode(), ephemeral=True, sequential=True)
        except NoNodeError as e:
            raise StreamGoneError(f"stream {ns}/{name} does not exist") from e
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                kids = sorted(self._st_children(lock_dir) or [])
                ours = mine.rsplit("/", 1)[1]
                if ours not in kids:
                    raise NoNodeError(f"lock node {mine} vanished: the ZooKeeper session expired")
                k = kids.index(ours)
                if k == 0:
                    return StreamLockInfo(mine, owner)
                self._await_gone(f"{lock_dir}/{kids[k - 1]}", deadline, ns, name)
        except BaseException:
            self._delete_quietly(mine)
            raise

    def _await_gone(self, path: str, deadline: float, ns: str, name: str) -> None:
        gone = threading.Event()
        state = self._st_watch(path, lambda _event: gone.set())
        if state is None:
            return
        left = deadline - time.monotonic()
        if left <= 0 or not gone.wait(left):
            holder = self.stream_lock_holder(ns, name)
            raise StreamLockTimeoutError(f"stream {ns}/{name} is held by another writer ({holder})")

    def unlock_stream(self, lock: StreamLockInfo) -> None:
        self._delete_quietly(lock.path)

    def stream_lock_holder(self, ns: str, name: str) -> str | None:
        lock_dir = f"{self._stream_path(ns, name)}/{LOCK}"
        for kid in sorted(self._st_children(lock_dir) or []):
            got = self._st_get_many([f"{lock_dir}/{kid}"])[0]
            if got is not None:
                return got[0].decode(errors="replace")
        return None
