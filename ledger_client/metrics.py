"""Client metrics with BookKeeper's names (BookKeeperClientStats, scope ``bookkeeper_client``),
for an application that wants them: it passes ``ClientMetrics(registry)`` to LedgerClient and
serves its own registry (e.g. prometheus_client.start_http_server(port, registry=registry)).

Why opt-in: the append path is the client's hot path, and a histogram observation per entry
(about a microsecond) is a few percent of a pipelined append's client CPU; without metrics
(the default) every hook is one ``is None`` test. Append latency runs from append_async to its
future's completion (from the resend after an ensemble change); read latency is per read()
call. Labels: none (never a ledger id).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ClientMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.add_latency = Histogram("bookkeeper_client_ADD_ENTRY", "Append: append_async to durable (seconds)",
                                     registry=r, buckets=LATENCY_BUCKETS_S)
        self.read_latency = Histogram("bookkeeper_client_READ_ENTRY", "read() / read_unconfirmed() call (seconds)",
                                      registry=r, buckets=LATENCY_BUCKETS_S)
        self.ensemble_changes = Counter("bookkeeper_client_NUM_ENSEMBLE_CHANGE", "Ensemble changes of writers",
                                        registry=r)
        self.speculative_reads = Counter("bookkeeper_client_SPECULATIVE_READ_COUNT",
                                         "Reads sent to a further replica because the first was slow or failed",
                                         registry=r)
        self.creates = Counter("bookkeeper_client_LEDGER_CREATE", "Ledgers created", registry=r)
        self.opens = Counter("bookkeeper_client_LEDGER_OPEN", "Ledgers opened without recovery", registry=r)
        self.recovery_opens = Counter("bookkeeper_client_LEDGER_RECOVER", "Ledgers opened with recovery (fenced "
                                      "and closed when open)", registry=r)
        self.deletes = Counter("bookkeeper_client_LEDGER_DELETE", "Ledgers deleted", registry=r)
        # Streams (DistributedLog's writer and reader stats; no per-stream label: names are unbounded).
        self.stream_records_written = Counter("stream_RECORDS_WRITTEN", "Stream records acknowledged to writers",
                                              registry=r)
        self.stream_records_read = Counter("stream_RECORDS_READ", "Stream records returned to readers", registry=r)
        self.stream_segments_rolled = Counter("stream_SEGMENTS_ROLLED", "Stream segments sealed by a roll to a new "
                                              "one", registry=r)
        self.stream_truncations = Counter("stream_TRUNCATIONS", "Stream truncations committed by writers",
                                          registry=r)
        self.stream_backlog_dropped_segments = Counter(
            "stream_BACKLOG_DROPPED_SEGMENTS", "Stream segments deleted by a backlog quota's drop_oldest", registry=r)
        self.stream_subscriptions_moved = Counter(
            "stream_SUBSCRIPTIONS_MOVED", "Subscriptions moved to a stream's new start by a backlog quota's "
            "drop_oldest (their records were deleted unconsumed)", registry=r)

    def appended(self, latencies_s: list[float]) -> None:
        """A drained batch of completed appends (one call per batch, one observation per entry)."""
        observe = self.add_latency.observe
        for s in latencies_s:
            observe(s)
