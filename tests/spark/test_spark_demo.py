"""The README's main command, as a user runs it: the Spark-first demo end to end (bookies in
executors, a stream written by a Python app, a streaming query into another stream through an
executor SIGKILL, tiering into Delta, Spark SQL), exit 0 and 'demo OK'."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_spark_first_demo(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--spark", "--bookies", "4", "--root",
                        str(tmp_path / "sandbox"), "--demo"], capture_output=True, text=True, timeout=840, env=env)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-4000:]
    assert re.search(r"killed the executor JVM hosting bookie \S+ \(SIGKILL\) after \d+ events", out)
    assert re.search(r"bookie \S+ is serving again after \d+ s", out)
    assert "the app's 6000 events were all acknowledged; the query wrote 6000 results" in out
    assert out.count("demo/results holds each of the 6000 results exactly once") == 2   # before and after tiering
    tiered = re.search(r"demo/events segments: (\d+) tiered into Delta", out)
    assert tiered and int(tiered.group(1)) >= 2
    assert "demo/events: 6000 records, 6000 distinct txids, txids 0..5999" in out
    assert "demo/results: 6000 records, 6000 distinct txids" in out
    assert out.rstrip().endswith("demo OK")
