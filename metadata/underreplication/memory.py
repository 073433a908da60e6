"""The in-memory twin's primitives for the under-replication queue and the auditor election.

The protocol itself is :class:`~metadata.underreplication.base.UnderReplicationBase`; this mixin of
:class:`~metadata.memory.InMemoryMetadataStore` maps its primitives onto the fake ensemble's tree:
ephemeral owners are the store's session, sequential names come from the parent's counter, and
one-shot watches are fired by the tree's change hook (which runs with the tree's lock held, so a
read and the arming of its watch are atomic, as in ZooKeeper).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from metadata.errors import BadVersionError, NodeExistsError, NoNodeError
from metadata.store import SessionWorker
from metadata.underreplication.base import NodeState, NotEmptyError, Op, UnderReplicationBase, Wake

if TYPE_CHECKING:
    from metadata.memory import InMemoryZooKeeper


class InMemoryUnderReplication(UnderReplicationBase):
    """Mixin: needs ``zk``, ``session_id``, ``paths`` and ``_check`` of the in-memory store."""

    zk: InMemoryZooKeeper
    session_id: int

    if TYPE_CHECKING:

        def _check(self, what: str) -> None: ...

    def _ur_init_memory(self) -> None:
        self._ur_watch_lock = threading.Lock()
        self._ur_oneshots: dict[str, list[Wake]] = {}
        self._ur_prefix = self.paths.underreplication + "/"
        self._ur_init(SessionWorker("memory-metadata-underreplication"))
        self.zk.add_watcher(self._ur_tree_changed)

    def _ur_shutdown_memory(self, *, tell: bool) -> None:
        self.zk.remove_watcher(self._ur_tree_changed)
        with self._ur_watch_lock:
            self._ur_oneshots.clear()
        self._ur_shutdown(tell=tell)

    def _ur_tree_changed(self, path: str) -> None:
        """Tree hook (tree lock held): fire one-shot watches of ``path``; a node created or deleted
        changes its parent's listing (and a deleted one its own), which is what child watches
        report; any change below ``underreplication`` may free a ledger for a waiting acquire."""
        with self._ur_watch_lock:  # one-shot watches of any path (the stream lock's too)
            wakes = self._ur_oneshots.pop(path, [])
        for wake in wakes:
            wake(None)
        if not path.startswith(self._ur_prefix):
            return
        self._ur_view.invalidate(path)
        self._ur_listing_changed(path.rsplit("/", 1)[0])

    # -- primitives --------------------------------------------------------------------------
    def _ur_get_many(self, paths: list[str]) -> list[NodeState | None]:
        self._check("read under-replication")
        return [self.zk.get(path) for path in paths]

    def _ur_children_many(self, paths: list[str], *, watch: bool) -> list[list[str] | None]:
        self._check("list under-replication")  # watch: the tree hook reports every change
        return [self.zk.children(path) for path in paths]

    def _ur_pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        out: list[object] = []
        with self.zk.lock:
            self._check("under-replication")
            for op in ops:
                try:
                    if op.kind == "create":
                        self.zk.create(op.path, op.data, owner=self.session_id if op.ephemeral else None)
                        out.append(op.path)
                    elif op.kind == "get":
                        out.append(self.zk.get(op.path))
                    elif op.kind == "delete":
                        self._ur_delete_node(op.path, op.version)
                        out.append(None)
                    else:
                        raise ValueError(f"unknown pipelined request {op.kind!r}")
                except (NotEmptyError, NoNodeError, NodeExistsError, BadVersionError) as e:
                    out.append(e)
        return out

    def _ur_multi(self, groups: list[list[Op]], *, retry: bool) -> list[bool]:
        applied = []
        with self.zk.lock:
            self._check("under-replication")
            for ops in groups:
                ok = self._ur_multi_valid(ops)
                if ok:
                    for op in ops:   # each succeeds: validated against the same tree, lock held
                        if op.kind == "create":
                            self.zk.create(op.path, op.data, owner=self.session_id if op.ephemeral else None)
                        else:
                            self._ur_delete_node(op.path, op.version)
                applied.append(ok)
        return applied

    def _ur_multi_valid(self, ops: list[Op]) -> bool:
        """Tree lock held: whether every op would succeed after the ones before it (ZooKeeper
        checks a multi the same way before applying any of it)."""
        created: set[str] = set()
        deleted: set[str] = set()

        def exists(path: str) -> bool:
            return path in created or (path not in deleted and self.zk.peek(path) is not None)

        for op in ops:
            if op.kind == "create":
                if exists(op.path) or not exists(op.path.rpartition("/")[0] or "/"):
                    return False
                created.add(op.path)
            elif op.kind == "delete":
                if not exists(op.path):
                    return False
                if op.path not in created:
                    current = self.zk.peek(op.path)
                    if op.version != -1 and current is not None and current[1] != op.version:
                        return False
                kids = {f"{op.path}/{c}" for c in self.zk.peek_children(op.path)[0]} - deleted
                if kids | {c for c in created if c.rpartition("/")[0] == op.path}:
                    return False
                created.discard(op.path)
                deleted.add(op.path)
            else:
                raise ValueError(f"a multi holds creates and deletes, not {op.kind!r}")
        return True

    def _ur_delete_node(self, path: str, version: int) -> None:
        """Tree lock held. The tree reports children as a plain MetadataError: ours is typed."""
        if self.zk.children(path):
            raise NotEmptyError(f"{path} has children")
        self.zk.delete(path, version)

    def _ur_create(self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False) -> str:
        with self.zk.lock:
            self._check(f"create {path}")
            if sequential:
                path = f"{path}{self.zk.next_sequence(path.rsplit('/', 1)[0]):010d}"
            self.zk.create(path, data, owner=self.session_id if ephemeral else None)
            return path

    def _ur_set(self, path: str, data: bytes, version: int) -> int:
        self._check(f"update {path}")
        return self.zk.set(path, data, version)

    def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        with self.zk.lock:
            self._check(f"delete {path}")
            self._ur_delete_node(path, version)

    def _ur_watch(self, path: str, wake: Wake) -> NodeState | None:
        with self.zk.lock:
            self._check(f"watch {path}")
            got = self.zk.get(path)
            with self._ur_watch_lock:
                wakes = self._ur_oneshots.setdefault(path, [])
                if wake not in wakes:  # one registration per path and callback, as ZooKeeper
                    wakes.append(wake)
            return got

    def _ur_session(self) -> int | None:
        return self.session_id

    def _ur_live_session(self) -> int | None:
        return self.session_id if self.zk.available else None

    def _ur_ensure_live(self, what: str) -> None:
        self._check(what)
