"""`spark-bookie bench tenants`: one tenant's trickle while another floods the same bookies.

Three bookie processes (default settings), two tenants with a namespace each, E3/Qw3/Qa2. Tenant
B writes 100-byte records at an offered 1,000 records/s, one synchronous ``write`` at a time (a
request/response service's write-ahead log); each write's latency is timed. Tenant A, in another
process with a client of its own, floods: ``write_async`` of distinct 100-byte records as fast as
its writer takes them. Measured, in one run: B's latency alone, then B's latency during A's flood
and the records per second both tenants got (A's and B's acknowledged records over the flood).

Each round does both on two clusters started side by side, alternating which goes first: one
with the bookies' fair share on (the default) and one with ``fair_share_enabled = false``, which
queues every add into the journal first come, first served, as the bookies did before (the
baseline, same run). A third phase is the host's floor: A floods the other cluster's bookies
while B writes to its own, so B shares nothing with A but the machine (its cores and its disk);
what B loses there, no bookie could give back. Goals (issue 29): B's p99 under the flood at most
max(2x its p99 alone, its p99 alone + 5 ms); the total records/s under the flood at least 0.9x
the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench.common import finish, pct
from spark_bookie.bench.host import cpu_times, fdatasyncs, round_trips, steal_share

GOAL_P99_FACTOR = 2.0
GOAL_P99_SLACK_MS = 5.0
GOAL_TOTAL_RATIO = 0.9
RECORD_BYTES = 100
MODES = ("fair", "fifo")   # fair share on (default) / off (every add first come, first served)

FLOOD_SCRIPT = """
import json, sys, time
from ledger_client import LedgerClient
zk, ns, kind, seconds, size = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
c = LedgerClient(zk)
pad = b"a" * (size - 8)
if kind == "stream":
    w = c.namespace(ns).open_writer("flood")
    write = w.write_async
else:   # 100-byte entries of a ledger of the namespace, one add each
    w = c.create_ledger(3, 3, 2, namespace=ns)
    write = w.append_async
write(b"warm" + pad + b"0000").result()   # the flood's ledger exists before it starts
print("ready", flush=True)
sys.stdin.readline()
futs, n = [], 0
t0 = time.perf_counter()
deadline = t0 + seconds
while True:
    for _ in range(1000):
        futs.append(write(n.to_bytes(8, "little") + pad))
        n += 1
    if time.perf_counter() >= deadline:
        break
    if len(futs) > 200_000:
        done = futs[:100_000]
        del futs[:100_000]
        for f in done:
            f.result()
for f in futs:
    f.result()
elapsed = time.perf_counter() - t0
w.close(); c.close()
print(json.dumps({"records": n, "seconds": elapsed}), flush=True)
"""


def add_tenants_parser(sub: Any) -> None:
    p = sub.add_parser("tenants", help="one tenant's latency while another floods the same bookies, fair "
                                       "share on vs off in the same run")
    p.add_argument("--quick", action="store_true", help="a smoke run (short phases, one round)")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of both modes, alternating (default 2)")
    p.add_argument("--flood", choices=("ledger", "stream"), default="stream",
                   help="tenant A floods 100-byte records of a stream (packed into large entries, default) or "
                        "100-byte entries of a ledger (one add each)")
    p.add_argument("--flood-record-bytes", type=int, default=100, metavar="N",
                   help="the size of tenant A's records (default 100)")
    p.add_argument("--rate", type=float, default=1000.0, help="tenant B's offered records/s (default 1000)")
    p.add_argument("--json", default="bench-tenants.json", metavar="PATH", help="where the results go as JSON")
    p.set_defaults(func_bench=bench_tenants)


def _record(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"b" * (RECORD_BYTES - 8)


def _trickle(writer: Any, rate: float, seconds: float, first: int) -> list[float]:
    """Synchronous writes due every 1/rate s (a late one goes at once); each one's seconds."""
    lat = []
    step = 1.0 / rate
    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        due = t0 + i * step
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        started = time.perf_counter()
        writer.write(_record(first + i))
        lat.append(time.perf_counter() - started)
    return lat


def _summary(lat: list[float]) -> dict[str, float]:
    return {"writes": len(lat), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": max(lat) * 1000}


def _flooded(zk: str, writer: Any, rate: float, seconds: float, first: int, flood: tuple[str, int]) -> dict[str, Any]:
    """B's trickle during A's flood (A in its own process), and what both got."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOD_SCRIPT, zk, "tenant-a-ns", flood[0], str(seconds),
                             str(flood[1])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the flooding writer did not start: {proc.communicate(timeout=30)[1]}")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(min(1.0, seconds / 4))   # the flood is on before B is timed
        host0 = cpu_times()
        t0 = time.perf_counter()
        lat = _trickle(writer, rate, seconds * 0.75, first)
        b_seconds = time.perf_counter() - t0
        host1 = cpu_times()
        out, err = proc.communicate(timeout=seconds * 20 + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"the flooding writer failed: {err}")
        got = json.loads(out.strip().splitlines()[-1])
    finally:
        proc.kill()
    a_rate = got["records"] / got["seconds"]
    return {**_summary(lat), "a_records_per_s": a_rate, "b_records_per_s": len(lat) / b_seconds,
            "total_records_per_s": a_rate + len(lat) / b_seconds, "host_steal_share": steal_share(host0, host1)}


def _round(zk: str, writer: Any, rate: float, seconds: float, first: int, flood: tuple[str, int]) -> dict[str, Any]:
    alone = _summary(_trickle(writer, rate, seconds * 0.75, first))
    first += int(rate * seconds)
    return {"alone": alone, "flooded": _flooded(zk, writer, rate, seconds, first, flood)}


def _cluster(stack: ExitStack, root: Path, mode: str) -> tuple[str, Any]:
    """A cluster in `mode`, its two tenants' namespaces, and B's open writer."""
    from ledger_client import LedgerClient
    from spark_bookie.local.sandbox import Sandbox

    sb = stack.enter_context(Sandbox(root / mode, 3, bookie_settings={"fair_share_enabled": mode == "fair"}))
    client = stack.enter_context(LedgerClient(sb.connect_string))
    for tenant in ("tenant-a", "tenant-b"):
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}-ns", tenant=tenant, ensemble_size=3, write_quorum_size=3,
                                ack_quorum_size=2)
    writer = stack.enter_context(client.namespace("tenant-b-ns").open_writer("trickle"))
    writer.write(_record(0))
    return sb.connect_string, writer


def bench_tenants(args: argparse.Namespace) -> int:
    seconds = 1.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    root = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    res: dict[str, Any] = {"record_bytes": RECORD_BYTES, "flood": args.flood,
                           "flood_record_bytes": args.flood_record_bytes, "rate": args.rate, "seconds": seconds,
                           "load_average_at_start": os.getloadavg()}
    progress = StepProgress("bench tenants", ("clusters", "host floors",
                                              *(f"round {i + 1}" for i in range(rounds))))
    try:
        with ExitStack() as stack:
            clusters = {mode: _cluster(stack, root, mode) for mode in MODES}
            progress.step("clusters")
            trips = round_trips(1000.0, 0.5 if args.quick else 3.0)
            syncs = fdatasyncs(root, 1000.0, 0.5 if args.quick else 3.0, RECORD_BYTES)
            res["host_round_trip"] = {"p50_ms": pct(trips, 50), "p99_ms": pct(trips, 99)}
            res["host_fdatasync"] = {"p50_ms": pct(syncs, 50), "p99_ms": pct(syncs, 99)}
            progress.step("host floors")
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in (*MODES, "apart")}
            flood = (args.flood, args.flood_record_bytes)
            first = 1
            for i in range(rounds):
                for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                    zk, writer = clusters[mode]
                    runs[mode].append(_round(zk, writer, args.rate, seconds, first, flood))
                    first += 2 * int(args.rate * seconds)
                # the host's floor: A floods the first-come cluster, B writes to the fair one
                apart = _flooded(clusters["fifo"][0], clusters["fair"][1], args.rate, seconds, first, flood)
                runs["apart"].append({"alone": runs["fair"][-1]["alone"], "flooded": apart})
                first += int(args.rate * seconds)
                progress.step(f"round {i + 1}")
        res["runs"] = runs
        res["modes"] = {m: _medians(runs[m]) for m in runs}
        res["goals"] = _goals(res["modes"])
    finally:
        progress.close()
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args.json, _report)


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    def med(phase: str, key: str) -> float:
        return statistics.median(r[phase][key] for r in runs)
    return {"alone_p50_ms": med("alone", "p50_ms"), "alone_p99_ms": med("alone", "p99_ms"),
            "flooded_p50_ms": med("flooded", "p50_ms"), "flooded_p99_ms": med("flooded", "p99_ms"),
            "flooded_max_ms": med("flooded", "max_ms"), "a_records_per_s": med("flooded", "a_records_per_s"),
            "total_records_per_s": med("flooded", "total_records_per_s"),
            "host_steal_share": med("flooded", "host_steal_share")}


def _goals(modes: dict[str, dict[str, float]]) -> dict[str, Any]:
    fair, fifo = modes["fair"], modes["fifo"]
    bound = max(GOAL_P99_FACTOR * fair["alone_p99_ms"], fair["alone_p99_ms"] + GOAL_P99_SLACK_MS)
    ratio = fair["total_records_per_s"] / fifo["total_records_per_s"]
    return {"p99_bound_ms": bound, "p99_met": fair["flooded_p99_ms"] <= bound,
            "total_ratio": ratio, "total_met": ratio >= GOAL_TOTAL_RATIO}


def _report(res: dict[str, Any]) -> None:
    rt, fs = res["host_round_trip"], res["host_fdatasync"]
    print(f"\nhost floors: loopback round trip p50 {rt['p50_ms']:.3f} ms, fdatasync p50 {fs['p50_ms']:.3f} ms "
          f"(p99 {fs['p99_ms']:.3f}); load at start {res['load_average_at_start'][0]:.2f}")
    print(f"tenant B: one synchronous 100-byte write every {1000 / res['rate']:.2f} ms; tenant A: write_async "
          f"flood of {res['flood_record_bytes']}-byte records ({res['flood']}) from another process; medians of "
          f"{len(res['runs']['fair'])} alternating rounds")
    print(f"{'bookies':<26}{'B alone p50/p99':>18}{'B flooded p50/p99':>20}{'A rec/s':>11}{'total rec/s':>13}"
          f"{'steal':>7}")
    for mode, label in (("fair", "fair share (default)"), ("fifo", "first come (before)"),
                        ("apart", "A on other bookies")):
        m = res["modes"][mode]
        print(f"{label:<26}{m['alone_p50_ms']:>8.2f} / {m['alone_p99_ms']:<7.2f}{m['flooded_p50_ms']:>9.2f} / "
              f"{m['flooded_p99_ms']:<8.2f}{m['a_records_per_s']:>11,.0f}{m['total_records_per_s']:>13,.0f}"
              f"{m['host_steal_share']:>7.0%}")
    floor = res["modes"]["apart"]["flooded_p99_ms"]
    print(f"host floor: B's p99 while A floods bookies B does not use: {floor:.2f} ms (what the machine itself "
          f"costs B; the goal's bound is {'above' if floor <= res['goals']['p99_bound_ms'] else 'BELOW'} it)")
    g = res["goals"]
    print(f"goal B's p99 under the flood <= {g['p99_bound_ms']:.2f} ms: {'met' if g['p99_met'] else 'MISSED'}")
    print(f"goal total records/s under the flood >= {GOAL_TOTAL_RATIO}x first come: {g['total_ratio']:.2f}x, "
          f"{'met' if g['total_met'] else 'MISSED'}")
