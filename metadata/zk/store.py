"""The ZooKeeper metadata store (kazoo, which only the modules of this package import).

Two rules shape it. Every call is bounded by a deadline (kazoo alone would queue a request until a
connection comes back, i.e. forever when ZooKeeper is down). And nothing blocking runs in kazoo's
connection thread: state changes are handed to a :class:`~metadata.store.SessionWorker`, which tells
the listeners and re-creates the ephemeral registrations after a session was lost.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import KazooRetry

from metadata.errors import (
    BadVersionError,
    InvalidConnectStringError,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    StoreClosedError,
)
from metadata.layout import LAYOUT_TEXT, ZkLayout, is_bucket_name, is_ledger_node_name, parse_connect_string
from metadata.store import MetadataStore, SessionEvent, SessionListener, SessionWorker, parse_bookie_info
from metadata.watches import BookiesWatchCallback, BookiesWatchState, LedgerWatchCallback, LedgerWatchState
from metadata.zk.acl import client_options, secured_acl, walk
from metadata.zk.handler import PollingHandler
from metadata.zk.streams import ZkStreams

log = logging.getLogger(__name__)

_TRANSIENT = (kz.ConnectionLoss, kz.OperationTimeoutError, kz.SessionMovedError)
_BATCH = 256  # outstanding requests per round trip when walking the ledger tree
_POLL_S = 0.25  # how often a conflicting registration is re-checked
_REREGISTER_RETRY_S = 1.0
_REARM_RETRY_S = 1.0
#: ZooKeeper's sequence counter is a signed 32-bit int: ids use it for their low 31 bits and move
#: to the next high-order-bits node (``HOB-<n>``) when it reaches this (LongZkLedgerIdGenerator).
IDGEN_LOW_LIMIT = 2**31 - 1
_HOB_PREFIX = "HOB-"
_HOB_RE = re.compile(_HOB_PREFIX + r"\d{10}")


class ZkMetadataStore(MetadataStore, ZkStreams):
    """:class:`MetadataStore` on a ZooKeeper ensemble; one kazoo session per store.

    ``op_timeout_ms`` (default: the session timeout) bounds every call, waiting for a connection
    included. Reads are retried on connection loss within that deadline; a write that loses its
    connection raises MetadataUnavailableError because its outcome is unknown.
    """

    def __init__(
        self,
        connect_string: str,
        *,
        session_timeout_ms: int = 10000,
        connect_timeout_ms: int = 15000,
        op_timeout_ms: int | None = None,
        zk_auth: str | None = None,
    ) -> None:
        info = parse_connect_string(connect_string)
        acl_options = client_options(zk_auth)   # checked before anything starts
        self._zk_auth = zk_auth
        self.connect_info = info
        self.paths = ZkLayout(info.root)
        self._op_timeout_s = (op_timeout_ms if op_timeout_ms is not None else session_timeout_ms) / 1000
        self._lock = threading.Lock()
        self._reg_lock = threading.Lock()  # serialises claiming/deleting registration nodes
        self._registrations: dict[str, bytes] = {}
        self._connected = threading.Event()
        self._closed = False
        self._worker = SessionWorker(f"zk-metadata[{info.hosts_string}]")
        self._watch_worker = SessionWorker(f"zk-metadata-watches[{info.hosts_string}]")
        self._watches: set[_ZkWatch] = set()
        self._idgen_low_limit = IDGEN_LOW_LIMIT
        self._hob: int | None = None  # the id generator's current high-order bits (a cache)
        self._client = KazooClient(
            hosts=info.hosts_string,
            timeout=session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
            handler=PollingHandler(),
            **acl_options,
        )
        self._client.add_listener(self._on_state)
        self._ur_init_zk(f"zk-metadata-underreplication[{info.hosts_string}]")
        try:
            self._client.start(timeout=connect_timeout_ms / 1000)
        except KazooTimeoutError as e:
            self._closed = True
            self._ur_shutdown(tell=False)
            self._worker.close()
            self._watch_worker.close()
            raise MetadataUnavailableError(
                f"could not connect to ZooKeeper at {info.hosts_string} within {connect_timeout_ms} ms"
            ) from e

    def __repr__(self) -> str:
        return f"ZkMetadataStore({self.connect_info.hosts_string}{self.paths.root})"

    # -- plumbing ---------------------------------------------------------------------------
    def _deadline(self) -> float:
        return time.monotonic() + self._op_timeout_s

    def _gather(
        self, what: str, starts: Sequence[Callable[[], Any]], deadline: float, *, idempotent: bool
    ) -> list[Any]:
        """Issue the requests together and return their results in order.

        A ZooKeeper answer that is an error about the node (NoNode, NodeExists, BadVersion, ...)
        is returned as the exception object, for the caller to translate with context; losing the
        connection retries the whole batch if ``idempotent``, else raises MetadataUnavailableError.
        """
        while True:
            self._await_connected(what, deadline)
            try:
                pending = [start() for start in starts]
                return [self._outcome(result, deadline) for result in pending]
            except KazooTimeoutError as e:
                raise MetadataUnavailableError(
                    f"{what}: ZooKeeper at {self.connect_info.hosts_string} did not answer within "
                    f"{self._op_timeout_s:g} s"
                ) from e
            except (*_TRANSIENT, kz.SessionExpiredError) as e:
                if not idempotent:
                    if isinstance(e, kz.SessionExpiredError):
                        raise SessionExpiredError(f"{what}: the ZooKeeper session expired") from e
                    raise MetadataUnavailableError(f"{what}: connection to ZooKeeper lost ({e!r})") from e
                time.sleep(0.05)
            except (kz.ConnectionClosedError, kz.ZookeeperStoppedError) as e:
                self._check_open(what)
                raise MetadataUnavailableError(f"{what}: ZooKeeper client stopped ({e!r})") from e

    @staticmethod
    def _outcome(result: Any, deadline: float) -> Any:
        try:
            return result.get(timeout=max(deadline - time.monotonic(), 0.001))
        except (*_TRANSIENT, kz.SessionExpiredError):
            raise
        except (kz.NoAuthError, kz.AuthFailedError) as e:
            # Never a node-level outcome for a caller to translate: no credentials, no metadata.
            raise MetadataAccessDeniedError(
                "ZooKeeper refused the request: the node's ACL does not admit this client's "
                "credentials (set zk_auth = \"user:password\" as the cluster was secured with)"
            ) from e
        except kz.ZookeeperError as e:
            return e

    def _call(
        self, what: str, start: Callable[[], Any], deadline: float | None = None, *, idempotent: bool
    ) -> Any:
        """One request through :meth:`_gather`; node errors are raised (still kazoo's types)."""
        outcome = self._gather(what, [start], deadline or self._deadline(), idempotent=idempotent)[0]
        if isinstance(outcome, kz.ZookeeperError):
            raise outcome
        return outcome

    def _await_connected(self, what: str, deadline: float) -> None:
        self._check_open(what)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._connected.wait(remaining):
            self._check_open(what)
            raise MetadataUnavailableError(
                f"{what}: not connected to ZooKeeper at {self.connect_info.hosts_string} "
                f"(waited {self._op_timeout_s:g} s)"
            )

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(f"{what}: the metadata store is closed")

    def _session_id(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    # -- session events (kazoo's thread: never block here) ------------------------------------
    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.CONNECTED:
            self._connected.set()
            self._worker.submit(self._after_connected)
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
            self._worker.notify(SessionEvent.SUSPENDED)
        else:
            self._connected.clear()
            self._worker.notify(SessionEvent.LOST)

    def _after_connected(self) -> None:
        """Worker thread: make sure our registrations exist on this session, then tell listeners.

        kazoo drops every watch when the connection is lost (it does not re-send them), so each
        reconnection also re-arms our watches, which then report whatever changed meanwhile.
        """
        self._ensure_registrations()
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            self._watch_worker.submit(watch.refresh)
        self._worker.notify(SessionEvent.CONNECTED)

    def _ensure_registrations(self) -> None:
        with self._lock:
            wanted = dict(self._registrations)
        missing = []
        for path, data in wanted.items():
            if not self._connected.is_set():
                return  # the next CONNECTED event runs this again
            try:
                if self._claim(path, data, self._deadline())[0] != "ours":
                    missing.append(path)
            except MetadataError as e:
                log.warning("could not re-create registration %s: %s", path, e)
                missing.append(path)
        if missing and not self._closed:
            log.warning("registrations %s not yet re-created; retrying in %g s", missing, _REREGISTER_RETRY_S)
            self._worker.submit_later(_REREGISTER_RETRY_S, self._ensure_registrations)

    def add_session_listener(self, callback: SessionListener) -> None:
        self._worker.add_listener(callback)

    # -- cluster ----------------------------------------------------------------------------
    def init_cluster(self) -> str:
        deadline = self._deadline()
        p = self.paths
        for path in (p.root, p.available, p.available_readonly, p.cookies, p.underreplication, p.idgen):
            self._create_if_absent(path, b"", deadline)
        for path in (p.ur_ledgers, p.ur_locks, p.auditor_election):
            self._create_if_absent(path, b"", deadline)
        layout = self._create_if_absent(p.layout, LAYOUT_TEXT.encode(), deadline)
        if layout.decode(errors="replace") != LAYOUT_TEXT:
            raise MetadataError(
                f"{p.layout} holds an incompatible layout {layout!r}; expected {LAYOUT_TEXT!r}"
            )
        return self._create_if_absent(p.instance_id, str(uuid.uuid4()).encode(), deadline).decode()

    def secure_tree(self) -> int:
        """Put this store's digest ACL on the root and every node under it (an open cluster
        becomes a secured one); returns how many nodes were changed. Ephemeral registrations
        are included: they are re-created with the ACL anyway when their owners use zk_auth."""
        if self._zk_auth is None:
            raise InvalidConnectStringError("securing the metadata needs zk_auth (the credentials to grant)")
        acl = secured_acl(self._zk_auth)
        deadline = time.monotonic() + max(self._op_timeout_s, 60.0)

        def children(path: str) -> list[str]:
            try:
                return list(self._call(f"list {path}", lambda: self._client.get_children_async(path), deadline,
                                       idempotent=True))
            except kz.NoNodeError:
                return []

        paths = walk(children, self.paths.root)
        for path in paths:
            try:
                self._call(f"set the ACL of {path}", partial(self._client.set_acls_async, path, acl), deadline,
                           idempotent=True)
            except kz.NoNodeError:
                continue   # deleted meanwhile
        return len(paths)

    def _create_if_absent(self, path: str, data: bytes, deadline: float) -> bytes:
        """Create a persistent node unless it exists; return what it holds (safe to race)."""
        what = f"create {path}"
        try:
            self._call(
                what, lambda: self._client.create_async(path, data, makepath=True), deadline, idempotent=True
            )
            return data
        except kz.NodeExistsError:
            try:
                value, _ = self._call(
                    f"read {path}", lambda: self._client.get_async(path), deadline, idempotent=True
                )
            except kz.NoNodeError as e:
                raise MetadataError(f"{path} was deleted while the cluster was being initialised") from e
            return bytes(value)

    def instance_id(self) -> str:
        path = self.paths.instance_id
        try:
            value, _ = self._call(f"read {path}", lambda: self._client.get_async(path), idempotent=True)
        except kz.NoNodeError as e:
            raise NoNodeError(f"no cluster at {path}: run `spark-bookie init` first") from e
        return bytes(value).decode()

    # -- registration -----------------------------------------------------------------------
    def register_bookie(self, bookie_id: str, *, readonly: bool, data: bytes = b"", wait_ms_max: int) -> None:
        path = self.paths.bookie(bookie_id, readonly=readonly)
        give_up = time.monotonic() + wait_ms_max / 1000
        while True:
            status, session = self._claim(path, data, self._deadline())
            if status == "ours":
                with self._lock:
                    self._registrations[path] = data
                if self._session_id() != session:
                    # the session changed before we recorded the registration, so the re-creation
                    # after that change may have missed it: run it again
                    self._worker.submit(self._ensure_registrations)
                return
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise NodeExistsError(
                    f"bookie {bookie_id} is already registered at {path} by another ZooKeeper session "
                    f"and the node did not go away within {wait_ms_max} ms: is another bookie running "
                    f"with this id? (a killed bookie's node lasts until its session times out)"
                )
            time.sleep(min(_POLL_S, remaining))

    def _claim(self, path: str, data: bytes, deadline: float) -> tuple[str, int | None]:
        """Try to own the ephemeral ``path``: "ours", "foreign" (someone else's) or "gone" (retry),
        with the session id seen before trying."""
        with self._reg_lock:
            session = self._session_id()
            try:
                self._call(
                    f"register {path}",
                    lambda: self._client.create_async(path, data, ephemeral=True),
                    deadline,
                    idempotent=False,
                )
                return "ours", session
            except kz.NoNodeError as e:
                raise NoNodeError(
                    f"cannot register {path}: the cluster is not initialised (run `spark-bookie init`)"
                ) from e
            except kz.NodeExistsError:
                stat = self._call(
                    f"stat {path}", lambda: self._client.exists_async(path), deadline, idempotent=True
                )
            if stat is None:
                return "gone", session
            if session is None or stat.ephemeralOwner != session:
                return "foreign", session
            try:  # ours already (a retry, or re-registering with new data)
                self._call(
                    f"update {path}", lambda: self._client.set_async(path, data), deadline, idempotent=True
                )
            except kz.NoNodeError:
                return "gone", session
            return "ours", session

    def unregister_bookie(self, bookie_id: str, *, readonly: bool) -> None:
        path = self.paths.bookie(bookie_id, readonly=readonly)
        with self._lock:
            self._registrations.pop(path, None)
        with self._reg_lock:
            stat = self._call(f"stat {path}", lambda: self._client.exists_async(path), idempotent=True)
            if stat is None or stat.ephemeralOwner != self._session_id():
                return  # not ours: never delete another session's registration
            try:
                self._call(
                    f"unregister {path}",
                    lambda: self._client.delete_async(path, version=stat.version),
                    idempotent=True,
                )
            except (kz.NoNodeError, kz.BadVersionError):
                pass

    def list_bookies(self, readonly: bool = False) -> list[str]:
        path = self.paths.available_readonly if readonly else self.paths.available
        try:
            names = self._call(f"list {path}", lambda: self._client.get_children_async(path), idempotent=True)
        except kz.NoNodeError:
            return []
        return sorted(n for n in names if readonly or n != "readonly")

    # -- cookies ----------------------------------------------------------------------------
    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        return self._read(self.paths.cookie(bookie_id))

    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        path = self.paths.cookie(bookie_id)
        try:
            if version is None:
                self._call(f"create {path}", lambda: self._client.create_async(path, data), idempotent=False)
                return 0
            stat = self._call(
                f"update {path}",
                lambda: self._client.set_async(path, data, version=version),
                idempotent=False,
            )
            return int(stat.version)
        except kz.NodeExistsError as e:
            raise NodeExistsError(f"cookie {path} already exists") from e
        except kz.BadVersionError as e:
            raise BadVersionError(f"cookie {path} changed since version {version}") from e
        except kz.NoNodeError as e:
            raise NoNodeError(f"cookie {path} does not exist (or the cluster is not initialised)") from e

    def delete_cookie(self, bookie_id: str, version: int) -> None:
        self._delete(self.paths.cookie(bookie_id), version, "cookie")

    # -- ledgers ----------------------------------------------------------------------------
    def ledger_ids(self) -> set[int]:
        deadline = self._deadline()
        root = self.paths.root
        if (
            self._call(f"stat {root}", lambda: self._client.exists_async(root), deadline, idempotent=True)
            is None
        ):
            raise NoNodeError(f"no cluster at {root}: run `spark-bookie init` first")
        level = [root]
        for depth in range(4):
            level = [
                f"{parent}/{name}"
                for parent, names in self._children_many(level, deadline)
                for name in names
                if is_bucket_name(depth, name)
            ]
        return {
            self.paths.ledger_id(f"{parent}/{name}")
            for parent, names in self._children_many(level, deadline)
            for name in names
            if is_ledger_node_name(name)
        }

    def _children_many(self, parents: list[str], deadline: float) -> list[tuple[str, list[str]]]:
        """Children of many nodes, ``_BATCH`` requests per round trip; vanished nodes have none."""
        out: list[tuple[str, list[str]]] = []
        for i in range(0, len(parents), _BATCH):
            chunk = parents[i : i + _BATCH]
            starts = [partial(self._client.get_children_async, p) for p in chunk]
            for parent, outcome in zip(
                chunk, self._gather("list ledgers", starts, deadline, idempotent=True), strict=True
            ):
                if isinstance(outcome, kz.NoNodeError):
                    continue  # deleted while we walked: it had no ledgers any more
                if isinstance(outcome, kz.ZookeeperError):
                    raise MetadataError(f"listing {parent} failed: {outcome!r}")
                out.append((parent, list(outcome)))
        return out

    def create_ledger_node(self, ledger_id: int, data: bytes) -> int:
        path = self.paths.ledger(ledger_id)
        try:
            self._call(
                f"create {path}",
                lambda: self._client.create_async(path, data, makepath=True),
                idempotent=False,
            )
        except kz.NodeExistsError as e:
            raise NodeExistsError(f"ledger {ledger_id} already exists ({path})") from e
        return 0

    def read_ledger_node(self, ledger_id: int) -> tuple[bytes, int] | None:
        return self._read(self.paths.ledger(ledger_id))

    def read_ledger_nodes(self, ledger_ids: Sequence[int]) -> list[tuple[bytes, int] | None]:
        paths = [self.paths.ledger(lid) for lid in ledger_ids]
        starts = [partial(self._client.get_async, p) for p in paths]
        out: list[tuple[bytes, int] | None] = []
        for path, outcome in zip(paths, self._gather("read ledgers", starts, self._deadline(), idempotent=True),
                                 strict=True):
            if isinstance(outcome, kz.NoNodeError):
                out.append(None)
            elif isinstance(outcome, kz.ZookeeperError):
                raise MetadataError(f"read {path}: {outcome!r}") from outcome
            else:
                out.append((bytes(outcome[0]), int(outcome[1].version)))
        return out

    def write_ledger_node(self, ledger_id: int, data: bytes, version: int) -> int:
        path = self.paths.ledger(ledger_id)
        try:
            stat = self._call(
                f"update {path}",
                partial(self._client.set_async, path, data, version=version),
                idempotent=False,
            )
        except kz.BadVersionError as e:
            raise BadVersionError(f"ledger {ledger_id} changed since version {version} ({path})") from e
        except kz.NoNodeError as e:
            raise NoNodeError(f"ledger {ledger_id} does not exist ({path})") from e
        return int(stat.version)

    def delete_ledger_node(self, ledger_id: int, version: int = -1) -> None:
        self._delete(self.paths.ledger(ledger_id), version, f"ledger {ledger_id}")

    # -- ledger ids (BookKeeper's LongZkLedgerIdGenerator) ------------------------------------
    def generate_ledger_id(self) -> int:
        """``(hob << 32) | seq``: ``seq`` is the number ZooKeeper gives a sequential node created
        (then deleted) under ``<root>/idgen-long/HOB-<hob>``; when it reaches 2**31-1 everyone moves
        to ``HOB-<hob+1>``. Unique because each HOB's counter is, and increasing across HOBs. A
        creation whose answer is lost is retried: its number is simply never used.
        """
        deadline = self._deadline()
        while True:
            hob = self._hob if self._hob is not None else self._current_hob(deadline)
            parent = f"{self.paths.idgen}/{_HOB_PREFIX}{hob:010d}"
            try:
                created = self._call(
                    "generate ledger id",
                    partial(self._client.create_async, f"{parent}/ID-", b"", sequence=True),
                    deadline,
                    idempotent=True,
                )
            except kz.NoNodeError:
                self._hob = None  # the cached HOB node is gone (the tree was reset): look again
                continue
            self._client.delete_async(created)  # best effort: the number is ours either way
            low = int(created.rsplit("ID-", 1)[1])
            if 0 <= low < self._idgen_low_limit:
                self._hob = hob
                if hob or low:  # never hand out id 0
                    return (hob << 32) | low
                continue
            if hob + 1 >= 2**31:
                raise MetadataError("ledger ids are exhausted (all 2**31 high-order-bit ranges used)")
            self._create_if_absent(f"{self.paths.idgen}/{_HOB_PREFIX}{hob + 1:010d}", b"", deadline)
            self._hob = hob + 1

    def _current_hob(self, deadline: float) -> int:
        """The highest ``HOB-<n>`` under the id generator's node; creates ``HOB-0000000000``
        (and the generator's node, for clusters initialised before it existed) if there is none."""
        idgen = self.paths.idgen
        try:
            names = self._call(
                f"list {idgen}", lambda: self._client.get_children_async(idgen), deadline, idempotent=True
            )
        except kz.NoNodeError:
            names = []
        hobs = [int(n[len(_HOB_PREFIX) :]) for n in names if _HOB_RE.fullmatch(n)]
        if hobs:
            return max(hobs)
        root = self.paths.root
        stat = self._call(f"stat {root}", lambda: self._client.exists_async(root), deadline, idempotent=True)
        if stat is None:
            raise NoNodeError(f"no cluster at {root}: run `spark-bookie init` first")
        self._create_if_absent(f"{idgen}/{_HOB_PREFIX}{0:010d}", b"", deadline)
        return 0

    # -- watches ----------------------------------------------------------------------------
    def watch_ledger_metadata(self, ledger_id: int, callback: LedgerWatchCallback) -> Callable[[], None]:
        return self._start_watch(_LedgerZkWatch(self, LedgerWatchState(ledger_id, callback)))

    def watch_bookies(self, callback: BookiesWatchCallback) -> Callable[[], None]:
        return self._start_watch(_BookiesZkWatch(self, BookiesWatchState(callback)))

    def _start_watch(self, watch: _ZkWatch) -> Callable[[], None]:
        """Register ``watch`` (so a reconnection re-arms it) and arm it now, in the caller's thread
        so that an unreachable ZooKeeper or a missing cluster is the caller's error."""
        with self._lock:
            self._check_open("watch")
            self._watches.add(watch)
        try:
            watch.arm(self._deadline(), initial=True)
        except BaseException:
            watch.cancel()
            raise
        return watch.cancel

    def _forget_watch(self, watch: _ZkWatch) -> None:
        """Stop re-arming ``watch`` (it was cancelled, or it ended)."""
        with self._lock:
            self._watches.discard(watch)

    def bookie_info(self, bookie_id: str) -> dict[str, str]:
        for readonly in (False, True):
            got = self._read(self.paths.bookie(bookie_id, readonly=readonly))
            if got is not None:
                return parse_bookie_info(got[0])
        return {}

    # -- application data -------------------------------------------------------------------
    def put_app_data(self, key: str, data: bytes) -> None:
        path = self.paths.app(key)
        deadline = self._deadline()
        # Unconditional set/create are safe to repeat after a lost answer: the outcome is the same.
        for _ in range(3):
            try:
                self._call(f"write {path}", partial(self._client.set_async, path, data), deadline, idempotent=True)
                return
            except kz.NoNodeError:
                pass
            try:
                self._call(
                    f"create {path}",
                    partial(self._client.create_async, path, data, makepath=True),
                    deadline,
                    idempotent=True,
                )
                return
            except kz.NodeExistsError:
                continue  # created meanwhile (or our own retried create): overwrite it
        raise MetadataError(f"{path} keeps being created and deleted concurrently")

    def get_app_data(self, key: str) -> bytes | None:
        got = self._read(self.paths.app(key))
        return None if got is None else got[0]

    def list_app_data(self, key: str) -> list[str]:
        path = self.paths.app(key)
        try:
            names = self._call(f"list {path}", lambda: self._client.get_children_async(path), idempotent=True)
        except kz.NoNodeError:
            return []
        return sorted(names)

    def delete_app_data(self, key: str) -> None:
        self._delete_tree(self.paths.app(key), self._deadline())

    def _delete_tree(self, path: str, deadline: float) -> None:
        try:
            children = self._call(
                f"list {path}", lambda: self._client.get_children_async(path), deadline, idempotent=True
            )
        except kz.NoNodeError:
            return
        for child in children:
            self._delete_tree(f"{path}/{child}", deadline)
        try:
            self._call(f"delete {path}", lambda: self._client.delete_async(path), deadline, idempotent=True)
        except kz.NoNodeError:
            pass
        except kz.NotEmptyError as e:
            raise MetadataError(f"{path} gained children while being deleted") from e

    # -- shared helpers ---------------------------------------------------------------------
    def _read(self, path: str) -> tuple[bytes, int] | None:
        try:
            value, stat = self._call(f"read {path}", lambda: self._client.get_async(path), idempotent=True)
        except kz.NoNodeError:
            return None
        return bytes(value), int(stat.version)

    def _delete(self, path: str, version: int, what: str) -> None:
        try:
            self._call(
                f"delete {path}", lambda: self._client.delete_async(path, version=version), idempotent=False
            )
        except kz.NoNodeError as e:
            raise NoNodeError(f"{what} does not exist ({path})") from e
        except kz.BadVersionError as e:
            raise BadVersionError(f"{what} changed since version {version} ({path})") from e
        except kz.NotEmptyError as e:
            raise MetadataError(f"{what} has children ({path})") from e

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._registrations.clear()
        self._ur_shutdown(tell=True)
        self._connected.set()  # wake waiters so they see the store is closed
        with self._lock:
            watches = list(self._watches)
            self._watches.clear()
        for watch in watches:
            watch.state.cancel()
        try:
            self._client.stop()
            self._client.close()
        except Exception:
            log.exception("error while closing the ZooKeeper client")
        finally:
            self._worker.close()
            self._watch_worker.close()


class _ZkWatch:
    """A ZooKeeper one-shot watch kept armed: re-armed (by re-reading) after each event it
    fires and after each reconnection. Only ever re-armed on the store's watch thread, which is
    also where the reports are delivered; kazoo's thread only queues work."""

    state: LedgerWatchState | BookiesWatchState

    def __init__(self, store: ZkMetadataStore) -> None:
        self.store = store

    def arm(self, deadline: float, *, initial: bool = False) -> None:
        """Read the watched state with a watch set, and queue its report."""
        raise NotImplementedError

    def watcher(self, event: WatchedEvent) -> None:
        """kazoo's thread: never block. A NONE event means the connection dropped (kazoo then
        forgets all watches); the reconnection re-arms every watch, so nothing to do here."""
        if event.type != EventType.NONE and self.state.active:
            self.store._watch_worker.submit(self.refresh)

    def refresh(self) -> None:
        if not self.state.active:
            return
        try:
            self.arm(self.store._deadline())
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not re-arm %r (%s); retrying in %g s", self, e, _REARM_RETRY_S)
            self.store._watch_worker.submit_later(_REARM_RETRY_S, self.refresh)

    def cancel(self) -> None:
        self.state.cancel()
        self.store._forget_watch(self)


class _LedgerZkWatch(_ZkWatch):
    def __init__(self, store: ZkMetadataStore, state: LedgerWatchState) -> None:
        super().__init__(store)
        self.state: LedgerWatchState = state
        self.path = store.paths.ledger(state.ledger_id)

    def __repr__(self) -> str:
        return f"watch of ledger {self.state.ledger_id}"

    def arm(self, deadline: float, *, initial: bool = False) -> None:
        path, client = self.path, self.store._client
        try:
            value, stat = self.store._call(
                f"watch {path}", lambda: client.get_async(path, watch=self.watcher), deadline, idempotent=True
            )
        except kz.NoNodeError:  # the ledger is gone: report it, the watch ends (nothing left armed)
            self.store._forget_watch(self)
            self.store._watch_worker.submit(partial(self.state.deliver, None, -1))
            return
        self.store._watch_worker.submit(partial(self.state.deliver, bytes(value), int(stat.version)))


class _BookiesZkWatch(_ZkWatch):
    def __init__(self, store: ZkMetadataStore, state: BookiesWatchState) -> None:
        super().__init__(store)
        self.state: BookiesWatchState = state

    def __repr__(self) -> str:
        return "watch of the registered bookies"

    def arm(self, deadline: float, *, initial: bool = False) -> None:
        paths = (self.store.paths.available, self.store.paths.available_readonly)
        client = self.store._client
        starts = [partial(client.get_children_async, p, watch=self.watcher, include_data=True) for p in paths]
        outcomes = self.store._gather("watch bookies", starts, deadline, idempotent=True)
        for readonly, path, outcome in zip((False, True), paths, outcomes, strict=True):
            if isinstance(outcome, kz.NoNodeError):
                if initial:
                    raise NoNodeError(f"no cluster at {self.store.paths.root}: run `spark-bookie init` first")
                raise MetadataError(f"{path} disappeared")  # refresh retries until it is back
            if isinstance(outcome, kz.ZookeeperError):
                raise MetadataError(f"watching {path} failed: {outcome!r}")
            names, stat = outcome
            self.store._watch_worker.submit(
                partial(self.state.deliver, readonly, list(names), int(stat.cversion))
            )
