"""Who the bookies are (a watch on ZooKeeper's `available`) and one connection per bookie."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from metadata import MetadataError, MetadataStore

from .errors import LedgerError
from .placement import BookieNode, node_of
from .transport import BookieClient, StreamLimits
from .transport.add_readers import AddReaders
from .transport.credentials import NO_CREDENTIALS, Credentials

log = logging.getLogger(__name__)


class BookieRegistry:
    """The writable bookies, their network locations and placement groups, kept current by a ZooKeeper watch."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._writable: list[str] = []
        self._readonly: list[str] = []
        self._info: dict[str, dict[str, str]] = {}
        self._nodes: tuple[BookieNode, ...] = ()
        self._changed = threading.Condition(self._lock)
        # Read once in this thread (the watch reports on the store's worker thread, maybe later).
        self._on_change(store.cluster.list_bookies(), store.cluster.list_bookies(readonly=True))
        self._cancel: Callable[[], None] | None = store.cluster.watch_bookies(self._on_change)

    def _on_change(self, writable: list[str], readonly: list[str]) -> None:
        missing = [b for b in writable if b not in self._info]
        try:
            infos = self._store.cluster.bookie_infos(missing) if missing else {}
        except MetadataError:
            infos = {}   # placed without their data for now; read again at the next change
        with self._changed:
            self._writable, self._readonly = list(writable), list(readonly)
            self._info.update(infos)
            self._nodes = tuple(node_of(b, self._info.get(b, {})) for b in self._writable)
            self._changed.notify_all()

    def writable(self) -> list[BookieNode]:
        """Built once per change of the bookies, not per ledger created."""
        return list(self._nodes)

    def writable_ids(self) -> list[str]:
        with self._lock:
            return list(self._writable)

    def readonly_ids(self) -> list[str]:
        with self._lock:
            return list(self._readonly)

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._writable), timeout_s)

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None


class BookiePool:
    """One BookieClient per bookie id, created on first use, closed with the client."""

    def __init__(self, timeout_ms: int, limits: StreamLimits, read_transport: str = "tcp",
                 credentials: Credentials = NO_CREDENTIALS) -> None:
        self._timeout_ms = timeout_ms
        self._credentials = credentials
        self._limits = limits
        self._read_transport = read_transport
        self._clients: dict[str, BookieClient] = {}
        self._lock = threading.Lock()
        self._readers = AddReaders()

    def get(self, bookie_id: str) -> BookieClient:
        c = self._clients.get(bookie_id)
        if c is not None:
            return c
        with self._lock:
            c = self._clients.get(bookie_id)
            if c is None:
                c = BookieClient(bookie_id, timeout_ms=self._timeout_ms, limits=self._limits,
                                 read_transport=self._read_transport, add_readers=self._readers,
                                 credentials=self._credentials)
                self._clients[bookie_id] = c
            return c

    def send_lac(self, bookie_ids: list[str], ledger_id: int, lac: int, key: bytes, body: bytes,
                 journaled: bool) -> None:
        """A writer's explicit LAC (``body``: framed) to its bookies: by WriteLac, which they
        journal, or else announced on their add connections (see WriteHandle.send_explicit_lac)."""
        for b in bookie_ids:
            try:
                c = self.get(b)
                if journaled:
                    c.write_lac(ledger_id, lac, key, body)
                else:
                    c.announce_lac(ledger_id, key, body)
            except LedgerError as e:
                log.debug("explicit LAC of ledger %d to %s failed: %s", ledger_id, b, e)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
        self._readers.close()
