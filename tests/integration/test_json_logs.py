"""`spark-bookie --log-format json bookie ...`: every log line of a real bookie process is one JSON
object naming the bookie."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from bookie_helpers import wait_until

from metadata import connect as connect_metadata
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration


def test_bookie_logs_json_lines_with_its_id(zk_connect, tmp_path):
    store = connect_metadata(zk_connect)
    store.cluster.init_cluster()
    store.close()
    port = free_port()
    out = tmp_path / "bookie.out"
    cmd = [sys.executable, "-m", "spark_bookie.cli", "--log-format", "json", "bookie", "--zk", zk_connect,
           "--port", str(port), "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l")]
    with open(out, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    bookie_id = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: f"bookie {bookie_id} ready" in out.read_text() or proc.poll() is not None, 60,
                   "the bookie to start")
        assert proc.poll() is None, out.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines if ln.startswith("{")]
    plain = [ln for ln in lines if not ln.startswith("{")]
    assert plain == [f"bookie {bookie_id} ready"], plain  # the one line for humans and the sandbox
    assert any("is up" in r["msg"] for r in records), records
    for r in records:
        assert r["bookie_id"] == bookie_id and r["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        assert r["ts"].endswith("+00:00") and r["logger"]
