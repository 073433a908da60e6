"""`spark-bookie bench scale --quick` runs end to end and writes every figure at both sizes (speed
itself is never asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

FIGURES = ("create_per_s_16_threads", "create_per_s_loop", "delete_per_s_16_threads", "list_ledgers_ms",
           "stream_info_ms", "auditor_audit_s", "auditor_full_check_s", "auditor_full_check_again_s",
           "auditor_replicas_check_s", "auditor_replicas_check_again_s",
           "gc_round_after_deletes_ms", "gc_round_idle_ms", "bookie_rss_median_mb", "bookie_rss_max_mb",
           "zookeeper_rss_mb", "znodes_per_ledger", "zk_writes_per_ledger", "znodes_per_segment",
           "zk_writes_per_segment", "rereplication_s", "rereplication_ledgers_per_s", "cold_start_first_ledger_ms",
           "cold_start_import_ms")


def _run_quick(tmp_path, *extra):
    """`bench scale --quick` with ``extra``; its JSON and output, checked for every figure at both sizes."""
    out = tmp_path / "scale.json"
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", "scale", "--quick", *extra,
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    said = r.stdout[-3000:]
    figures = data["figures"]
    assert set(FIGURES) <= set(figures)
    for name in FIGURES:
        f = figures[name]
        for size in ("small", "large"):
            assert isinstance(f[size], float) and math.isfinite(f[size]) and f[size] > 0, (name, f, said)
        assert f["ratio"] > 0 and f["label"] in r.stdout, (name, said)
    assert data["small"]["bookies"] == 3 and data["large"]["bookies"] == 5   # after the kill, with the spare
    assert data["small"]["repair"]["complete"] and data["large"]["repair"]["complete"], said
    assert data["large"]["list_ledgers"]["ledgers"] > data["small"]["list_ledgers"]["ledgers"] >= 300
    assert "host floors: loopback round trip" in r.stdout and "LARGE/SMALL" in r.stdout
    assert "bench scale: small built" in r.stderr   # progress, one line per step off a terminal
    assert not list(tmp_path.glob("bench-scale-*"))
    return data, r


def test_bench_scale_quick_writes_every_figure_at_both_sizes(tmp_path):
    data, r = _run_quick(tmp_path)
    assert data["cluster"]["mode"] == "processes"
    assert "the 6 bookies ran as processes on this machine" in r.stdout


@pytest.mark.slow
def test_bench_scale_quick_on_hosts_runs_each_bookie_on_a_host_of_its_own(tmp_path):
    """``--hosts``: LARGE's 5 bookies and SMALL's spare on 6 hosts (namespaces as root, else loopback
    addresses), every figure still measured through the hosts' addresses."""
    data, r = _run_quick(tmp_path, "--hosts")
    where = data["cluster"]
    assert where["mode"] in ("netns", "loopback") and where["hosts"] == 6, where
    assert where["bookies"] == 6 and where["hosts_with_bookies"] == 6, where
    assert "the 6 bookies ran on 6 hosts (of 6;" in r.stdout, r.stdout[-3000:]
    victims = [data[s]["repair"]["victim"] for s in ("small", "large")]
    assert not any(v.startswith("127.0.0.1:") for v in victims), victims   # host addresses, not this machine's
