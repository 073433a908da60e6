"""Every subscription's backlog (DESIGN §4.11), read by the auditor on a timer for the gauges
``stream_subscription_backlog_records{stream,subscription}`` and
``stream_subscription_backlog_bytes{stream,subscription}`` (recovery/metrics.py).

Why a timer and not the scrape: a stream's backlog is exact (``Namespace.subscriptions``: the
subscriptions' nodes and the stream's segments, and for the segment in progress a LAC and an
entry read), so it costs more than a scrape should pay, per stream. One pass every
``stream_maintenance_interval_ms`` (the auditor's stream timer; 0 = off) reads each stream once,
whatever the number of scrapes and of autorecovery processes (only the auditor runs it). A pass
stops adding series at ``SERIES_MAX`` (a cardinality bound for Prometheus; the rest are logged as
skipped), and a stream whose read fails keeps its previous figures until the next pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from ledger_client import LedgerClient, errors

log = logging.getLogger(__name__)

SERIES_MAX = 10_000   # (stream, subscription) pairs exported at most

Backlogs = Mapping[tuple[str, str], tuple[int, int]]   # ("ns/stream", subscription) -> (records, bytes)


class SubscriptionBacklog:
    def __init__(self, client: LedgerClient, interval_ms: int, series_max: int = SERIES_MAX) -> None:
        self._client = client
        self._interval_s = interval_ms / 1000
        self._series_max = series_max
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._backlogs: dict[tuple[str, str], tuple[int, int]] = {}
        self.passes = 0
        self.errors = 0

    def start(self) -> None:
        if self._interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="subscription-backlog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)

    def snapshot(self) -> dict[tuple[str, str], tuple[int, int]]:
        with self._lock:
            return dict(self._backlogs)

    def _run(self) -> None:
        self.refresh()             # at once: a new auditor's gauges need not wait an interval
        while not self._stop.wait(self._interval_s):
            self.refresh()

    def refresh(self) -> None:
        """One pass over every stream of every namespace; the gauges' figures replaced at its end."""
        try:
            names = self._client.list_namespaces()
        except errors.LedgerError as e:
            log.warning("subscription backlog: cannot list namespaces: %s", e)
            self.errors += 1
            return
        with self._lock:
            previous = dict(self._backlogs)
        fresh: dict[tuple[str, str], tuple[int, int]] = {}
        skipped = 0
        for ns_name in names:
            if self._stop.is_set():
                return
            try:
                ns = self._client.namespace(ns_name)
                streams = ns.list_streams()
            except errors.LedgerError as e:   # deleted since listed, or unreadable: its series go
                if not isinstance(e, errors.NoSuchNamespaceError):
                    log.warning("subscription backlog of namespace %s: %s", ns_name, e)
                    self.errors += 1
                continue
            for stream in streams:
                key = f"{ns_name}/{stream}"
                try:
                    subs = {(key, n): (s.backlog_records, s.backlog_bytes)
                            for n, s in ns.subscriptions(stream).items()}
                except errors.NoSuchStreamError:
                    continue
                except errors.LedgerError as e:
                    log.warning("subscription backlog of %s: %s", key, e)
                    self.errors += 1
                    subs = {k: v for k, v in previous.items() if k[0] == key}
                room = self._series_max - len(fresh)
                if len(subs) > room:
                    skipped += len(subs) - max(room, 0)
                    subs = dict(sorted(subs.items())[:max(room, 0)])
                fresh.update(subs)
        if skipped:
            log.warning("subscription backlog: %d subscriptions over the %d series exported were skipped",
                        skipped, self._series_max)
        with self._lock:
            self._backlogs = fresh
        self.passes += 1
