"""The node layer: ZooKeeper's data model, as every store of a session sees it.

Each metadata store is one session on one node layer. The stores on it (:mod:`metadata.cluster`,
:mod:`metadata.ledgers`, :mod:`metadata.streams.store`, :mod:`metadata.underreplication.store`)
are written once, on the operations below; only the node layer differs between ZooKeeper
(:class:`metadata.zk.nodes.ZkNodes`, kazoo) and the in-memory twin
(:class:`metadata.memory.nodes.MemoryNodes`). So the twin and ZooKeeper cannot differ in a
protocol, only in these operations, which the contract suite (tests/contract/test_nodes.py) pins.

The rules every implementation keeps:

- Errors are :mod:`metadata.errors`' (NoNodeError, NodeExistsError, BadVersionError,
  NotEmptyError, MetadataUnavailableError, SessionExpiredError, StoreClosedError,
  MetadataAccessDeniedError), translated here once; nobody above sees kazoo's.
- Every call has a deadline: ZooKeeper down means MetadataUnavailableError, never a hang. Reads
  are retried on a lost connection within it; a write is retried only when the caller says it may
  be (``retry=True``), since the outcome of a write whose answer was lost is unknown.
- Versions are znode versions (0 on create, +1 per write); ``version=-1`` means "any".
- Watches are one-shot, as in ZooKeeper: ``wake(event)`` is called once, on the next change, on a
  backend thread that must never block (so a wake only pokes a condition or queues work).
  ``event.path`` is the node's path, or None when the connection dropped and every watch with it.
  One subscriber passes the same ``wake`` on every call (ZooKeeper keeps one registration per
  path and callback).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from metadata.errors import MetadataError
from metadata.session import SessionListener, SessionWorker

NodeState = tuple[bytes, int, int | None]  # (data, version, ephemeral owner session or None)

#: A one-shot watch callback, called with an event whose ``path`` is the node's (None: the
#: connection dropped). It runs on a backend thread and must not block.
Wake = Callable[[Any], None]


@dataclass(frozen=True)
class Op:
    """One request of a :meth:`Nodes.pipeline` or :meth:`Nodes.multi`: ``create`` (``data``,
    ``ephemeral``), ``set`` (``data``), ``delete``, ``check`` (a multi only: the node exists at
    ``version``) or ``get`` (a pipeline only). ``version`` is a CAS unless -1."""

    kind: str
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


@dataclass(frozen=True)
class NodeStat:
    """What :meth:`Nodes.stat_many` tells of a node without reading its data or children.

    ``version`` is its data's version; ``cversion`` grows with every child created or deleted
    (ZooKeeper's, which a data change of a child leaves alone); ``children`` counts them; and
    ``created`` tells this node from one of the same path deleted and created again (ZooKeeper's
    ``czxid``), whose ``cversion`` restarts at 0. So :attr:`children_stamp` equal at two times
    means no child was created or deleted in between.
    """

    version: int
    cversion: int
    children: int
    created: int

    @property
    def children_stamp(self) -> tuple[int, int]:
        return self.created, self.cversion


class MultiOpFailed(MetadataError):
    """A multi was not applied: op ``index`` failed with ``cause`` (NoNodeError, NodeExistsError,
    BadVersionError, NotEmptyError); ``index`` -1 when ZooKeeper refused the multi as a whole."""

    def __init__(self, index: int, cause: MetadataError) -> None:
        super().__init__(f"op {index}: {cause}")
        self.index, self.cause = index, cause


class Nodes(abc.ABC):
    """One session's view of the tree. Thread-safe; every call may raise the errors above."""

    #: How long a session chore that failed (re-creating a registration, re-arming a watch) waits
    #: before it tries again.
    retry_s: float
    #: The session thread: session listeners are told here, one at a time, in the order the
    #: events happened; stores run their session chores here too.
    worker: SessionWorker

    # -- session -------------------------------------------------------------------------------
    @abc.abstractmethod
    def thread_name(self, role: str) -> str:
        """The name of a store's thread of ``role`` (``""``, ``"-watches"``, ...) on this session."""

    def add_session_listener(self, callback: SessionListener) -> None:
        """Call ``callback(event)`` on :attr:`worker` for each CONNECTED/SUSPENDED/LOST event, in
        the order listeners were added (the stores add theirs first, so a user is told CONNECTED
        once the stores re-created their registrations)."""
        self.worker.add_listener(callback)

    @abc.abstractmethod
    def session(self) -> int | None:
        """The current session's id (None while there is none)."""

    @abc.abstractmethod
    def live_session(self) -> int | None:
        """The session's id if connected right now, else None. A request issued at once (without
        retry) then runs on that session or fails: what lets a lock holder skip re-reading its
        lock node before deleting it."""

    @abc.abstractmethod
    def ensure_live(self, what: str) -> None:
        """Return at once when connected; else wait for a connection within the deadline
        (MetadataUnavailableError), StoreClosedError once closed: answers from a cache must not
        hide an outage."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether :meth:`close_session` was called."""

    @contextlib.contextmanager
    def deadline(self) -> Iterator[None]:
        """Run the requests inside on one deadline (an operation of many requests, such as a walk
        of the ledger tree, is then bounded as a whole). Nothing to bound in memory."""
        yield

    # -- reads ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def get_many(self, paths: list[str]) -> list[NodeState | None]:
        """Each node's ``(data, version, ephemeral owner)``, None if absent; one round trip."""

    def get(self, path: str) -> NodeState | None:
        return self.get_many([path])[0]

    @abc.abstractmethod
    def children_many(self, paths: list[str], *, watch: Wake | None = None) -> list[list[str] | None]:
        """Each node's children (None if absent), in one round trip. ``watch`` arms a child watch
        on each node, which fires when a child is created or deleted, when the node is deleted,
        and, for a node that is absent now, when it is created."""

    def children(self, path: str) -> list[str] | None:
        return self.children_many([path])[0]

    @abc.abstractmethod
    def children_versioned(self, paths: list[str], *, watch: Wake | None = None) -> list[tuple[list[str], int] | None]:
        """:meth:`children_many` with each node's child version (ZooKeeper's ``cversion``, which
        grows with every child created or deleted), so a late listing never replaces a newer one."""

    @abc.abstractmethod
    def stat_many(self, paths: list[str]) -> list[NodeStat | None]:
        """Each node's :class:`NodeStat` (None if absent), in one round trip: ZooKeeper's
        ``exists``, whose answer carries no data and no names, so watching for change in a node
        of many children costs one small request, not a listing."""

    @abc.abstractmethod
    def watch(self, path: str, wake: Wake, *, absent: bool = True) -> NodeState | None:
        """Read ``path`` and arm a one-shot watch calling ``wake`` on its next change (update or
        deletion). When the node is absent: with ``absent`` the watch fires when it is created,
        without it nothing is armed."""

    # -- writes --------------------------------------------------------------------------------
    @abc.abstractmethod
    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
               makepath: bool = False, retry: bool = True) -> str:
        """Create one node and return its path (with the sequence suffix when ``sequential``).
        NodeExistsError if present; NoNodeError if its parent is absent, unless ``makepath``
        (then the missing parents are created, empty and persistent). ``retry``: a lost answer
        is retried (callers then take "exists" as possibly their own); else it is
        MetadataUnavailableError."""

    @abc.abstractmethod
    def set(self, path: str, data: bytes, version: int = -1, *, retry: bool = True) -> int:
        """CAS-update (``version=-1``: any); returns the new version. NoNodeError, BadVersionError."""

    @abc.abstractmethod
    def delete(self, path: str, version: int = -1, *, retry: bool = True) -> None:
        """Delete a childless node (CAS unless ``version=-1``). NoNodeError, BadVersionError,
        NotEmptyError. ``retry=False`` for a CAS delete whose retry could hit a re-created node."""

    @abc.abstractmethod
    def take_sequence(self, prefix: str) -> int:
        """A number from the sequential counter of ``prefix``'s parent, never handed out before:
        in ZooKeeper a sequential node ``<prefix><number>`` created and deleted again (its number
        is used even if the answer to the create was lost and it is retried). NoNodeError if the
        parent is absent."""

    @abc.abstractmethod
    def pipeline(self, ops: list[Op], *, retry: bool) -> list[object]:
        """Send ``ops`` (create, get, delete) together, in order (ZooKeeper applies one session's
        requests in order, so a later op sees the effect of an earlier one), and return one
        outcome per op: a create's path, a get's NodeState (None if absent), a delete's None, or
        the node error as an *instance* (NoNodeError, NodeExistsError, BadVersionError,
        NotEmptyError), never raised. Connection trouble raises: MetadataUnavailableError (after
        retrying the whole batch on a new connection if ``retry``), StoreClosedError."""

    @abc.abstractmethod
    def multi(self, groups: list[list[Op]], *, retry: bool) -> list[MultiOpFailed | None]:
        """Send the groups together, each as one ZooKeeper multi (create, set, delete, check),
        applied whole or not at all; None for each group applied, else why it was not. Connection
        trouble raises as for :meth:`pipeline`."""

    # -- administration ----------------------------------------------------------------------------
    @abc.abstractmethod
    def secure_tree(self, root: str) -> int:
        """Put this session's digest ACL on ``root`` and every node below it; returns how many
        nodes were changed."""

    def tenant_acls_active(self) -> bool:
        """Whether the per-tenant ACL scheme is on (metadata.zk.tenant_acl; the twin has no ACLs)."""
        return False

    def apply_tenant_acls(self, paths: list[str]) -> int:
        """Give each node the ACL the tenant scheme gives it now; how many were set."""
        return 0

    def enable_tenant_acls(self, root: str, member_auth: str) -> int:
        """Turn the tenant ACL scheme on under ``root``; how many nodes were set."""
        return 0

    def register_role(self, root: str, role: str, role_auth: str) -> None:
        """Record a role's public ZooKeeper identity so ACLs can name it (the twin has no ACLs:
        nothing to record)."""
        return None

    @abc.abstractmethod
    def close_session(self) -> bool:
        """Refuse every further call (StoreClosedError); False if it was closed already. The
        stores on this session then wind down, and :meth:`end` ends the session itself."""

    @abc.abstractmethod
    def end(self) -> None:
        """End the session (its ephemeral nodes go at once) and stop the session thread."""
