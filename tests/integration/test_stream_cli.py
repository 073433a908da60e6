"""`spark-bookie stream ...` as a user runs it: real processes, real cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def stream(zk: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", zk, *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def ok(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_stream_commands_round_trip(cluster_factory):
    sb = cluster_factory(3)
    zk = sb.connect_string
    assert "created namespace payments" in ok(stream(zk, "create-namespace", "payments", "--rolling-bytes", "300",
                                                    "--output-buffer-bytes", "100"))
    assert json.loads(ok(stream(zk, "namespaces", "--json")))["payments"]["segment_rolling_bytes"] == 300
    lines = "".join(f"order {i}\n" for i in range(200))
    out = ok(stream(zk, "write", "payments/orders", stdin=lines))
    assert out.startswith("wrote 200 records")
    assert ok(stream(zk, "list", "payments")).split() == ["orders"]
    info = json.loads(ok(stream(zk, "info", "payments/orders", "--json")))
    assert info["last_txid"] == 199 and sum(s["record_count"] for s in info["segments"]) == 200
    assert len(info["segments"]) >= 2
    text = ok(stream(zk, "info", "payments/orders"))
    assert text.startswith("stream payments/orders:") and "segment 1 sealed" in text
    tail = ok(stream(zk, "tail", "payments/orders", "--no-follow")).splitlines()
    assert len(tail) == 200 and tail[0] == "1/0/0 0 order 0" and tail[-1].endswith(" 199 order 199")
    recs = [json.loads(x) for x in ok(stream(zk, "tail", "payments/orders", "--from-txid", "150", "-n", "10",
                                            "--json")).splitlines()]
    assert [r["txid"] for r in recs] == list(range(150, 160)) and recs[0]["payload"] == "order 150"
    cut = recs[0]["dlsn"]
    assert f"before {cut}" in ok(stream(zk, "truncate", "payments/orders", cut))
    after = ok(stream(zk, "tail", "payments/orders", "--no-follow")).splitlines()
    assert len(after) == 50 and after[0].startswith(cut)
    assert "deleted stream payments/orders" in ok(stream(zk, "delete", "payments/orders"))
    assert ok(stream(zk, "list", "payments")) == ""


def test_tail_follows_a_live_writer(cluster_factory):
    sb = cluster_factory(3)
    zk = sb.connect_string
    ok(stream(zk, "create-namespace", "ns"))
    ok(stream(zk, "write", "ns/live", stdin="a\n"))
    proc = subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", zk, "tail", "ns/live",
                             "-n", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split(" ", 2)[2] == "a\n"   # printed at once, while it follows
        ok(stream(zk, "write", "ns/live", stdin="b\nc\n"))
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert [line.split(" ", 2)[2] for line in out.splitlines()] == ["b", "c"]


def test_stream_errors_exit_2_with_one_line(cluster_factory):
    sb = cluster_factory(1)
    zk = sb.connect_string
    for args, msg in ((("info", "nope/s"), "namespace"), (("info", "bad"), "NAMESPACE/STREAM"),
                      (("create-namespace", "bad/name"), "name"), (("tail", "x/y", "--from", "1/2"), "")):
        p = stream(zk, *args)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    ok(stream(zk, "create-namespace", "ns", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1"))
    p = stream(zk, "create-namespace", "ns")
    assert p.returncode == 2 and "exists" in p.stderr
    p = stream(zk, "create-namespace", "other", "--ensemble", "1", "--write-quorum", "2")
    assert p.returncode == 2 and "ensemble_size" in p.stderr
