"""The benchmarks run end to end and print their tables (speed itself is never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("which", ["bookie", "append", "stream", "tenants"])
def test_bench_quick_runs_and_writes_json(tmp_path, which):
    out = tmp_path / f"{which}.json"
    extra = ["--tenants"] if which == "append" else []   # append: also the tenant checks' cost, same run
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", which, "--quick", *extra,
                        "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["goals"] and all(line in r.stdout for line in ("goal ",))
    if which == "bookie":
        assert data["bookie_adds"]["adds_per_s"] > 0 and data["raw_group_commit_1mib"]["mb_per_s"] > 0
        assert "bench bookie: metrics cost (5/5 steps" in r.stderr   # its progress, a line per step
    elif which == "stream":
        assert data["throughput"]["records_per_s"] > 0 and data["catch_up"]["records"] == data["throughput"]["records"]
        sub = data["catch_up_subscribed"]   # a subscription's reader committing every 100 ms, same run
        assert sub["records"] == data["throughput"]["records"] and sub["commits"] >= 1
        assert "subscribed / plain = " in r.stdout
        assert data["catch_up_arrow"]["records"] == data["throughput"]["records"]   # read_arrow_batch, same run
        assert data["throughput_tuned"]["records_per_s"] > 0 and "tuned variant" in r.stdout
        assert "Redis peer DID NOT RUN" not in r.stdout, r.stdout   # the peer runs here (scripts/bootstrap)
        lat = data["latency_at_1000"]
        assert 0 < lat["p50_ms"] <= lat["p99_ms"] and 0 <= lat["host_steal_share"] < 1
        for run in (lat, data["latency_at_10000"]):   # every record seen, split at its acknowledgement
            assert run["records"] == run["rate"] + 1 and 0 < run["write_to_ack_p50_ms"] < run["p50_ms"]
            assert 0 < run["ack_to_seen_p50_ms"] < run["p50_ms"]
        assert 0 < data["host_thread_handoff"]["p50_ms"] and "handed between two threads" in r.stdout
        assert data["host_round_trip"]["p50_ms"] > 0 and "Redis" in r.stdout
    elif which == "tenants":   # fair share vs first come, and the host's floor, same run
        assert set(data["modes"]) == {"fair", "fifo", "apart"} and "host floor: " in r.stdout
        for m in data["modes"].values():
            assert 0 < m["alone_p50_ms"] <= m["alone_p99_ms"] and m["a_records_per_s"] > 0
        assert data["goals"]["p99_bound_ms"] >= 5.0
    else:
        assert data["E3Qw3Qa2"]["entries_per_s"] > 0 and "p99_ms" in data["E3Qw3Qa2_at_1000"]
        trip = data["host_round_trip"]  # the host's floor, measured in the same run
        assert 0 < trip["p50_ms"] <= trip["p99_ms"] and "host: one byte to another process" in r.stdout
        sync = data["host_fdatasync"]  # the disk's floor, likewise
        assert 0 < sync["p50_ms"] <= sync["p99_ms"] and "fdatasynced at 1,000/s" in r.stdout
        assert 0 <= data["E3Qw3Qa2_at_1000"]["host_steal_share"] < 1
        m = data["metrics_cost"]   # metrics on and off, same run
        assert len(m["runs"]["on"]) == len(m["runs"]["off"]) >= 2 and "metrics on vs off" in r.stdout
        t = data["tenants_cost"]   # tenant checks on and off, same run, alternating
        assert len(t["runs"]["checks"]) == len(t["runs"]["plain"]) >= 2 and "tenant checks on" in r.stdout
        assert 0 < t["at_1000"]["checks"]["p50_ms"] <= t["at_1000"]["checks"]["p99_ms"]
        assert any(goal.startswith("tenant checks cost") for goal in data["goals"])
    assert not list(tmp_path.glob("bench-*/cluster"))  # temporary clusters are removed


def test_bench_recovery_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "recovery.json"
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", "recovery", "--quick", "--ledgers", "12",
                        "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["goals"] and "goal " in r.stdout and "raw disk" in r.stdout
    assert data["bytes_rereplicated"] > 0 and data["mb_per_s"] > 0
    assert data["seconds"]["detected"] <= data["seconds"]["first_marked"] <= data["seconds"]["repaired"]
    assert data["raw_disk_1mib_fdatasync"]["mb_per_s"] > 0
