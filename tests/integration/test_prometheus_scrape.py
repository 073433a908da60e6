"""A real Prometheus server (Debian's `prometheus` package, installed by scripts/bootstrap)
scrapes a sandbox's bookies every half second and answers a PromQL query on an add-latency
metric after a client's writes: the exposition, names and labels work for the real consumer."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse

import pytest
from bookie_helpers import wait_until
from client_helpers import client
from http_helpers import call

from spark_bookie.local.zookeeper import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMETHEUS = shutil.which("prometheus")


def _query(base: str, promql: str) -> list[dict]:
    status, _ctype, text = call(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert status == 200, text
    body = json.loads(text)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/bootstrap installs it as root)")
def test_prometheus_scrapes_the_bookies_and_answers_promql(cluster_factory, tmp_path):
    sb = cluster_factory(0)
    for _ in range(3):
        sb.add_bookie(http_port=free_port())
    targets = [f"127.0.0.1:{b.settings['http_port']}" for b in sb.bookies]
    conf = tmp_path / "prometheus.yml"
    conf.write_text("global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\n"
                    "scrape_configs:\n  - job_name: spark-bookie\n    static_configs:\n"
                    f"      - targets: {json.dumps(targets)}\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                return True  # exited: reported just below
            try:
                return call(base + "/-/ready", timeout_s=2)[0] == 200
            except OSError:  # not listening yet
                return False
        wait_until(ready, 60, "prometheus to be ready")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        wait_until(lambda: len(_query(base, 'up{job="spark-bookie"} == 1')) == 3, 60, "all three targets up")
        with client(sb) as c:
            w = c.create_ledger(3, 3, 2)
            for f in [w.append_async(b"p" * 512) for _ in range(500)]:
                f.result(30)
            w.close()

        def added() -> float:
            rows = _query(base, 'sum(bookkeeper_server_ADD_ENTRY_REQUEST_total{success="true"})')
            return float(rows[0]["value"][1]) if rows else 0.0
        wait_until(lambda: added() >= 1500, 60, "prometheus to see 3 x 500 adds")
        p99 = _query(base, 'histogram_quantile(0.99, sum by (le) '
                           '(rate(bookkeeper_server_ADD_ENTRY_bucket{success="true"}[1m])))')
        assert p99 and 0 < float(p99[0]["value"][1]) < 60, p99
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
