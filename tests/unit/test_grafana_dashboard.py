"""deploy/grafana/spark-bookie.json: every PromQL expression names only metrics the bookie,
autorecovery and replicator processes really export (their collectors, asked for their sample names)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from jobs.replication_monitor import Monitor
from metadata.streams import encode_settings
from recovery.metrics import autorecovery_registry
from recovery.worker import WorkerStats
from spark_bookie.server.metrics import BookieMetrics, BookieProbes

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "spark-bookie.json"
OUR_METRIC = re.compile(r"\b(?:bookie|bookkeeper_server|auditor|replication|namespace|stream)_[A-Za-z0-9_]+")


def _exported(tmp_path: Path) -> set[str]:
    m = BookieMetrics()
    m.bind(BookieProbes(journal_queue_records=lambda: 0, write_cache_bytes=lambda: 0, read_cache_bytes=lambda: 0,
                        read_cache_hits=lambda: 0, read_cache_misses=lambda: 0, flushed_bytes_total=lambda: 0,
                        flushes_total=lambda: 0, checkpoint_lag_bytes=lambda: 0, read_only=lambda: False,
                        ledger_dirs=[str(tmp_path)], journal_dirs=[str(tmp_path)]))
    settings = encode_settings({"storage_quota_bytes": 1_000})   # one namespace with a quota, no streams
    streams = SimpleNamespace(list_namespaces=lambda: ["ns"], read_stream_heads=lambda ns: (settings, {}))
    store = SimpleNamespace(underreplication=SimpleNamespace(list_underreplicated=lambda: {}), streams=streams)
    ar = SimpleNamespace(worker=SimpleNamespace(stats=WorkerStats()), elections_won=1, is_auditor=True,
                         auditor_stats=None, store=store,
                         subscription_backlogs={("ns/orders", "billing"): (12, 1_200)})
    rep = Monitor(SimpleNamespace(), None, None, None)  # type: ignore[arg-type]  # the replicator's /metrics
    rep.lag_records.labels("ns/orders").set(3)
    rep.lag_seconds.labels("ns/orders").set(0.5)
    registries: list[CollectorRegistry] = [m.registry, autorecovery_registry(ar), rep.registry]  # type: ignore[arg-type]
    return {s.name for r in registries for f in r.collect() for s in f.samples}


def test_every_query_names_an_exported_metric(tmp_path):
    exported = _exported(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 9
    wanted = {"bookie_journal_JOURNAL_SYNC_bucket", "bookkeeper_server_ADD_ENTRY_bucket",
              "auditor_NUM_UNDER_REPLICATED_LEDGERS", "bookie_ledger_dir_free_bytes", "bookie_SERVER_STATUS",
              "namespace_storage_used_bytes", "namespace_storage_quota_bytes",
              "stream_subscription_backlog_records", "replication_lag_records", "replication_lag_seconds"}
    named: set[str] = set()
    for expr in exprs:
        names = set(OUR_METRIC.findall(expr))
        assert names, f"no spark-bookie metric in {expr!r}"
        assert names <= exported, f"{expr!r} names {sorted(names - exported)}, not exported"
        named |= names
    assert wanted <= named, f"the dashboard lacks {sorted(wanted - named)}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
