"""What a bookie knows of the namespaces its ledgers belong to (DESIGN §4.9-4.10).

The access gate needs a ledger's namespace and creator role to decide who may touch it; the fair
share and the write rates need its namespace, its quorum shape and its namespace's rates. All of
it is ledger and namespace metadata in ZooKeeper, read once and kept:

- a ledger's facts never change (namespace, creator, ensemble and write quorum sizes, digest):
  kept in a bounded LRU. Except once: a ledger from before tenants (no namespace, no creator) is
  stamped by `shell migrate-tenants`, so the gate reads such a ledger again after
  UNSTAMPED_RECHECK_S;
- a namespace's rates are kept until a ZooKeeper watch says its node changed (or the session
  dropped every watch), so a new rate reaches every bookie within a round trip.

Two ways to ask. :meth:`ledger` reads ZooKeeper on a miss (the gate: it must decide, and fails
closed). :meth:`peek_ledger` and :meth:`peek_limits` never block: a miss answers None and has the
bookie's executor read the answer for next time, because an add must never wait on ZooKeeper to
learn its turn or its rate (a writer is unthrottled for at most that one read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, NamedTuple

from metadata import MetadataError, MetadataStore, NoNodeError
from metadata.layout import MAX_LEDGER_ID
from spark_bookie.server.rates import NO_LIMITS, RateLimits

log = logging.getLogger(__name__)
LEDGERS_MAX = 100_000
UNSTAMPED_RECHECK_S = 5.0


class LedgerFacts(NamedTuple):
    namespace: str          # "" for a ledger outside any namespace
    owner_role: str
    ensemble_size: int
    write_quorum_size: int
    digest_bytes: int       # the digest's size in each entry's framing

    @property
    def share(self) -> float:
        """How much of the ledger's traffic one bookie of its ensemble sees (Qw/E): a bookie
        charges each add E/Qw of its size, so the namespace's rate holds for the ledger as a whole."""
        return self.write_quorum_size / self.ensemble_size


class NamespaceView:
    """Thread-safe; one per bookie. ``executor`` reads ZooKeeper for the non-blocking lookups."""

    def __init__(self, store: MetadataStore, executor: Executor | None = None,
                 ledgers_max: int = LEDGERS_MAX) -> None:
        self._store = store
        self._executor = executor
        self._ledgers: OrderedDict[int, tuple[LedgerFacts, float]] = OrderedDict()   # (facts, when read)
        self._ledgers_max = ledgers_max
        self._limits: dict[str, RateLimits] = {}
        self._reading: set[object] = set()   # lookups handed to the executor, not finished
        self._generation = 0                  # bumped by every watch: a read racing one is not kept
        self._lock = threading.Lock()
        self.on_namespace_change: list[Callable[[str | None], None]] = []   # (name, or None: all)

    # -- ledgers ---------------------------------------------------------------------------------
    def ledger(self, ledger_id: int) -> LedgerFacts | None:
        """The ledger's facts (None: no such ledger, or no valid id). Reads ZooKeeper on a miss;
        MetadataError if it cannot."""
        if not 0 <= ledger_id <= MAX_LEDGER_ID:
            return None
        with self._lock:
            got = self._ledgers.get(ledger_id)
        if got is not None and (got[0].namespace or got[0].owner_role
                                or time.monotonic() - got[1] < UNSTAMPED_RECHECK_S):
            return got[0]
        try:
            md, _ = self._store.ledgers.read_ledger_metadata(ledger_id)
        except NoNodeError:
            return None   # not cached: the ledger may be created yet
        facts = LedgerFacts(md.namespace, md.owner_role, md.ensemble_size, md.write_quorum_size,
                            md.digest_type.digest_bytes)
        with self._lock:
            self._ledgers[ledger_id] = (facts, time.monotonic())
            while len(self._ledgers) > self._ledgers_max:
                self._ledgers.popitem(last=False)
        return facts

    def peek_ledger(self, ledger_id: int) -> LedgerFacts | None:
        """The ledger's facts if known; else None, and they are read for next time."""
        with self._lock:
            got = self._ledgers.get(ledger_id)
        if got is not None:
            return got[0]
        self._read_later(("ledger", ledger_id), self.ledger, ledger_id)
        return None

    # -- namespaces ------------------------------------------------------------------------------
    def peek_limits(self, namespace: str) -> RateLimits:
        """The namespace's write rates if known (NO_LIMITS until read, and for no namespace)."""
        with self._lock:
            limits = self._limits.get(namespace)
        if limits is not None:
            return limits
        self._read_later(("namespace", namespace), self.limits, namespace)
        return NO_LIMITS

    def limits(self, namespace: str) -> RateLimits:
        """The namespace's write rates, read with a watch on a miss."""
        with self._lock:
            if namespace in self._limits:
                return self._limits[namespace]
            generation = self._generation
        settings = self._store.tenants.watch_settings(namespace, self._namespace_changed)
        limits = NO_LIMITS if settings is None else RateLimits(_rate(settings, "write_rate_bytes_per_s"),
                                                               _rate(settings, "write_rate_records_per_s"))
        with self._lock:
            if generation == self._generation:
                self._limits[namespace] = limits
        return limits

    def _namespace_changed(self, event: Any) -> None:
        """A watched namespace node changed, or the session dropped every watch (a ZooKeeper
        thread: must not block)."""
        path = getattr(event, "path", None)
        name = None if path is None else path.rsplit("/", 1)[-1]
        with self._lock:
            self._generation += 1
            if name is None:
                self._limits.clear()
            else:
                self._limits.pop(name, None)
        for listener in self.on_namespace_change:
            listener(name)

    # -- the executor ----------------------------------------------------------------------------
    def _read_later(self, key: object, read: Callable[[Any], object], arg: Any) -> None:
        if self._executor is None:
            return
        with self._lock:
            if key in self._reading:
                return
            self._reading.add(key)

        def run() -> None:
            try:
                read(arg)
            except MetadataError as e:
                log.info("cannot read %s %s yet: %s", key[0], arg, e)   # type: ignore[index]
            finally:
                with self._lock:
                    self._reading.discard(key)

        try:
            self._executor.submit(run)
        except RuntimeError:   # the executor is shut down: the bookie is stopping
            with self._lock:
                self._reading.discard(key)


def _rate(settings: dict[str, Any], name: str) -> int | None:
    v = settings.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
