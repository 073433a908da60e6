"""The in-memory twin's "ensemble": a versioned tree of nodes plus sessions, behind one lock.

It keeps ZooKeeper's semantics that the rest of the system relies on: znode versions and CAS,
ephemeral nodes owned by a session, a killed process's nodes living on until its session times
out, session expiry and ZooKeeper being down. The twin's node layer
(:class:`metadata.memory.nodes.MemoryNodes`) is one session on it.

Several stores can share one :class:`InMemoryZooKeeper` (one "ensemble", one session per store),
which is how tests model several bookies and clients of one cluster.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from metadata.errors import (
    BadVersionError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)


@dataclass
class _Node:
    data: bytes
    version: int = 0
    owner: int | None = None  # session id of an ephemeral node
    children: set[str] = field(default_factory=set)
    sequence: int = 0  # next number a sequential child would get (ZooKeeper's parent counter)
    created: int = 0  # ZooKeeper's czxid: which creation of this path the node is


def parent_of(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


class Session(Protocol):
    """What the ensemble tells a session's holder (the twin's node layer)."""

    def session_expired(self, session_id: int) -> None: ...

    def availability_changed(self, available: bool) -> None: ...


class InMemoryZooKeeper:
    """A fake ZooKeeper ensemble: a versioned tree plus sessions, behind one lock."""

    _named: dict[str, InMemoryZooKeeper] = {}
    _named_lock = threading.Lock()

    def __init__(self, session_timeout_ms: int = 10000) -> None:
        self.session_timeout_ms = session_timeout_ms
        self._cond = threading.Condition(threading.RLock())
        self._nodes: dict[str, _Node] = {"/": _Node(b"")}
        self._sessions: dict[int, Session] = {}
        self._session_ids = itertools.count(1)
        self._creations = itertools.count(1)
        self._available = True
        self._watchers: list[Callable[[str], None]] = []

    @classmethod
    def named(cls, name: str) -> InMemoryZooKeeper:
        """The process-wide fake ensemble called ``name`` (what ``memory://name`` connects to)."""
        with cls._named_lock:
            return cls._named.setdefault(name, cls())

    # -- sessions ---------------------------------------------------------------------------
    def open_session(self, holder: Session) -> int:
        """A new session for ``holder``, told of its expiry and of the ensemble going down and up."""
        with self._cond:
            session_id = next(self._session_ids)
            self._sessions[session_id] = holder
            return session_id

    def expire_session(self, session_id: int) -> None:
        """What the server does when a session times out: its ephemeral nodes disappear."""
        with self._cond:
            store = self._sessions.pop(session_id, None)
            for path in [p for p, n in self._nodes.items() if n.owner == session_id]:
                self._remove(path)
            self._cond.notify_all()
        if store is not None:
            store.session_expired(session_id)

    def expire_later(self, session_id: int) -> None:
        """Expire ``session_id`` after the session timeout, as ZooKeeper does for a dead client."""
        timer = threading.Timer(self.session_timeout_ms / 1000, self.expire_session, (session_id,))
        timer.daemon = True
        timer.start()

    def set_available(self, available: bool) -> None:
        """Simulate ZooKeeper going down (every call raises MetadataUnavailableError) and back up."""
        with self._cond:
            if self._available == available:
                return
            self._available = available
            stores = list(self._sessions.values())
        for store in stores:
            store.availability_changed(available)

    @property
    def available(self) -> bool:
        return self._available

    # -- change hooks (the twin of ZooKeeper watches) ------------------------------------------
    @property
    def lock(self) -> threading.Condition:
        """The tree's lock: hold it to read a node and subscribe to its changes atomically."""
        return self._cond

    def add_watcher(self, watcher: Callable[[str], None]) -> None:
        """Call ``watcher(path)`` after every create, update and delete, *with the lock held*:
        it may read the tree (:meth:`peek`, :meth:`peek_children`) and must not block."""
        with self._cond:
            self._watchers.append(watcher)

    def remove_watcher(self, watcher: Callable[[str], None]) -> None:
        with self._cond:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def _changed(self, path: str) -> None:
        for watcher in list(self._watchers):
            watcher(path)

    def peek(self, path: str) -> tuple[bytes, int] | None:
        """``(data, version)`` ignoring availability (for watchers reporting a change)."""
        with self._cond:
            node = self._nodes.get(path)
            return None if node is None else (node.data, node.version)

    def peek_children(self, path: str) -> tuple[list[str], int]:
        """``(children, child version)`` ignoring availability; ``([], -1)`` for a missing node."""
        with self._cond:
            node = self._nodes.get(path)
            return ([], -1) if node is None else (sorted(node.children), node.sequence)

    # -- tree primitives (callers hold no lock; every primitive takes it) ---------------------
    def check_available(self, what: str) -> None:
        if not self._available:
            raise MetadataUnavailableError(f"{what}: the in-memory ZooKeeper is down")

    def create(self, path: str, data: bytes, *, owner: int | None = None, makepath: bool = False) -> None:
        with self._cond:
            self.check_available(f"create {path}")
            if path in self._nodes:
                raise NodeExistsError(f"{path} already exists")
            parent = parent_of(path)
            if parent not in self._nodes:
                if not makepath:
                    raise NoNodeError(f"parent of {path} does not exist")
                self.create(parent, b"", makepath=True)
            self._nodes[path] = _Node(bytes(data), owner=owner, created=next(self._creations))
            self._nodes[parent].children.add(path.rsplit("/", 1)[1])
            self._nodes[parent].sequence += 1
            self._changed(path)
            self._cond.notify_all()

    def get(self, path: str) -> tuple[bytes, int, int | None] | None:
        with self._cond:
            self.check_available(f"read {path}")
            node = self._nodes.get(path)
            return None if node is None else (node.data, node.version, node.owner)

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        with self._cond:
            self.check_available(f"update {path}")
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            if version != -1 and node.version != version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            node.data = bytes(data)
            node.version += 1
            self._changed(path)
            return node.version

    def next_sequence(self, path: str) -> int:
        """The number a sequential child of ``path`` would get now (and consume it), without
        creating the child: what the id generator needs of ZooKeeper's sequential nodes."""
        with self._cond:
            self.check_available(f"sequence {path}")
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            number = node.sequence
            node.sequence += 1
            return number

    def delete(self, path: str, version: int = -1) -> None:
        with self._cond:
            self.check_available(f"delete {path}")
            node = self._nodes.get(path)
            if node is None:
                raise NoNodeError(f"{path} does not exist")
            if version != -1 and node.version != version:
                raise BadVersionError(f"{path} is at version {node.version}, not {version}")
            if node.children:
                raise NotEmptyError(f"{path} has children")
            self._remove(path)
            self._cond.notify_all()

    def _remove(self, path: str) -> None:
        del self._nodes[path]
        parent = self._nodes[parent_of(path)]
        parent.children.discard(path.rsplit("/", 1)[1])
        parent.sequence += 1
        self._changed(path)

    def stat(self, path: str) -> tuple[int, int, int, int] | None:
        """``(version, child version, number of children, creation number)``, None if absent."""
        with self._cond:
            self.check_available(f"stat {path}")
            node = self._nodes.get(path)
            return None if node is None else (node.version, node.sequence, len(node.children), node.created)

    def children(self, path: str) -> list[str] | None:
        with self._cond:
            self.check_available(f"list {path}")
            node = self._nodes.get(path)
            return None if node is None else sorted(node.children)
