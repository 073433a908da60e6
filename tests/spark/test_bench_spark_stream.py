"""`spark-bookie bench spark-stream --quick` runs end to end and prints its comparisons (speed itself
is never asserted here: the benchmark reports it against baselines measured in the same run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


def test_bench_spark_stream_quick(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", "spark-stream", "--quick", "--json",
                        str(out)], capture_output=True, text=True, timeout=840, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert len(data["write"]) == len(data["read"]) == len(data["tiered"]) == 2
    assert all(w["stream_rows_per_s"] > 0 and w["delta_rows_per_s"] > 0 for w in data["write"])
    assert all(x["spark_records_per_s"] > 0 and x["executors_summed_records_per_s"] > 0 for x in data["read"])
    assert all(t["delta_records_per_s"] > 0 and t["delta_arrow_records_per_s"] > 0 for t in data["tiered"])
    assert "goal Spark write into a stream" in r.stdout and "tiered into Delta" in r.stdout
