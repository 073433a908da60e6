"""Periodic stream maintenance, run by whichever process is the auditor (one per cluster): the
namespaces' retention (and, where set, tiering of old segments into Delta) applied to every
stream, so that idle streams, whose writers never roll, are trimmed too (DESIGN §4.5).

The steps are the stream layer's own (``Namespace.apply_retention``: a CAS on the stream, so it
races a live writer safely); this only walks the streams on a timer and reports what it did.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ledger_client import LedgerClient, Namespace, errors

log = logging.getLogger(__name__)

# (namespace, stream) -> segments tiered; the Spark jobs package provides one (jobs/stream_tiering.py)
TierStep = Callable[[Namespace, str], int]


@dataclass
class MaintenanceStats:
    passes: int = 0
    segments_deleted: int = 0
    segments_tiered: int = 0
    errors: int = 0


class StreamMaintenance:
    def __init__(self, client: LedgerClient, interval_ms: int, tier: TierStep | None = None) -> None:
        self._client = client
        self._interval_s = interval_ms / 1000
        self._tier = tier
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = MaintenanceStats()

    def start(self) -> None:
        if self._interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="stream-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.run_once()

    def run_once(self) -> MaintenanceStats:
        """One pass over every stream of every namespace."""
        try:
            names = self._client.list_namespaces()
        except errors.LedgerError as e:
            log.warning("stream maintenance: cannot list namespaces: %s", e)
            self.stats.errors += 1
            return self.stats
        for ns_name in names:
            if self._stop.is_set():
                break
            try:
                ns = self._client.namespace(ns_name)
                for stream in ns.list_streams():
                    self._one(ns, stream)
            except errors.NoSuchNamespaceError:
                continue
            except errors.LedgerError as e:
                log.warning("stream maintenance of namespace %s: %s", ns_name, e)
                self.stats.errors += 1
        self.stats.passes += 1
        return self.stats

    def _one(self, ns: Namespace, stream: str) -> None:
        try:
            if self._tier is not None and ns.settings.tier_after_ms is not None:
                self.stats.segments_tiered += self._tier(ns, stream)
            deleted = ns.apply_retention(stream)
            if deleted:
                log.info("stream maintenance: %s/%s: %d segments past retention deleted", ns.name, stream, deleted)
            self.stats.segments_deleted += deleted
        except errors.NoSuchStreamError:
            pass
        except errors.LedgerError as e:
            log.warning("stream maintenance of %s/%s: %s", ns.name, stream, e)
            self.stats.errors += 1
