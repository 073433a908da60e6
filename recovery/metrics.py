"""Autorecovery's Prometheus metrics, named after BookKeeper's ReplicationStats (scopes
``auditor`` and ``replication_worker``).

Why a scrape-time collector: every value already exists as a running total (WorkerStats,
AuditorStats, the election count) or lives in ZooKeeper (the under-replication queue), so reading
them when Prometheus scrapes costs the replication path nothing. The queue length is read from
ZooKeeper on each scrape (one getChildren), so every autorecovery process reports the cluster's
figure, not only the auditor.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ledger_client.stream.quota import read_all_usage
from recovery.replicas_check import ReplicasTally

if TYPE_CHECKING:
    from recovery.auditor import AuditorStats
    from recovery.autorecovery import AutoRecovery

log = logging.getLogger(__name__)

WORKER_COUNTERS = (
    ("ledgers_replicated", "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
     "Ledgers whose missing fragments this process re-replicated"),
    ("fragments_repaired", "replication_worker_NUM_FRAGMENTS_REPLICATED", "Fragments re-replicated"),
    ("entries_copied", "replication_worker_NUM_ENTRIES_WRITTEN", "Entries written to new bookies"),
    ("bytes_copied", "replication_worker_NUM_BYTES_WRITTEN", "Entry bytes written to new bookies"),
    ("ledgers_fenced", "replication_worker_NUM_DEFER_LEDGER_LOCK_RELEASE_OF_FAILED_LEDGER",
     "Open ledgers fenced and closed after their grace period"),
    ("failures", "replication_worker_REPLICATE_EXCEPTION", "Re-replication attempts that failed"),
)


class AutoRecoveryCollector(Collector):
    def __init__(self, ar: AutoRecovery) -> None:
        self._ar = ar

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        ar = self._ar
        worker = ar.worker
        stats = worker.stats.snapshot() if worker is not None else {}
        for key, name, doc in WORKER_COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(stats.get(key, 0)))
        yield CounterMetricFamily("auditor_ELECTION_ATTEMPTS", "Auditor elections this process won",
                                  value=float(ar.elections_won))
        yield GaugeMetricFamily("auditor_IS_AUDITOR", "1 while this process is the cluster's auditor",
                                value=1.0 if ar.is_auditor else 0.0)
        audit = ar.auditor_stats
        yield CounterMetricFamily("auditor_AUDIT_RUNS", "Audits of lost bookies run by this auditor",
                                  value=float(audit.audits if audit is not None else 0))
        yield CounterMetricFamily("auditor_LEDGERS_MARKED_UNDER_REPLICATED", "Ledgers this auditor marked",
                                  value=float(audit.ledgers_marked if audit is not None else 0))
        adhering = float(audit.ledgers_not_adhering if audit is not None else 0)
        # BookKeeper's name in its auditor scope; DESIGN §4.10 spells it all in capitals: both are served.
        for name in ("auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY",
                     "AUDITOR_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY"):
            yield GaugeMetricFamily(name, "Closed ledgers whose copies break their placement groups (last check)",
                                    value=adhering)
        yield from self._replicas(audit)
        queued = self._queue_length()
        if queued is not None:
            yield GaugeMetricFamily("auditor_NUM_UNDER_REPLICATED_LEDGERS",
                                    "Ledgers in the cluster's under-replication queue", value=float(queued))
        yield from self._storage()
        yield from self._subscriptions()

    def _replicas(self, audit: AuditorStats | None) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The last replicas check's ledger counts under BookKeeper's names (recovery/replicas_check.py)."""
        tally = audit.replicas if audit is not None else ReplicasTally()
        yield CounterMetricFamily("auditor_REPLICAS_CHECK_RUNS", "Replicas checks run by this auditor",
                                  value=float(audit.replicas_checks if audit is not None else 0))
        for name, value, doc in (
                ("NO_REPLICA_OF_AN_ENTRY", tally.ledgers_no_replica, "no bookie of its write set holds"),
                ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", tally.ledgers_below_ack_quorum, "fewer than Qa bookies hold"),
                ("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", tally.ledgers_below_write_quorum, "fewer than Qw bookies hold")):
            yield GaugeMetricFamily(f"auditor_NUM_LEDGERS_HAVING_{name}",
                                    f"Ledgers with an entry that {doc} (last replicas check)", value=float(value))

    def _storage(self) -> Iterator[GaugeMetricFamily]:
        """Each namespace's bytes on bookies and its storage quota (DESIGN §4.10), read from
        ZooKeeper at scrape time (a listing and one pipelined read per namespace: stream/quota.py)
        by the auditor only, so that a cluster's autorecovery processes do not each scan every
        namespace; a namespace without a quota has no quota sample."""
        store = self._ar.store
        if store is None or not self._ar.is_auditor:
            return
        try:
            usages = read_all_usage(store)
        except Exception as e:  # ZooKeeper away: the scrape goes on without these
            log.debug("namespace storage usage unreadable: %s", e)
            return
        used = GaugeMetricFamily("namespace_storage_used_bytes", "Bytes of a namespace's segments held on bookies "
                                 "(one copy; tiered segments not counted)", labels=["namespace"])
        quota = GaugeMetricFamily("namespace_storage_quota_bytes", "A namespace's storage_quota_bytes",
                                  labels=["namespace"])
        for u in usages:
            used.add_metric([u.namespace], float(u.used_bytes))
            if u.quota_bytes is not None:
                quota.add_metric([u.namespace], float(u.quota_bytes))
        yield used
        yield quota

    def _subscriptions(self) -> Iterator[GaugeMetricFamily]:
        """Each subscription's backlog (DESIGN §4.11) as the auditor's timer last read it
        (recovery/subscription_backlog.py): the scrape itself reads nothing."""
        backlogs = self._ar.subscription_backlogs
        records = GaugeMetricFamily("stream_subscription_backlog_records", "Records of a stream after its "
                                    "subscription's position", labels=["stream", "subscription"])
        size = GaugeMetricFamily("stream_subscription_backlog_bytes", "Bytes of the records after a "
                                 "subscription's position", labels=["stream", "subscription"])
        for (stream, sub), (n, b) in sorted(backlogs.items()):
            records.add_metric([stream, sub], float(n))
            size.add_metric([stream, sub], float(b))
        yield records
        yield size

    def _queue_length(self) -> int | None:
        store = self._ar.store
        if store is None:
            return None
        try:
            return len(store.underreplication.list_underreplicated())
        except Exception as e:  # ZooKeeper away: the scrape goes on without this one
            log.debug("under-replication queue unreadable: %s", e)
            return None


def autorecovery_registry(ar: AutoRecovery, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """A registry (a new one by default: several processes' worth may share a Python process)
    holding ``ar``'s metrics."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    registry.register(AutoRecoveryCollector(ar))
    return registry
