"""An in-memory twin of the ZooKeeper store, for fast tests of everything above the metadata layer.

It keeps ZooKeeper's semantics that the rest of the system relies on: znode versions and CAS,
ephemeral nodes owned by a session, a killed process's nodes living on until its session times
out, session expiry (LOST, then re-registration on a new session) and ZooKeeper being down. The
same contract tests run against it and against a real ZooKeeper.

Several stores can share one :class:`InMemoryZooKeeper` (one "ensemble", one session per store),
which is how tests model several bookies and clients of one cluster.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from metadata.errors import (
    BadVersionError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    StoreClosedError,
)
from metadata.layout import LAYOUT_TEXT, ZkLayout, is_bucket_name, is_ledger_node_name
from metadata.store import MetadataStore, SessionEvent, SessionListener, SessionWorker, parse_bookie_info
from metadata.streams.memory import InMemoryStreams
from metadata.watches import BookiesWatchCallback, BookiesWatchState, LedgerWatchCallback, LedgerWatchState

_REREGISTER_RETRY_S = 0.2


@dataclass
class _Node:
    data: bytes
    version: int = 0
    owner: int | None = None  # session id of an ephemeral node
    children: set[str] = field(default_factory=set)
    sequence: int = 0  # next number a sequential child would get (ZooKeeper's parent counter)


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


class InMemoryZooKeeper:
    """A fake ZooKeeper ensemble: a versioned tree plus sessions, behind one lock."""

    _named: dict[str, InMemoryZooKeeper] = {}
    _named_lock = threading.Lock()

    def __init__(self, session_timeout_ms: int = 10000) -> None:
        self.session_timeout_ms = session_timeout_ms
        self._cond = threading.Condition(threading.RLock())
        self._nodes: dict[str, _Node] = {"/": _Node(b"")}
        self._sessions: dict[int, InMemoryMetadataStore] = {}
        self._session_ids = itertools.count(1)
        self._available = True
        self._watchers: list[Callable[[str], None]] = []

    @classmethod
    def named(cls, name: str) -> InMemoryZooKeeper:
        """The process-wide fake ensemble called ``name`` (what ``memory://name`` connects to)."""
        with cls._named_lock:
            return cls._named.setdefault(name, cls())

    # -- sessions ---------------------------------------------------------------------------
    def _open_session(self, store: InMemoryMetadataStore) -> int:
        with self._cond:
            session_id = next(self._session_ids)
            self._sessions[session_id] = store
            return session_id

    def expire_session(self, session_id: int) -> None:
        """What the server does when a session times out: its ephemeral nodes disappear."""
        with self._cond:
            store = self._sessions.pop(session_id, None)
            for path in [p for p, n in self._nodes.items() if n.owner == session_id]:
                self._remove(path)
            self._cond.notify_all()
        if store is not None:
            store._session_expired(session_id)

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
            store._availability_changed(available)

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
            parent = _parent(path)
            if parent not in self._nodes:
                if not makepath:
                    raise NoNodeError(f"parent of {path} does not exist")
                self.create(parent, b"", makepath=True)
            self._nodes[path] = _Node(bytes(data), owner=owner)
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
                raise MetadataError(f"{path} has children")
            self._remove(path)
            self._cond.notify_all()

    def _remove(self, path: str) -> None:
        del self._nodes[path]
        parent = self._nodes[_parent(path)]
        parent.children.discard(path.rsplit("/", 1)[1])
        parent.sequence += 1
        self._changed(path)

    def children(self, path: str) -> list[str] | None:
        with self._cond:
            self.check_available(f"list {path}")
            node = self._nodes.get(path)
            return None if node is None else sorted(node.children)

    def wait_until_absent(self, path: str, timeout_s: float) -> None:
        """Block until ``path`` is gone or ``timeout_s`` passed (whichever first)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while path in self._nodes and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)


class InMemoryMetadataStore(MetadataStore, InMemoryStreams):
    """:class:`MetadataStore` on an :class:`InMemoryZooKeeper`; one fake session per store.

    Test hooks: :meth:`expire_session` (server-side expiry, like ZooKeeper's), :meth:`crash` (the
    process dies: the session lingers until its timeout) and ``zk.set_available(False)``.
    """

    def __init__(self, zk: InMemoryZooKeeper | None = None, *, root: str = "/ledgers") -> None:
        self.zk = zk if zk is not None else InMemoryZooKeeper()
        self.paths = ZkLayout(root)
        self._lock = threading.Lock()
        self._registrations: dict[str, bytes] = {}
        self._closed = False
        self._worker = SessionWorker("memory-metadata")
        self._watch_worker = SessionWorker("memory-metadata-watches")
        self._watch_lock = threading.Lock()
        self._ledger_watches: dict[str, list[LedgerWatchState]] = {}
        self._bookie_watches: list[BookiesWatchState] = []
        self.zk.add_watcher(self._on_change)
        self.session_id = self.zk._open_session(self)
        self._ur_init_memory()

    def __repr__(self) -> str:
        return f"InMemoryMetadataStore(session={self.session_id}, root={self.paths.root})"

    def _check(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(f"{what}: the metadata store is closed")
        self.zk.check_available(what)

    # -- test hooks -------------------------------------------------------------------------
    def expire_session(self) -> None:
        """Expire this store's session now (ephemerals vanish, LOST, then a new session)."""
        self.zk.expire_session(self.session_id)

    def crash(self) -> None:
        """Simulate the owning process dying: no more calls, nodes live until the session times out."""
        with self._lock:
            self._closed = True
            self._registrations.clear()
        self._ur_shutdown_memory(tell=False)
        self._stop_watches()
        self._worker.close()
        self.zk.expire_later(self.session_id)

    def _session_expired(self, session_id: int) -> None:
        with self._lock:
            if self._closed or session_id != self.session_id:
                return
        self._worker.notify(SessionEvent.LOST)
        self.session_id = self.zk._open_session(self)
        self._worker.submit(self._after_connected)

    def _availability_changed(self, available: bool) -> None:
        if self._closed:
            return
        if available:
            self._worker.submit(self._after_connected)
        else:
            self._worker.notify(SessionEvent.SUSPENDED)

    def _after_connected(self) -> None:
        self._ensure_registrations()
        self._worker.notify(SessionEvent.CONNECTED)

    def _ensure_registrations(self) -> None:
        with self._lock:
            wanted = dict(self._registrations)
        missing = False
        for path, data in wanted.items():
            try:
                self.zk.create(path, data, owner=self.session_id)
            except NodeExistsError:
                got = self.zk.get(path)
                missing = missing or got is None or got[2] != self.session_id
            except MetadataError:
                missing = True
        if missing and not self._closed:
            self._worker.submit_later(_REREGISTER_RETRY_S, self._ensure_registrations)

    def add_session_listener(self, callback: SessionListener) -> None:
        self._worker.add_listener(callback)

    # -- cluster ----------------------------------------------------------------------------
    def init_cluster(self) -> str:
        self._check("init cluster")
        p = self.paths
        for path in (p.root, p.available, p.available_readonly, p.cookies, p.underreplication, p.idgen):
            self._create_if_absent(path, b"")
        for path in (p.ur_ledgers, p.ur_locks, p.auditor_election):
            self._create_if_absent(path, b"")
        layout = self._create_if_absent(p.layout, LAYOUT_TEXT.encode())
        if layout.decode(errors="replace") != LAYOUT_TEXT:
            raise MetadataError(
                f"{p.layout} holds an incompatible layout {layout!r}; expected {LAYOUT_TEXT!r}"
            )
        return self._create_if_absent(p.instance_id, str(uuid.uuid4()).encode()).decode()

    def _create_if_absent(self, path: str, data: bytes) -> bytes:
        try:
            self.zk.create(path, data, makepath=True)
            return data
        except NodeExistsError:
            got = self.zk.get(path)
            if got is None:
                raise MetadataError(f"{path} was deleted while the cluster was being initialised") from None
            return got[0]

    def instance_id(self) -> str:
        self._check("instance id")
        got = self.zk.get(self.paths.instance_id)
        if got is None:
            raise NoNodeError(f"no cluster at {self.paths.instance_id}: run `spark-bookie init` first")
        return got[0].decode()

    # -- registration -----------------------------------------------------------------------
    def register_bookie(self, bookie_id: str, *, readonly: bool, data: bytes = b"", wait_ms_max: int) -> None:
        path = self.paths.bookie(bookie_id, readonly=readonly)
        give_up = time.monotonic() + wait_ms_max / 1000
        while True:
            self._check(f"register {path}")
            session = self.session_id
            try:
                self.zk.create(path, data, owner=session)
                break
            except NoNodeError as e:
                raise NoNodeError(
                    f"cannot register {path}: the cluster is not initialised (run `spark-bookie init`)"
                ) from e
            except NodeExistsError:
                got = self.zk.get(path)
                if got is not None and got[2] == session:
                    self.zk.set(path, data)
                    break
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise NodeExistsError(
                    f"bookie {bookie_id} is already registered at {path} by another session and the node "
                    f"did not go away within {wait_ms_max} ms: is another bookie running with this id?"
                ) from None
            self.zk.wait_until_absent(path, remaining)
        with self._lock:
            self._registrations[path] = data
        if self.session_id != session:  # expired meanwhile: its re-creation may have missed this one
            self._worker.submit(self._ensure_registrations)

    def unregister_bookie(self, bookie_id: str, *, readonly: bool) -> None:
        path = self.paths.bookie(bookie_id, readonly=readonly)
        with self._lock:
            self._registrations.pop(path, None)
        self._check(f"unregister {path}")
        got = self.zk.get(path)
        if got is not None and got[2] == self.session_id:
            try:
                self.zk.delete(path)
            except NoNodeError:
                pass

    def list_bookies(self, readonly: bool = False) -> list[str]:
        self._check("list bookies")
        names = self.zk.children(self.paths.available_readonly if readonly else self.paths.available)
        return sorted(n for n in names or [] if readonly or n != "readonly")

    # -- cookies ----------------------------------------------------------------------------
    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        self._check("read cookie")
        got = self.zk.get(self.paths.cookie(bookie_id))
        return None if got is None else (got[0], got[1])

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        path = self.paths.cookie(bookie_id)
        self._check(f"write {path}")
        if version is None:
            self.zk.create(path, data)
            return 0
        return self.zk.set(path, data, version)

    def delete_cookie(self, bookie_id: str, version: int) -> None:
        self._check("delete cookie")
        self.zk.delete(self.paths.cookie(bookie_id), version)

    # -- ledgers ----------------------------------------------------------------------------
    def ledger_ids(self) -> set[int]:
        self._check("list ledgers")
        root = self.paths.root
        if self.zk.get(root) is None:
            raise NoNodeError(f"no cluster at {root}: run `spark-bookie init` first")
        level = [root]
        for depth in range(4):
            level = [
                f"{parent}/{name}"
                for parent in level
                for name in self.zk.children(parent) or []
                if is_bucket_name(depth, name)
            ]
        return {
            self.paths.ledger_id(f"{parent}/{name}")
            for parent in level
            for name in self.zk.children(parent) or []
            if is_ledger_node_name(name)
        }

    def create_ledger_node(self, ledger_id: int, data: bytes) -> int:
        path = self.paths.ledger(ledger_id)
        self._check(f"create {path}")
        try:
            self.zk.create(path, data, makepath=True)
        except NodeExistsError as e:
            raise NodeExistsError(f"ledger {ledger_id} already exists ({path})") from e
        return 0

    def read_ledger_node(self, ledger_id: int) -> tuple[bytes, int] | None:
        self._check("read ledger")
        got = self.zk.get(self.paths.ledger(ledger_id))
        return None if got is None else (got[0], got[1])

    def write_ledger_node(self, ledger_id: int, data: bytes, version: int) -> int:
        path = self.paths.ledger(ledger_id)
        self._check(f"update {path}")
        try:
            return self.zk.set(path, data, version)
        except NoNodeError as e:
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})") from e
        except BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e

    def delete_ledger_node(self, ledger_id: int, version: int = -1) -> None:
        self._check("delete ledger")
        self.zk.delete(self.paths.ledger(ledger_id), version)

    def generate_ledger_id(self) -> int:
        """A counter per cluster root (the twin of ZooKeeper's sequential nodes); starts at 1."""
        self._check("generate ledger id")
        idgen = self.paths.idgen
        if self.zk.get(self.paths.root) is None:
            raise NoNodeError(f"no cluster at {self.paths.root}: run `spark-bookie init` first")
        self._create_if_absent(idgen, b"")  # clusters initialised before ids were generated here
        while True:
            ledger_id = self.zk.next_sequence(idgen)
            if ledger_id > 0:
                return ledger_id

    # -- watches ----------------------------------------------------------------------------
    def _on_change(self, path: str) -> None:
        """Tree hook, called with the tree's lock held: snapshot and queue, never block."""
        with self._watch_lock:
            ledger_watches = self._ledger_watches.get(path, [])
            node = self.zk.peek(path) if ledger_watches else None
            if ledger_watches and node is None:
                del self._ledger_watches[path]  # deleted: each watch reports it once and ends
            for lw in ledger_watches:
                self._watch_worker.submit(partial(lw.deliver, *(node or (None, -1))))
            parent = path.rsplit("/", 1)[0]
            if self._bookie_watches and parent in (self.paths.available, self.paths.available_readonly):
                readonly = parent == self.paths.available_readonly
                names, cversion = self.zk.peek_children(parent)
                for bw in self._bookie_watches:
                    self._watch_worker.submit(partial(bw.deliver, readonly, names, cversion))

    def watch_ledger_metadata(self, ledger_id: int, callback: LedgerWatchCallback) -> Callable[[], None]:
        path = self.paths.ledger(ledger_id)
        state = LedgerWatchState(ledger_id, callback)
        with self.zk.lock:  # read and subscribe atomically: no change can fall in between
            self._check(f"watch {path}")
            node = self.zk.peek(path)
            with self._watch_lock:
                if node is not None:
                    self._ledger_watches.setdefault(path, []).append(state)
                self._watch_worker.submit(partial(state.deliver, *(node or (None, -1))))

        def cancel() -> None:
            state.cancel()
            with self._watch_lock:
                watches = self._ledger_watches.get(path, [])
                if state in watches:
                    watches.remove(state)
                if not watches:
                    self._ledger_watches.pop(path, None)

        return cancel

    def watch_bookies(self, callback: BookiesWatchCallback) -> Callable[[], None]:
        state = BookiesWatchState(callback)
        with self.zk.lock:
            self._check("watch bookies")
            if self.zk.peek(self.paths.available) is None:
                raise NoNodeError(f"no cluster at {self.paths.root}: run `spark-bookie init` first")
            with self._watch_lock:
                self._bookie_watches.append(state)
                parents = ((False, self.paths.available), (True, self.paths.available_readonly))
                for readonly, parent in parents:
                    names, cversion = self.zk.peek_children(parent)
                    self._watch_worker.submit(partial(state.deliver, readonly, names, cversion))

        def cancel() -> None:
            state.cancel()
            with self._watch_lock:
                if state in self._bookie_watches:
                    self._bookie_watches.remove(state)

        return cancel

    def _stop_watches(self) -> None:
        self.zk.remove_watcher(self._on_change)
        with self._watch_lock:
            for watches in self._ledger_watches.values():
                for lw in watches:
                    lw.cancel()
            for bw in self._bookie_watches:
                bw.cancel()
            self._ledger_watches.clear()
            self._bookie_watches.clear()
        self._watch_worker.close()

    def bookie_info(self, bookie_id: str) -> dict[str, str]:
        self._check("bookie info")
        for readonly in (False, True):
            got = self.zk.get(self.paths.bookie(bookie_id, readonly=readonly))
            if got is not None:
                return parse_bookie_info(got[0])
        return {}

    # -- application data -------------------------------------------------------------------
    def put_app_data(self, key: str, data: bytes) -> None:
        path = self.paths.app(key)
        self._check(f"write {path}")
        try:
            self.zk.set(path, data)
        except NoNodeError:
            try:
                self.zk.create(path, data, makepath=True)
            except NodeExistsError:
                self.zk.set(path, data)

    def get_app_data(self, key: str) -> bytes | None:
        path = self.paths.app(key)
        self._check(f"read {path}")
        got = self.zk.get(path)
        return None if got is None else got[0]

    def list_app_data(self, key: str) -> list[str]:
        path = self.paths.app(key)
        self._check(f"list {path}")
        return self.zk.children(path) or []

    def delete_app_data(self, key: str) -> None:
        path = self.paths.app(key)
        self._check(f"delete {path}")
        self._delete_tree(path)

    def _delete_tree(self, path: str) -> None:
        for child in self.zk.children(path) or []:
            self._delete_tree(f"{path}/{child}")
        try:
            self.zk.delete(path)
        except NoNodeError:
            pass

    def close(self) -> None:
        """End the session: its ephemeral nodes go at once, as with a clean ZooKeeper close."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._registrations.clear()
        self._ur_shutdown_memory(tell=True)
        self._stop_watches()
        self._worker.close()
        self.zk.expire_session(self.session_id)
