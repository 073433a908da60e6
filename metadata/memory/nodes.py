"""The in-memory twin's node layer: one session on an :class:`~metadata.memory.tree.InMemoryZooKeeper`.

Ephemeral owners are this session, sequential names come from the parent's counter, and one-shot
watches are fired by the tree's change hook, which runs with the tree's lock held: a read and the
arming of its watch (both under that lock) are atomic, as in ZooKeeper. A multi is checked against
the tree before any of it is applied, as ZooKeeper does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from metadata.errors import (
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    StoreClosedError,
)
from metadata.memory.tree import InMemoryZooKeeper, parent_of
from metadata.nodes import MultiOpFailed, Nodes, NodeStat, NodeState, Op, Wake
from metadata.session import SessionEvent, SessionWorker


@dataclass(frozen=True)
class WatchEvent:
    """What a wake is called with: the node whose watch fired."""

    path: str


class MemoryNodes(Nodes):
    """:class:`~metadata.nodes.Nodes` on the fake ensemble ``zk``; one fake session.

    The ensemble tells it of its session's expiry (LOST, then CONNECTED on a new session) and of
    the ensemble going down (SUSPENDED) and up (CONNECTED).
    """

    retry_s = 0.2

    def __init__(self, zk: InMemoryZooKeeper) -> None:
        self.zk = zk
        self._lock = threading.Lock()
        self._closed = False
        self.worker = SessionWorker(self.thread_name(""))
        self._watch_lock = threading.Lock()
        self._data_wakes: dict[str, list[Wake]] = {}
        self._child_wakes: dict[str, list[Wake]] = {}
        self.zk.add_watcher(self._changed)
        self._session_id = self.zk.open_session(self)

    def thread_name(self, role: str) -> str:
        return f"memory-metadata{role}"

    # -- session ---------------------------------------------------------------------------------
    def session_expired(self, session_id: int) -> None:
        """The ensemble expired ``session_id``: LOST, then a new session (CONNECTED)."""
        with self._lock:
            if self._closed or session_id != self._session_id:
                return
        self.worker.notify(SessionEvent.LOST)
        self._session_id = self.zk.open_session(self)
        self.worker.notify(SessionEvent.CONNECTED)

    def availability_changed(self, available: bool) -> None:
        if self._closed:
            return
        self.worker.notify(SessionEvent.CONNECTED if available else SessionEvent.SUSPENDED)

    def session(self) -> int | None:
        return self._session_id

    def live_session(self) -> int | None:
        return self._session_id if self.zk.available else None

    def ensure_live(self, what: str) -> None:
        self._check(what)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(f"{what}: the metadata store is closed")
        self.zk.check_available(what)

    def close_session(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            return True

    def _stop(self) -> None:
        self.zk.remove_watcher(self._changed)
        with self._watch_lock:
            self._data_wakes.clear()
            self._child_wakes.clear()
        self.worker.close()

    def end(self) -> None:
        """As a clean ZooKeeper close: the session's ephemeral nodes go at once."""
        self._stop()
        self.zk.expire_session(self._session_id)

    def crash(self) -> None:
        """As the owning process dying: the session's nodes live until it times out."""
        self._stop()
        self.zk.expire_later(self._session_id)

    # -- watches ---------------------------------------------------------------------------------
    def _changed(self, path: str) -> None:
        """Tree hook (tree lock held): fire the data watches of ``path``, and, when it was created
        (version 0) or deleted, the child watches of its parent and of itself."""
        node = self.zk.peek(path)
        parent = parent_of(path)
        fired: list[tuple[Wake, str]] = []
        with self._watch_lock:
            fired += [(w, path) for w in self._data_wakes.pop(path, [])]
            if node is None or node[1] == 0:
                fired += [(w, parent) for w in self._child_wakes.pop(parent, [])]
                fired += [(w, path) for w in self._child_wakes.pop(path, [])]
        for wake, where in fired:
            wake(WatchEvent(where))

    @staticmethod
    def _arm(table: dict[str, list[Wake]], path: str, wake: Wake) -> None:
        wakes = table.setdefault(path, [])
        if wake not in wakes:  # one registration per path and callback, as ZooKeeper
            wakes.append(wake)

    # -- reads -----------------------------------------------------------------------------------
    def get_many(self, paths: list[str]) -> list[NodeState | None]:
        self._check(f"read {paths[0] if paths else ''}")
        return [self.zk.get(path) for path in paths]

    def children_many(self, paths: list[str], *, watch: Wake | None = None) -> list[list[str] | None]:
        with self.zk.lock:
            self._check(f"list {paths[0] if paths else ''}")
            out = [self.zk.children(path) for path in paths]
            if watch is not None:
                with self._watch_lock:
                    for path in paths:
                        self._arm(self._child_wakes, path, watch)
            return out

    def children_versioned(self, paths: list[str], *, watch: Wake | None = None) -> list[tuple[list[str], int] | None]:
        with self.zk.lock:
            names = self.children_many(paths, watch=watch)
            return [None if n is None else (n, self.zk.peek_children(p)[1]) for p, n in zip(paths, names, strict=True)]

    def stat_many(self, paths: list[str]) -> list[NodeStat | None]:
        with self.zk.lock:
            self._check(f"stat {paths[0] if paths else ''}")
            return [None if got is None else NodeStat(*got) for got in map(self.zk.stat, paths)]

    def watch(self, path: str, wake: Wake, *, absent: bool = True) -> NodeState | None:
        with self.zk.lock:
            self._check(f"watch {path}")
            got = self.zk.get(path)
            if got is not None or absent:
                with self._watch_lock:
                    self._arm(self._data_wakes, path, wake)
            return got

    # -- writes ----------------------------------------------------------------------------------
    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               makepath: bool = False, retry: bool = True) -> str:
        with self.zk.lock:
            self._check(f"create {path}")
            if sequential:
                parent = parent_of(path)
                if makepath and self.zk.peek(parent) is None:
                    self.zk.create(parent, b"", makepath=True)
                path = f"{path}{self.zk.next_sequence(parent):010d}"
            self.zk.create(path, data, owner=self._session_id if ephemeral else None, makepath=makepath)
            return path

    def set(self, path: str, data: bytes, version: int = -1, *, retry: bool = True) -> int:
        self._check(f"update {path}")
        return self.zk.set(path, data, version)

    def delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        self._check(f"delete {path}")
        self.zk.delete(path, version)

    def take_sequence(self, prefix: str) -> int:
        self._check(f"sequence {prefix}")
        return self.zk.next_sequence(parent_of(prefix))

    def pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        out: list[object] = []
        with self.zk.lock:
            self._check(f"{len(ops)} requests")
            for op in ops:
                try:
                    if op.kind == "create":
                        self.zk.create(op.path, op.data, owner=self._session_id if op.ephemeral else None)
                        out.append(op.path)
                    elif op.kind == "get":
                        out.append(self.zk.get(op.path))
                    elif op.kind == "delete":
                        self.zk.delete(op.path, op.version)
                        out.append(None)
                    else:
                        raise ValueError(f"unknown pipelined request {op.kind!r}")
                except (NotEmptyError, NoNodeError, NodeExistsError, BadVersionError) as e:
                    out.append(e)
        return out

    def multi(self, groups: list[list[Op]], *, retry: bool) -> list[MultiOpFailed | None]:
        out: list[MultiOpFailed | None] = []
        with self.zk.lock:
            self._check("multi")
            for ops in groups:
                failed = self._first_failure(ops)
                if failed is None:
                    for op in ops:  # each succeeds: checked against the same tree, lock held
                        if op.kind == "create":
                            self.zk.create(op.path, op.data, owner=self._session_id if op.ephemeral else None)
                        elif op.kind == "set":
                            self.zk.set(op.path, op.data, op.version)
                        elif op.kind == "delete":
                            self.zk.delete(op.path, op.version)
                out.append(failed)
        return out

    def _first_failure(self, ops: list[Op]) -> MultiOpFailed | None:
        """Tree lock held: the first op that would fail after the ones before it."""
        pending: dict[str, int | None] = {}  # path -> its version after the ops so far (None: deleted)

        def version(path: str) -> int | None:
            if path in pending:
                return pending[path]
            node = self.zk.peek(path)
            return None if node is None else node[1]

        for i, op in enumerate(ops):
            current = version(op.path)
            if op.kind == "create":
                if current is not None:
                    return MultiOpFailed(i, NodeExistsError(f"{op.path} already exists"))
                if version(parent_of(op.path)) is None:
                    return MultiOpFailed(i, NoNodeError(f"parent of {op.path} does not exist"))
                pending[op.path] = 0
                continue
            if op.kind not in ("set", "delete", "check"):
                raise ValueError(f"a multi holds create, set, delete and check, not {op.kind!r}")
            if current is None:
                return MultiOpFailed(i, NoNodeError(f"{op.path} does not exist"))
            if op.version != -1 and current != op.version:
                return MultiOpFailed(i, BadVersionError(f"{op.path} is at version {current}, not {op.version}"))
            if op.kind == "set":
                pending[op.path] = current + 1
            elif op.kind == "delete":
                kids = {f"{op.path}/{c}" for c in self.zk.peek_children(op.path)[0]}
                kids |= {p for p, v in pending.items() if v is not None and parent_of(p) == op.path}
                if any(version(k) is not None for k in kids):
                    return MultiOpFailed(i, NotEmptyError(f"{op.path} has children"))
                pending[op.path] = None
        return None

    # -- administration ----------------------------------------------------------------------------
    def secure_tree(self, root: str) -> int:
        raise MetadataError("securing the metadata works on ZooKeeper metadata only (the in-memory "
                            "twin has no ACLs)")
