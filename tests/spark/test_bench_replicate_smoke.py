"""`spark-bookie bench replicate --quick` runs end to end: two clusters, the replicator as a user
starts it, the backlog copied and checked record by record, the steady-state lag measured, a second
backlog copied once the running replicator's Spark continues, and the host's floors printed (speed
itself is never asserted here: the benchmark reports it against the catch-up read measured in the
same run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def test_bench_replicate_quick(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", "replicate", "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=540, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    rep = data["replicated"]
    assert rep["complete"] and rep["verify"]["ok"] and rep["verify"]["checked"] == data["write"]["records"] == 20_000
    assert rep["records_per_s"] > 0 and rep["from_process_start_s"] > rep["from_query_start_s"] > 0
    assert data["catch_up"]["records"] == 20_000 and data["catch_up"]["records_per_s"] > 0
    steady = data["steady"]
    assert steady["read_on_b"] == steady["written"] == 5_000 and not steady["write_failures"]
    assert 0 < steady["p50_ms"] <= steady["p99_ms"] <= steady["max_ms"]
    behind = data["behind"]   # a backlog written while the replicator's Spark was stopped, then copied
    assert behind["complete"] and behind["verify"]["ok"] and behind["verify"]["checked"] == 20_000
    assert behind["records_per_s"] > 0 and behind["catch_up"]["records"] == 20_000
    assert data["metrics"]["scrapes"] > 0 and data["replicator"]["settings"]["metrics_port"] == 0
    assert data["host_round_trip"]["p50_ms"] > 0 and data["host_fdatasync"]["p50_ms"] > 0
    assert len(data["goals"]) == 2 and r.stdout.count("goal ") == 2 and "host: one byte to another process" in r.stdout
    assert (tmp_path / "bench.replicator.log").exists()
