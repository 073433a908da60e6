"""The metadata-store interface the bookie (and later the client) programs against.

One interface, two implementations: :class:`metadata.zk.store.ZkMetadataStore` (kazoo, production)
and :class:`metadata.memory.InMemoryMetadataStore` (tests). A contract test suite runs against both
so the twin cannot drift from ZooKeeper's semantics (versions, ephemerals, sessions).
"""

from __future__ import annotations

import abc
import enum
import json
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from types import TracebackType

from metadata.errors import NoNodeError
from metadata.model import LedgerMetadata, decode, encode
from metadata.streams.store import StreamStore
from metadata.underreplication import UnderReplicationStore
from metadata.watches import BookiesWatchCallback, LedgerWatchCallback

log = logging.getLogger(__name__)


class SessionEvent(enum.StrEnum):
    """What a session listener is told; plain strings so callers can compare with "LOST" etc."""

    CONNECTED = "CONNECTED"  # connected (first time, after a suspension, or with a new session)
    SUSPENDED = "SUSPENDED"  # connection lost; the session (and its ephemerals) may still be alive
    LOST = "LOST"  # the session expired: its ephemeral nodes are gone (they will be re-created)


SessionListener = Callable[[str], None]


class MetadataStore(StreamStore, UnderReplicationStore):
    """Cluster metadata operations. Every call has a deadline: ZooKeeper down means
    :class:`~metadata.errors.MetadataUnavailableError`, never a hang.

    Every store is also an :class:`~metadata.underreplication.UnderReplicationStore` (the
    re-replication queue and the auditor election) and a :class:`~metadata.streams.StreamStore`
    (namespaces, streams, segments, writer locks), on the same session.

    Versions are ZooKeeper znode versions (0 on create, +1 per write) and every change takes the
    version it was based on, which is how invariant 5 (every change is a CAS) is enforced.
    """

    # -- cluster ----------------------------------------------------------------------------
    @abc.abstractmethod
    def init_cluster(self) -> str:
        """Create the layout (idempotent, safe to race) and return the cluster's instance id."""

    @abc.abstractmethod
    def instance_id(self) -> str:
        """The cluster's instance id; NoNodeError if the cluster was never initialised."""

    # -- bookie registration ----------------------------------------------------------------
    @abc.abstractmethod
    def register_bookie(self, bookie_id: str, *, readonly: bool, data: bytes = b"", wait_ms_max: int) -> None:
        """Create the ephemeral ``available[/readonly]/<id>`` node and keep it across sessions.

        A node left by a dead process lives until its session times out, so a conflicting node
        is waited for (up to ``wait_ms_max``) before NodeExistsError. After a session is LOST the
        store re-creates its registrations on the new session by itself.
        """

    @abc.abstractmethod
    def unregister_bookie(self, bookie_id: str, *, readonly: bool) -> None:
        """Delete our registration node (if it is ours) and stop re-creating it."""

    @abc.abstractmethod
    def list_bookies(self, readonly: bool = False) -> list[str]:
        """Registered bookie ids, sorted; the writable list excludes the ``readonly`` child."""

    # -- cookies ----------------------------------------------------------------------------
    @abc.abstractmethod
    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        """``(data, version)`` of the bookie's cookie, or None if it has none."""

    @abc.abstractmethod
    def write_cookie(self, bookie_id: str, data: bytes, version: int | None) -> int:
        """Create (``version=None``; NodeExistsError if present) or CAS-update; returns the new version."""

    @abc.abstractmethod
    def delete_cookie(self, bookie_id: str, version: int) -> None:
        """CAS-delete the cookie (``version=-1`` deletes whatever is there); NoNodeError if absent."""

    # -- ledgers ----------------------------------------------------------------------------
    @abc.abstractmethod
    def ledger_ids(self) -> set[int]:
        """Every ledger that has a metadata node. Complete or an exception, never partial:
        the bookie's garbage collector deletes data of ledgers missing from this set."""

    @abc.abstractmethod
    def create_ledger_node(self, ledger_id: int, data: bytes) -> int:
        """Create the ledger's metadata node (NodeExistsError if present); returns its version (0)."""

    @abc.abstractmethod
    def read_ledger_node(self, ledger_id: int) -> tuple[bytes, int] | None:
        """``(data, version)`` of the ledger's metadata node, or None."""

    @abc.abstractmethod
    def write_ledger_node(self, ledger_id: int, data: bytes, version: int) -> int:
        """CAS-update the ledger's metadata node; returns the new version.

        BadVersionError if the node is not at ``version``, NoNodeError if it does not exist.
        """

    @abc.abstractmethod
    def delete_ledger_node(self, ledger_id: int, version: int = -1) -> None:
        """Delete the ledger's metadata node (CAS unless ``version=-1``); NoNodeError if absent."""

    # -- typed ledger metadata (the raw nodes above hold :func:`metadata.model.encode` bytes) --
    @abc.abstractmethod
    def generate_ledger_id(self) -> int:
        """A new ledger id: positive, never handed out before in this cluster, roughly increasing.

        NoNodeError if the cluster was never initialised.
        """

    def create_ledger_metadata(self, md: LedgerMetadata) -> int:
        """Store a new ledger's metadata; returns its version (0). NodeExistsError if the id is taken."""
        return self.create_ledger_node(md.ledger_id, encode(md))

    def read_ledger_nodes(self, ledger_ids: Sequence[int]) -> list[tuple[bytes, int] | None]:
        """read_ledger_node for many ledgers, in order. Backends that can pipeline requests
        override it: a scan of every ledger (the auditor's) then costs one round trip per batch,
        not one per ledger."""
        return [self.read_ledger_node(lid) for lid in ledger_ids]

    def read_ledger_metadata_many(self, ledger_ids: Sequence[int]) -> list[tuple[LedgerMetadata, int] | None]:
        """read_ledger_metadata for many ledgers, in order; None for one that does not exist."""
        return [None if got is None else (decode(got[0], lid), got[1])
                for lid, got in zip(ledger_ids, self.read_ledger_nodes(ledger_ids), strict=True)]

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """``(metadata, version)``; NoNodeError if the ledger does not exist, InvalidMetadataError
        if its node cannot be decoded."""
        got = self.read_ledger_node(ledger_id)
        if got is None:
            raise NoNodeError(f"ledger {ledger_id} does not exist")
        return decode(got[0], ledger_id), got[1]

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        """CAS-replace the ledger's metadata (BadVersionError if it moved on); returns the new version.

        Use :func:`metadata.update.update_ledger` rather than calling this directly: it retries
        lost races through the transition that decides what may change.
        """
        if version < 0:
            raise ValueError(f"ledger metadata is only written by compare-and-set, got version {version}")
        return self.write_ledger_node(md.ledger_id, encode(md), version)

    def delete_ledger_metadata(self, ledger_id: int, version: int = -1) -> None:
        """Delete the ledger's metadata (CAS unless ``version=-1``); NoNodeError if absent."""
        self.delete_ledger_node(ledger_id, version)

    def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending (complete or an exception, like :meth:`ledger_ids`)."""
        return sorted(self.ledger_ids())

    @abc.abstractmethod
    def watch_ledger_metadata(self, ledger_id: int, callback: LedgerWatchCallback) -> Callable[[], None]:
        """Call ``callback(metadata, version)`` now and on every later change of the ledger.

        ``(None, -1)`` is reported once when the ledger does not exist or is deleted, and ends the
        watch. Callbacks run on the store's watch thread (never the ZooKeeper client's), one at a
        time, in order; they survive reconnections and session loss. Returns a cancel function
        (idempotent) after which no callback starts. Raises MetadataUnavailableError if the watch
        could not be set within the store's deadline.
        """

    @abc.abstractmethod
    def watch_bookies(self, callback: BookiesWatchCallback) -> Callable[[], None]:
        """Call ``callback(writable, readonly)`` (sorted bookie ids) now and whenever either changes.

        Same threading, cancel and deadline rules as :meth:`watch_ledger_metadata`; NoNodeError if
        the cluster was never initialised.
        """

    @abc.abstractmethod
    def bookie_info(self, bookie_id: str) -> dict[str, str]:
        """The JSON registration data of a registered bookie (writable or read-only), e.g.
        ``{"id", "address", "network_location"}``; ``{}`` if not registered or not a JSON object."""

    # -- application data -------------------------------------------------------------------
    # A small persistent key-value area under ``<root>/apps`` for the programs that run the cluster
    # (the Spark hosting application keeps its stop request and per-slot status there), so they
    # coordinate through the cluster's own ZooKeeper without a client library of their own.
    # Keys are ``/``-separated names; values are small (ZooKeeper's 1 MB node limit applies).
    @abc.abstractmethod
    def put_app_data(self, key: str, data: bytes) -> None:
        """Create or overwrite ``<root>/apps/<key>`` (parents are created); last writer wins."""

    @abc.abstractmethod
    def get_app_data(self, key: str) -> bytes | None:
        """The value at ``key``; None if there is none."""

    @abc.abstractmethod
    def list_app_data(self, key: str) -> list[str]:
        """The names of ``key``'s children, sorted; [] if ``key`` does not exist."""

    @abc.abstractmethod
    def delete_app_data(self, key: str) -> None:
        """Delete ``key`` and everything below it; no error if it does not exist."""

    # -- session ----------------------------------------------------------------------------
    @abc.abstractmethod
    def add_session_listener(self, callback: SessionListener) -> None:
        """Call ``callback(event)`` on a store thread for each CONNECTED/SUSPENDED/LOST event.

        After a LOST, CONNECTED is reported once the registrations were re-created.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and stop background threads. Idempotent."""

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def parse_bookie_info(data: bytes) -> dict[str, str]:
    """A registration node's JSON object as ``str -> str`` ({} if it is not one): the bookie
    writes what clients need to reach it, and an old or foreign bookie may write nothing."""
    try:
        value = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


class SessionWorker:
    """A single background thread that runs session chores in order.

    Backends report state changes from their own threads (kazoo's connection thread, which must
    never block); the chores (telling listeners, re-creating registrations) run here instead, in
    the order the events happened, and may call back into the store.
    """

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._listeners: list[SessionListener] = []
        self._lock = threading.Lock()
        self._timers: set[threading.Timer] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add_listener(self, callback: SessionListener) -> None:
        with self._lock:
            self._listeners.append(callback)

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread (dropped once closed)."""
        with self._lock:
            if not self._closed:
                self._tasks.put(task)

    def submit_later(self, delay_s: float, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread after ``delay_s`` (used for retries)."""

        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
            self.submit(task)

        timer = threading.Timer(delay_s, fire)
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            self._timers.add(timer)
        timer.start()

    def notify(self, event: SessionEvent) -> None:
        """Queue telling every listener about ``event``."""
        self.submit(lambda: self._notify_now(event))

    def _notify_now(self, event: SessionEvent) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback(str(event))
            except Exception:
                log.exception("metadata session listener %r failed on %s", callback, event)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except Exception:
                log.exception("metadata session task failed")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after the queued tasks; safe to call from the worker thread itself."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timers = list(self._timers)
            self._timers.clear()
            self._tasks.put(None)
        for timer in timers:
            timer.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
