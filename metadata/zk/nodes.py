"""The ZooKeeper node layer (kazoo, which only the modules of this package import).

Two rules shape it. Every call is bounded by a deadline (kazoo alone would queue a request until a
connection comes back, i.e. forever when ZooKeeper is down). And nothing blocking runs in kazoo's
connection thread: state changes are handed to the session thread (:attr:`ZkNodes.worker`), which
tells the listeners; watch callbacks only poke a condition or queue work. kazoo's errors are
translated into :mod:`metadata.errors` here, once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from metadata.errors import (
    BadVersionError,
    InvalidConnectStringError,
    MetadataAccessDeniedError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    StoreClosedError,
)
from metadata.layout import ConnectInfo
from metadata.nodes import MultiOpFailed, Nodes, NodeStat, NodeState, Op, Wake
from metadata.session import SessionEvent, SessionWorker
from metadata.tls import ZkTls
from metadata.zk.acl import client_options, secured_acl, walk
from metadata.zk.handler import PollingHandler
from metadata.zk.tenant_acl import ROLES, SECURITY, STRUCTURE, TenantAclPolicy, digest_id, security_doc

log = logging.getLogger(__name__)

_TRANSIENT = (kz.ConnectionLoss, kz.OperationTimeoutError, kz.SessionMovedError)
_RECHECKS_MAX = 10  # a node appearing and disappearing under a watch this many times in a row is an error


def translate(e: kz.ZookeeperError, path: str) -> MetadataError:
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


def _tls_options(zk_tls: ZkTls | None) -> dict[str, Any]:
    """KazooClient keyword arguments for TLS: ZooKeeper's certificate is checked against the CA and
    against the host name dialled; the files are loaded here first (ZkTlsError), since kazoo would
    only retry a file it cannot load until the connect timeout."""
    if zk_tls is None:
        return {}
    zk_tls.check()
    return {"use_ssl": True, "ca": zk_tls.ca_path, "certfile": zk_tls.cert_path, "keyfile": zk_tls.key_path,
            "verify_certs": True, "check_hostname": True}


def _node_state(value: Any, stat: Any) -> NodeState:
    return bytes(value), int(stat.version), int(stat.ephemeralOwner) or None


class ZkNodes(Nodes):
    """:class:`~metadata.nodes.Nodes` on a ZooKeeper ensemble; one kazoo session.

    ``op_timeout_ms`` (default: the session timeout) bounds every call, waiting for a connection
    included. Reads are retried on connection loss within that deadline; a write that loses its
    connection is retried only when its caller allows it, else it raises MetadataUnavailableError
    because its outcome is unknown. The session starts with :meth:`start`.
    """

    retry_s = 1.0

    def __init__(self, info: ConnectInfo, *, session_timeout_ms: int, op_timeout_ms: int | None,
                 zk_auth: str | None, zk_tls: ZkTls | None = None, zk_member_auth: str | None = None) -> None:
        """``zk_member_auth``: the members' credentials a role's session adds to its own
        (metadata.zk.tenant_acl)."""
        acl_options = client_options(zk_auth, zk_member_auth)   # checked before anything starts
        tls_options = _tls_options(zk_tls)
        self.connect_info = info
        self._zk_auth = zk_auth
        self._op_timeout_s = (op_timeout_ms if op_timeout_ms is not None else session_timeout_ms) / 1000
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._closed = False
        self._local = threading.local()   # the deadline of a deadline() block, per thread
        self.worker = SessionWorker(self.thread_name(""))
        self._client = KazooClient(
            hosts=info.hosts_string,
            timeout=session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
            handler=PollingHandler(),
            **acl_options,
            **tls_options,
        )
        self._client.add_listener(self._on_state)
        self._policy = TenantAclPolicy(info.root, self._read_plain)

    def thread_name(self, role: str) -> str:
        return f"zk-metadata{role}[{self.connect_info.hosts_string}]"

    def start(self, connect_timeout_ms: int) -> None:
        """Connect; MetadataUnavailableError if ZooKeeper cannot be reached in time."""
        try:
            self._client.start(timeout=connect_timeout_ms / 1000)
        except KazooTimeoutError as e:
            raise MetadataUnavailableError(
                f"could not connect to ZooKeeper at {self.connect_info.hosts_string} within {connect_timeout_ms} ms"
            ) from e

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """kazoo's ``(session id, password)`` of the current session (for fault injection)."""
        return self._client.client_id  # type: ignore[no-any-return]

    # -- session events (kazoo's thread: never block here) ------------------------------------
    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.CONNECTED:
            self._connected.set()
            self.worker.notify(SessionEvent.CONNECTED)
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
            self.worker.notify(SessionEvent.SUSPENDED)
        else:
            self._connected.clear()
            self.worker.notify(SessionEvent.LOST)

    def session(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def live_session(self) -> int | None:
        return self.session() if self._connected.is_set() else None

    def ensure_live(self, what: str) -> None:
        self._await_connected(what, self._deadline())

    @property
    def closed(self) -> bool:
        return self._closed

    def close_session(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self._connected.set()  # wake waiters so they see the store is closed
        return True

    def end(self) -> None:
        try:
            self._client.stop()
            self._client.close()
        except Exception:
            log.exception("error while closing the ZooKeeper client")
        finally:
            self.worker.close()

    # -- plumbing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def deadline(self) -> Iterator[None]:
        outer = getattr(self._local, "deadline", None)
        if outer is None:
            self._local.deadline = time.monotonic() + self._op_timeout_s
        try:
            yield
        finally:
            if outer is None:
                self._local.deadline = None

    def _deadline(self) -> float:
        scoped: float | None = getattr(self._local, "deadline", None)
        return scoped if scoped is not None else time.monotonic() + self._op_timeout_s

    def _gather(self, what: str, starts: Sequence[Callable[[], Any]], *, idempotent: bool,
                deadline: float | None = None) -> list[Any]:
        """Issue the requests together and return their results in order.

        A ZooKeeper answer that is an error about the node (NoNode, NodeExists, BadVersion, ...)
        is returned as the exception object, for the caller to translate with context; losing the
        connection retries the whole batch if ``idempotent``, else raises MetadataUnavailableError.
        """
        deadline = deadline or self._deadline()
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

    def _call(self, what: str, path: str, start: Callable[[], Any], *, idempotent: bool = True,
              deadline: float | None = None) -> Any:
        """One request through :meth:`_gather`; a node error is raised, translated."""
        outcome = self._gather(f"{what} {path}", [start], idempotent=idempotent, deadline=deadline)[0]
        if isinstance(outcome, kz.ZookeeperError):
            raise translate(outcome, path) from outcome
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

    # -- reads ---------------------------------------------------------------------------------
    def get_many(self, paths: list[str]) -> list[NodeState | None]:
        starts = [partial(self._client.get_async, p) for p in paths]
        out: list[NodeState | None] = []
        for path, outcome in zip(paths, self._gather(f"read {paths[0] if paths else ''}", starts, idempotent=True),
                                 strict=True):
            if isinstance(outcome, kz.NoNodeError):
                out.append(None)
            elif isinstance(outcome, kz.ZookeeperError):
                raise translate(outcome, path) from outcome
            else:
                out.append(_node_state(*outcome))
        return out

    def stat_many(self, paths: list[str]) -> list[NodeStat | None]:
        starts = [partial(self._client.exists_async, p) for p in paths]
        out: list[NodeStat | None] = []
        for path, st in zip(paths, self._gather(f"stat {paths[0] if paths else ''}", starts, idempotent=True),
                            strict=True):
            if isinstance(st, kz.ZookeeperError):
                raise translate(st, path) from st
            out.append(None if st is None else NodeStat(int(st.version), int(st.cversion), int(st.numChildren),
                                                        int(st.czxid)))
        return out

    def _listings(self, paths: list[str], watch: Wake | None) -> list[tuple[list[str], int] | None]:
        starts = [partial(self._client.get_children_async, p, watch=watch, include_data=True) for p in paths]
        out: list[tuple[list[str], int] | None] = []
        for path, outcome in zip(paths, self._gather(f"list {paths[0] if paths else ''}", starts, idempotent=True),
                                 strict=True):
            if isinstance(outcome, kz.NoNodeError):
                out.append(None if watch is None else self._watch_absent(path, watch))
            elif isinstance(outcome, kz.ZookeeperError):
                raise translate(outcome, path) from outcome
            else:
                names, stat = outcome
                out.append((list(names), int(stat.cversion)))
        return out

    def _watch_absent(self, path: str, watch: Wake) -> tuple[list[str], int] | None:
        """A missing node arms no child watch: arm an exists watch (it fires when the node is
        created) so the subscriber still hears of it."""
        for _ in range(_RECHECKS_MAX):
            if self._call("watch", path, partial(self._client.exists_async, path, watch=watch)) is None:
                return None
            try:  # created meanwhile: list it after all
                names, stat = self._call("list", path, partial(self._client.get_children_async, path, watch=watch,
                                                               include_data=True))
                return list(names), int(stat.cversion)
            except NoNodeError:
                continue
        raise MetadataError(f"list {path}: the node kept appearing and disappearing")

    def children_many(self, paths: list[str], *, watch: Wake | None = None) -> list[list[str] | None]:
        return [None if got is None else got[0] for got in self._listings(paths, watch)]

    def children_versioned(self, paths: list[str], *, watch: Wake | None = None) -> list[tuple[list[str], int] | None]:
        return self._listings(paths, watch)

    def watch(self, path: str, wake: Wake, *, absent: bool = True) -> NodeState | None:
        """getData with a watch; when absent (and ``absent``), exists with a watch (which fires on creation)."""
        for _ in range(_RECHECKS_MAX):
            try:
                return _node_state(*self._call("watch", path, partial(self._client.get_async, path, watch=wake)))
            except NoNodeError:
                if not absent:
                    return None
            if self._call("watch", path, partial(self._client.exists_async, path, watch=wake)) is None:
                return None
        raise MetadataError(f"watch {path}: the node kept appearing and disappearing")

    # -- writes --------------------------------------------------------------------------------
    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               makepath: bool = False, retry: bool = True) -> str:
        acl = self._policy.acl_for(path, data)
        start = partial(self._client.create_async, path, data, acl=acl, ephemeral=ephemeral, sequence=sequential,
                        makepath=makepath and acl is None)
        if acl is None or not makepath:
            return str(self._call("create", path, start, idempotent=retry))
        try:   # parents usually exist: try first, and make them (each with its own ACL) only if not
            return str(self._call("create", path, start, idempotent=retry))
        except NoNodeError:
            self._make_parents(path)
            return str(self._call("create", path, start, idempotent=retry))

    def _make_parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if self._read_plain(parent) is not None:
                continue
            try:
                self._call("create", parent, partial(self._client.create_async, parent, b"",
                                                     acl=self._policy.acl_for(parent)))
            except NodeExistsError:
                pass

    def _read_plain(self, path: str) -> bytes | None:
        """A node's data, or None when it is absent (or this session may not read it)."""
        try:
            return bytes(self._call("read", path, partial(self._client.get_async, path))[0])
        except (NoNodeError, MetadataAccessDeniedError):
            return None

    def set(self, path: str, data: bytes, version: int = -1, *, retry: bool = True) -> int:
        stat = self._call("update", path, partial(self._client.set_async, path, data, version=version),
                          idempotent=retry)
        return int(stat.version)

    def delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        self._call("delete", path, partial(self._client.delete_async, path, version=version), idempotent=retry)

    def take_sequence(self, prefix: str) -> int:
        created = self.create(prefix, sequential=True, retry=True)
        self._client.delete_async(created)  # best effort: the number is ours either way
        return int(created[len(prefix):])

    def pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        starts: list[Callable[[], Any]] = []
        for op in ops:
            if op.kind == "create":
                starts.append(partial(self._client.create_async, op.path, op.data, ephemeral=op.ephemeral,
                                      acl=self._policy.acl_for(op.path, op.data)))
            elif op.kind == "get":
                starts.append(partial(self._client.get_async, op.path))
            elif op.kind == "delete":
                starts.append(partial(self._client.delete_async, op.path, version=op.version))
            else:
                raise ValueError(f"unknown pipelined request {op.kind!r}")
        out: list[object] = []
        for op, outcome in zip(ops, self._gather(f"{len(ops)} requests", starts, idempotent=retry), strict=True):
            if isinstance(outcome, kz.ZookeeperError):
                if op.kind == "get" and isinstance(outcome, kz.NoNodeError):
                    out.append(None)
                    continue
                error = translate(outcome, op.path)
                if type(error) is MetadataError:  # not an answer about the node: give up
                    raise error from outcome
                out.append(error)
            elif op.kind == "create":
                out.append(str(outcome))
            elif op.kind == "get":
                out.append(_node_state(*outcome))
            else:
                out.append(None)
        return out

    def multi(self, groups: list[list[Op]], *, retry: bool) -> list[MultiOpFailed | None]:
        acls = {op.path: self._policy.acl_for(op.path, op.data) for ops in groups for op in ops if op.kind == "create"}

        def start(ops: list[Op]) -> Any:
            tx = self._client.transaction()
            for op in ops:
                if op.kind == "create":
                    tx.create(op.path, op.data, ephemeral=op.ephemeral, acl=acls[op.path])
                elif op.kind == "set":
                    tx.set_data(op.path, op.data, version=op.version)
                elif op.kind == "delete":
                    tx.delete(op.path, version=op.version)
                elif op.kind == "check":
                    tx.check(op.path, version=op.version)
                else:
                    raise ValueError(f"a multi holds create, set, delete and check, not {op.kind!r}")
            return tx.commit_async()

        outcomes = self._gather("multi", [partial(start, ops) for ops in groups], idempotent=retry)
        out: list[MultiOpFailed | None] = []
        for ops, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, kz.ZookeeperError):   # the multi as a whole was refused
                error = translate(outcome, "a multi")
                if type(error) is MetadataError:
                    raise error from outcome
                out.append(MultiOpFailed(-1, error))
                continue
            failed = None   # one result per op: the failing op's error and RolledBackError if it failed
            for i, (op, result) in enumerate(zip(ops, outcome, strict=True)):
                if isinstance(result, kz.ZookeeperError) and not isinstance(result, kz.RolledBackError):
                    error = translate(result, op.path)
                    if type(error) is MetadataError:
                        raise error from result
                    failed = MultiOpFailed(i, error)
                    break
            out.append(failed)
        return out

    # -- administration ----------------------------------------------------------------------------
    def tenant_acls_active(self) -> bool:
        return self._policy.active()

    def apply_tenant_acls(self, paths: list[str]) -> int:
        """Set on each node the ACL the tenant scheme gives it now (after a grant or revoke);
        how many were set. Nodes gone meanwhile are skipped."""
        if not self._policy.active():
            return 0
        done = 0
        for path in paths:
            data = self._read_plain(path)
            acl = self._policy.acl_for(path, data or b"") if data is not None else None
            if acl is None:
                continue
            try:
                self._call("set the ACL of", path, partial(self._client.set_acls_async, path, acl))
                done += 1
            except NoNodeError:
                continue
        return done

    def enable_tenant_acls(self, root: str, member_auth: str) -> int:
        """Turn the tenant scheme on (this session holds the superuser's zk_auth): record the
        superuser's and the members' digests in ``<root>/SECURITY`` and give every node under the
        root the ACL the scheme gives it. Idempotent; returns how many nodes were set."""
        if self._zk_auth is None:
            raise InvalidConnectStringError("the tenant ACLs need zk_auth (the superuser's credentials)")
        doc = security_doc(self._zk_auth, member_auth)
        path = f"{root.rstrip('/')}/{SECURITY}"
        try:
            self.create(path, doc)
        except NodeExistsError:
            self.set(path, doc)
        self._policy.forget()
        for name in STRUCTURE:   # parents members create under, which only the superuser may create
            try:
                self.create(f"{root.rstrip('/')}/{name}")
            except NodeExistsError:
                pass
        deadline = time.monotonic() + max(self._op_timeout_s, 600.0)

        def children(p: str) -> list[str]:
            try:
                return list(self._call("list", p, partial(self._client.get_children_async, p), deadline=deadline))
            except NoNodeError:
                return []

        with self.deadline():
            return self.apply_tenant_acls(walk(children, root))

    def register_role(self, root: str, role: str, role_auth: str) -> None:
        """Record a role's public digest (``<root>/roles/<role>``) so ACLs can name it;
        NodeExistsError when the role is registered already."""
        parent = f"{root.rstrip('/')}/{ROLES}"
        try:
            self.create(parent)
        except NodeExistsError:
            pass
        self.create(f"{parent}/{role}", digest_id(role_auth).encode())

    def secure_tree(self, root: str) -> int:
        """Put this session's digest ACL on ``root`` and every node under it (an open cluster
        becomes a secured one). Ephemeral registrations are included: they are re-created with
        the ACL anyway when their owners use zk_auth."""
        if self._zk_auth is None:
            raise InvalidConnectStringError("securing the metadata needs zk_auth (the credentials to grant)")
        acl = secured_acl(self._zk_auth)
        deadline = time.monotonic() + max(self._op_timeout_s, 60.0)

        def children(path: str) -> list[str]:
            try:
                return list(self._call("list", path, partial(self._client.get_children_async, path),
                                       deadline=deadline))
            except NoNodeError:
                return []

        paths = walk(children, root)
        for path in paths:
            try:
                self._call("set the ACL of", path, partial(self._client.set_acls_async, path, acl), deadline=deadline)
            except NoNodeError:
                continue   # deleted meanwhile
        return len(paths)
