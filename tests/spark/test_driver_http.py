"""The Spark-hosted cluster's driver serves /metrics and the admin API (`--http-port`): the cluster
figures and its auditor's metrics parsed by prometheus_client, is_ready while the hosting job
runs, and BookKeeper's endpoints over the executors' bookies."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_bookie.local.sandbox import SparkSandbox
from spark_bookie.local.zookeeper import free_port, free_port_range

pytestmark = [pytest.mark.spark, pytest.mark.slow]



def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _samples(url: str) -> dict[str, float]:
    status, text = _get(url + "/metrics")
    assert status == 200
    return {s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_driver_serves_metrics_and_admin_api(tmp_path):
    port, bookie_base = free_port(), free_port_range(2)
    url = f"http://127.0.0.1:{port}"
    bookie_urls = [f"http://127.0.0.1:{bookie_base + k}" for k in range(2)]
    args = ["--http-port", str(port), "--bookie-http-base-port", str(bookie_base)]
    with SparkSandbox(tmp_path, 2, extra_args=args) as sb:
        wait_until(lambda: _samples(url).get("bookie_cluster_SLOTS_SERVING") == 2.0, 120, "two slots serving")
        m = _samples(url)
        assert m["bookie_cluster_BOOKIES_WANTED"] == 2.0 and m["bookie_cluster_WRITABLE_BOOKIES"] == 2.0
        assert m["bookie_cluster_JOB_RESUBMITS_total"] == 0.0
        wait_until(lambda: _samples(url).get("auditor_IS_AUDITOR") == 1.0, 60, "the driver to be the auditor")
        assert _get(url + "/api/v1/bookie/is_ready")[0] == 200
        status, body = _get(url + "/api/v1/bookie/list_bookies?type=rw")
        assert status == 200 and set(json.loads(body)) == set(sb.bookie_ids)
        status, body = _get(url + "/api/v1/autorecovery/who_is_auditor")
        assert status == 200 and json.loads(body)["Auditor"].startswith("driver:")
        assert _get(url + "/api/v1/bookie/state")[0] == 404  # no bookie in the driver itself
        # the executors' bookies, each on base + slot
        from ledger_client import LedgerClient

        with LedgerClient(sb.connect_string) as c:
            w = c.create_ledger(2, 2, 2)
            for i in range(10):
                w.append(b"%d" % i)
            w.close()
        added = sum(_samples(u)["bookkeeper_server_ADD_ENTRY_REQUEST_total|success=true"] for u in bookie_urls)
        assert added == 20
        for u in bookie_urls:
            assert _samples(u)["bookie_SERVER_STATUS"] == 1.0 and _get(u + "/api/v1/bookie/is_ready")[0] == 200
        # `cluster status` asks each bookie itself, beside what its slot wrote in ZooKeeper
        out = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "status", "--zk",
                              sb.connect_string, "--name", sb.name, "--json"], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        slots = json.loads(out.stdout)["slots"]
        assert {s["http_port"] for s in slots.values()} == {bookie_base, bookie_base + 1}
        assert all(s["http_state"]["running"] is True and s["http_state"]["readOnly"] is False
                   for s in slots.values()), slots
        text = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "status", "--zk",
                               sb.connect_string, "--name", sb.name], capture_output=True, text=True, timeout=120)
        assert text.stdout.count("http: writable") == 2, text.stdout
