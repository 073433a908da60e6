"""The bookie's Prometheus metrics, named as BookKeeper names them (BookKeeperServerStats).

Why one object per bookie with its own CollectorRegistry: tests and Spark executors run several
bookies in one Python process, and prometheus_client's default registry would refuse the second
bookie's metrics (duplicate names) or mix their values. `/metrics` serves ``registry``.

Why the add path stays cheap: counters and histograms are updated once per add *batch* (one
journal group for the journal's), never per entry, and everything that is a level rather than an
event (queue size, write cache size, read-only state, free bytes per directory, cache hits) is read
only when Prometheus scrapes, through callbacks and a custom collector, so it costs nothing between
scrapes. `metrics_enabled = false` in the bookie's configuration removes even the per-batch hooks
(`spark-bookie bench bookie` compares the two in one run).

Names: BookKeeper's scope then its constant, e.g. ``bookie_journal_JOURNAL_SYNC`` (scope
``bookie_journal``) and ``bookkeeper_server_ADD_ENTRY`` (scope ``bookkeeper_server``). Counters
carry prometheus_client's ``_total`` suffix in the exposition (``bookie_WRITE_BYTES_total``).
Latencies are in seconds (Prometheus' convention; BookKeeper's own provider uses milliseconds).
Labels are bounded: ``success`` (true/false) and ``dir`` (the directory's index in the
configuration), never a ledger id.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Request latencies: from a fraction of a millisecond (an idle journal) to seconds (a stalled disk).
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0)
# Records per journal group (group commit): 1 at low rates, thousands under load.
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
GC_BUCKETS_S = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0)
GC_METADATA_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000)  # requests or nodes per GC round


@dataclass(frozen=True)
class BookieProbes:
    """Where the scrape-time values come from (callables, so this module imports no storage class)."""

    journal_queue_records: Callable[[], int]
    write_cache_bytes: Callable[[], int]
    read_cache_bytes: Callable[[], int]
    read_cache_hits: Callable[[], int]
    read_cache_misses: Callable[[], int]
    flushed_bytes_total: Callable[[], int]
    flushes_total: Callable[[], int]
    checkpoint_lag_bytes: Callable[[], int]
    read_only: Callable[[], bool]
    ledger_dirs: Sequence[str]
    journal_dirs: Sequence[str]


class _ScrapeTimeCollector(Collector):
    """Levels and running totals read from the bookie when Prometheus scrapes."""

    def __init__(self, probes: BookieProbes) -> None:
        self._p = probes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = self._p
        yield _counter("bookie_read_cache_hits", "Reads answered from the read cache (decoded blocks)",
                       p.read_cache_hits())
        yield _counter("bookie_read_cache_misses", "Reads that had to read and decode an entry-log block",
                       p.read_cache_misses())
        yield _counter("bookie_flush", "Write-cache flushes into entry logs (checkpoints that wrote)",
                       p.flushes_total())
        yield _counter("bookie_flush_size", "Bytes written from the write cache into entry logs",
                       p.flushed_bytes_total())
        for name, dirs in (("bookie_ledger_dir_free_bytes", p.ledger_dirs),
                           ("bookie_journal_dir_free_bytes", p.journal_dirs)):
            g = GaugeMetricFamily(name, "Free bytes on the disk of each directory (label: its index in the "
                                  "configuration)", labels=["dir"])
            for i, d in enumerate(dirs):
                g.add_metric([str(i)], float(_free_bytes(d)))
            yield g


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _free_bytes(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


class BookieMetrics:
    """Every metric of one bookie, in a registry of its own; the hooks the add, read, journal and
    GC paths call (each once per batch, group or round)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.add_latency = Histogram("bookkeeper_server_ADD_ENTRY", "Add batches: receipt to durable answer "
                                     "(seconds, one observation per batch)", ["success"], registry=r,
                                     buckets=LATENCY_BUCKETS_S)
        self.add_requests = Counter("bookkeeper_server_ADD_ENTRY_REQUEST", "Add requests (entries) answered",
                                    ["success"], registry=r)
        self.read_latency = Histogram("bookkeeper_server_READ_ENTRY", "Read requests: receipt to answer "
                                      "(seconds; long polls included)", ["success"], registry=r,
                                      buckets=LATENCY_BUCKETS_S)
        self.read_requests = Counter("bookkeeper_server_READ_ENTRY_REQUEST", "Entries read (a range read "
                                     "counts each entry it returns; a failed read counts one)", ["success"],
                                     registry=r)
        self.write_bytes = Counter("bookie_WRITE_BYTES", "Entry bytes accepted by adds", registry=r)
        self.read_bytes = Counter("bookie_READ_BYTES", "Entry bytes returned by reads", registry=r)
        self.journal_sync = Histogram("bookie_journal_JOURNAL_SYNC", "Journal group write + fdatasync (seconds)",
                                      registry=r, buckets=LATENCY_BUCKETS_S)
        self.journal_grouping = Histogram("bookie_journal_JOURNAL_FORCE_WRITE_GROUPING_COUNT",
                                          "Records made durable by one fdatasync (group commit)", registry=r,
                                          buckets=GROUP_BUCKETS)
        self.journal_write_bytes = Counter("bookie_journal_JOURNAL_WRITE_BYTES", "Bytes written to the journal",
                                           registry=r)
        self.journal_queue = Gauge("bookie_journal_JOURNAL_QUEUE_SIZE", "Records waiting for the journal thread",
                                   registry=r)
        self.write_cache = Gauge("bookie_write_cache_size", "Bytes in the write cache (not yet in entry logs)",
                                 registry=r)
        self.read_cache = Gauge("bookie_read_cache_size", "Bytes of decoded blocks in the read cache", registry=r)
        self.checkpoint_lag = Gauge("bookie_checkpoint_lag_bytes", "Journal bytes written since the last "
                                    "checkpoint mark (what a restart would replay)", registry=r)
        self.server_status = Gauge("bookie_SERVER_STATUS", "1 = writable, 0 = read-only (BookKeeper's "
                                   "SERVER_STATUS)", registry=r)
        self.gc_runtime = Histogram("bookie_gc_THREAD_RUNTIME", "Garbage-collection rounds (seconds)", registry=r,
                                    buckets=GC_BUCKETS_S)
        self.gc_deleted_ledgers = Counter("bookie_gc_DELETED_LEDGER_COUNT", "Ledgers deleted by GC", registry=r)
        self.gc_reclaimed = Counter("bookie_gc_RECLAIMED_SPACE_BYTES", "Bytes of entry logs reclaimed "
                                    "(deleted or compacted away)", registry=r)
        self.gc_compactions = Counter("bookie_gc_COMPACTION_COUNT", "Entry logs compacted", registry=r)
        self.gc_metadata_requests = Histogram(
            "bookie_gc_metadata_requests", "Metadata requests of a GC round's check of the local ledgers "
            "(grows with what changed, not with the cluster)", registry=r, buckets=GC_METADATA_BUCKETS)
        self.gc_metadata_nodes = Histogram(
            "bookie_gc_metadata_nodes", "Metadata nodes a GC round stat'ed, read or listed", registry=r,
            buckets=GC_METADATA_BUCKETS)
        self.write_rate_held = Counter("bookie_write_rate_held_seconds", "Seconds add batches were held for "
                                       "their namespace's write rate (DESIGN §4.10)", ["namespace"], registry=r)
        # Pre-bound children: .labels() is a dict lookup under a lock, too much for every batch.
        self._add_ok, self._add_failed = self.add_latency.labels("true"), self.add_latency.labels("false")
        self._adds_ok, self._adds_failed = self.add_requests.labels("true"), self.add_requests.labels("false")
        self._read_ok, self._read_failed = self.read_latency.labels("true"), self.read_latency.labels("false")
        self._reads_ok, self._reads_failed = self.read_requests.labels("true"), self.read_requests.labels("false")

    @staticmethod
    def empty_registry() -> CollectorRegistry:
        """What a bookie with metrics_enabled = false serves: nothing, in a registry of its own."""
        return CollectorRegistry(auto_describe=True)

    def bind(self, probes: BookieProbes) -> None:
        """Attach the scrape-time values of a started bookie."""
        self.journal_queue.set_function(lambda: float(probes.journal_queue_records()))
        self.write_cache.set_function(lambda: float(probes.write_cache_bytes()))
        self.read_cache.set_function(lambda: float(probes.read_cache_bytes()))
        self.checkpoint_lag.set_function(lambda: float(probes.checkpoint_lag_bytes()))
        self.server_status.set_function(lambda: 0.0 if probes.read_only() else 1.0)
        self.registry.register(_ScrapeTimeCollector(probes))

    # ---- hooks (each once per batch / group / round)

    def adds_done(self, started: float, ok: int, failed: int, nbytes: int) -> None:
        """One add batch answered: `ok` durable adds of `nbytes` bytes, `failed` refused ones."""
        elapsed = time.perf_counter() - started
        if ok:
            self._adds_ok.inc(ok)
            self._add_ok.observe(elapsed)
            self.write_bytes.inc(nbytes)
        if failed:
            self._adds_failed.inc(failed)
            self._add_failed.observe(elapsed)

    def read_done(self, started: float, entries: int, nbytes: int, success: bool) -> None:
        elapsed = time.perf_counter() - started
        if success:
            self._read_ok.observe(elapsed)
            if entries:
                self._reads_ok.inc(entries)
                self.read_bytes.inc(nbytes)
        else:
            self._read_failed.observe(elapsed)
            self._reads_failed.inc()

    def journal_synced(self, seconds: float, records: int, nbytes: int) -> None:
        """Journal.on_sync: one group written and fdatasynced."""
        self.journal_sync.observe(seconds)
        self.journal_grouping.observe(records)
        self.journal_write_bytes.inc(nbytes)

    def write_held(self, namespace: str, seconds: float) -> None:
        self.write_rate_held.labels(namespace).inc(seconds)

    def gc_round(self, seconds: float, ledgers_deleted: int, bytes_reclaimed: int, logs_compacted: int, *,
                 metadata_requests: int = 0, metadata_nodes: int = 0) -> None:
        self.gc_runtime.observe(seconds)
        self.gc_metadata_requests.observe(metadata_requests)
        self.gc_metadata_nodes.observe(metadata_nodes)
        if ledgers_deleted:
            self.gc_deleted_ledgers.inc(ledgers_deleted)
        if bytes_reclaimed:
            self.gc_reclaimed.inc(bytes_reclaimed)
        if logs_compacted:
            self.gc_compactions.inc(logs_compacted)
