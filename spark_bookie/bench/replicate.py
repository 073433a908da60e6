"""`spark-bookie bench replicate`: the cross-cluster replicator (DESIGN §4.12) against the source
cluster's own read rate, and its lag at a steady rate (issue 31).

Two clusters of three bookie processes each (A and B, default bookie settings, one ZooKeeper with a
chroot per cluster), a namespace with default settings (E3/Qw3/Qa2). Measured in the same run:
(1) backlog: N distinct 100-byte records written to one stream on A by the public client
    (write_async, a bounded window, every future's result read); then A's own catch-up read rate
    (one Python reader from the start, `read_batch`, every record touched; and `read_arrow_batch`
    where the reader has it) as the baseline; then `spark-bookie replicate` started as a user
    starts it (the command as a process of its own, default settings but `--metrics-port 0`):
    the time until B's stream holds all N records (segment record counts on B), from the query's
    start (the replicator's "replicating ..." line) and from the process's start (Spark's start-up
    included); then every record on B checked against what was written (order, txids, bytes);
(2) steady state: a writer on A at 1,000 records/s (open loop, each payload carrying the monotonic
    time it was due in its first 8 bytes, then its index) into a new stream of the same glob,
    while a tailing reader on B in another process takes (now - due) for each record; the
    replicator's /metrics `replication_lag_seconds` sampled meanwhile;
(3) a backlog behind the running replicator, as after a partition between the clusters: its Spark
    JVM stopped (SIGSTOP) while N records are written to a new stream on A, then continued; the
    time until B holds them all, every record checked, and A's catch-up read of it as baseline.
Goals (issue 31): replicated records/s >= 0.5x the catch-up read rate, for the backlog behind a
running replicator ((1) is printed beside it: a new replicator's first batch also pays Spark's
start of its Python processes, ~4.5 s); steady lag p99 < 2 s.
CLOCK_MONOTONIC is one clock for every process of the machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench.common import cpu_seconds, finish, pct
from spark_bookie.bench.host import cpu_times, fdatasyncs, round_trips, steal_share
from spark_bookie.bench.replicator_process import MetricsSampler, ReplicatorProcess

GOAL_RATIO = 0.5          # replicated records/s against A's own catch-up read rate
GOAL_P99_S = 2.0          # steady state, write on A -> read on B
RECORD_BYTES = 100
WINDOW = 10_000           # write_async futures in flight at most
NAMESPACE, BACKLOG, STEADY, BEHIND = "bench", "backlog", "steady", "behind"
_BACKLOG = struct.Struct("<q")      # the record's index, then padding
_STEADY = struct.Struct("<qq")      # the record's due time (monotonic ns; 0: a warm-up record), its index

READER_SCRIPT = """
import json, sys, time
from ledger_client import LedgerClient
zk, ns, stream, n, limit_s = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
c = LedgerClient(zk)
r = c.namespace(ns).open_reader(stream)
print("ready", flush=True)
lat = []
end = time.monotonic() + limit_s
while len(lat) < n and time.monotonic() < end:
    for rec in r.read_batch(10_000, 200):
        due = int.from_bytes(rec.payload[:8], "little", signed=True)
        if due > 0:
            lat.append((time.monotonic_ns() - due) / 1e6)
print(json.dumps(lat), flush=True)
r.close(); c.close()
"""


def add_replicate_parser(sub: Any) -> None:
    p = sub.add_parser("replicate", help="spark-bookie replicate between two local clusters: backlog copy rate "
                                         "vs catch-up read, lag at 1,000 records/s")
    p.add_argument("--records", type=int, default=1_000_000, help="records of the backlog written on A")
    p.add_argument("--steady-s", type=float, default=30.0, help="length of the steady-state run at --rate")
    p.add_argument("--rate", type=float, default=1000.0, help="records/s written on A in the steady state")
    p.add_argument("--trigger-interval-ms", type=int, default=None,
                   help="passed to the replicator (default: the replicator's own default)")
    p.add_argument("--max-records-per-trigger", type=int, default=None,
                   help="passed to the replicator (default: the replicator's own default)")
    p.add_argument("--json", default="bench-replicate.json")
    p.add_argument("--quick", action="store_true", help="a smoke-sized run (20,000 records, 5 s steady state)")
    p.set_defaults(func_bench=bench_replicate)


def backlog_payload(i: int) -> bytes:
    return _BACKLOG.pack(i) + b"b" * (RECORD_BYTES - _BACKLOG.size)


def steady_payload(due_ns: int, i: int) -> bytes:
    return _STEADY.pack(due_ns, i) + b"s" * (RECORD_BYTES - _STEADY.size)


# ---------------------------------------------------------------- the backlog on A


def write_backlog(ns: Any, stream: str, records: int) -> dict[str, float]:
    """``records`` distinct records, write_async with at most WINDOW in flight, every result read."""
    pending: collections.deque[Any] = collections.deque()
    c0, t0 = cpu_seconds(), time.perf_counter()
    with ns.open_writer(stream) as w:
        write = w.write_async
        for i in range(records):
            pending.append(write(backlog_payload(i)))
            if len(pending) >= WINDOW:
                pending.popleft().result(120)
        w.flush()
        while pending:
            pending.popleft().result(120)
    elapsed = time.perf_counter() - t0
    return {"records": records, "seconds": elapsed, "records_per_s": records / elapsed,
            "client_cpu_us_per_record": (cpu_seconds() - c0) / records * 1e6, "window": WINDOW}


def catch_up(ns: Any, stream: str, records: int, arrow: bool = False) -> dict[str, Any]:
    """One reader from the start: every record's payload length summed (each record touched)."""
    n = total = 0
    c0, t0 = cpu_seconds(), time.perf_counter()
    with ns.open_reader(stream) as r:
        if arrow and not hasattr(r, "read_arrow_batch"):
            return {"error": "the stream reader has no read_arrow_batch"}
        while n < records:
            if arrow:
                import pyarrow.compute as pc

                rb = r.read_arrow_batch(100_000, 5_000)
                got = 0 if rb is None else rb.num_rows
                total += 0 if rb is None else int(pc.sum(pc.binary_length(rb.column("payload"))).as_py() or 0)
            else:
                recs = r.read_batch(100_000, 5_000)
                got = len(recs)
                total += sum(len(rec.payload) for rec in recs)
            if not got:
                raise RuntimeError(f"the catch-up reader stopped at {n} of {records} records")
            n += got
    elapsed = time.perf_counter() - t0
    return {"records": n, "bytes": total, "seconds": elapsed, "records_per_s": n / elapsed,
            "client_cpu_us_per_record": (cpu_seconds() - c0) / n * 1e6}


def held_records(ns: Any, stream: str) -> int:
    """Records a stream holds now, from its segments' metadata (0 while it or its namespace is absent)."""
    from ledger_client import errors

    try:
        return sum(s.record_count for s in ns.stream_info(stream).segments)
    except errors.LedgerError:
        return 0


def wait_held(client_b: Any, stream: str, records: int, timeout_s: float,
              rep: ReplicatorProcess) -> tuple[float, int, tuple[float, int] | None]:
    """Poll B every 0.1 s until ``stream`` holds ``records``: (the monotonic time it did, or the
    deadline's; the records it held then; when it first held any, and how many: the first batch)."""
    from ledger_client import errors

    deadline = time.monotonic() + timeout_s
    ns = None
    held = 0
    first: tuple[float, int] | None = None
    while time.monotonic() < deadline:
        if ns is None:
            try:
                ns = client_b.namespace(NAMESPACE)
            except errors.NoSuchNamespaceError:
                ns = None
        held = held_records(ns, stream) if ns is not None else 0
        if held and first is None:
            first = (time.monotonic(), held)
        if held >= records:
            return time.monotonic(), held, first
        rep.check()
        time.sleep(0.1)
    return time.monotonic(), held, first


def verify(ns_a: Any, ns_b: Any, stream: str, records: int) -> dict[str, Any]:
    """Every record of B's stream against what was written: its place, txid (A's, in order) and bytes."""
    first_txid = ns_a.stream_info(stream).segments[0].first_txid
    n = bad = 0
    first_bad: str | None = None
    with ns_b.open_reader(stream) as r:
        while n < records:
            recs = r.read_batch(100_000, 5_000)
            if not recs:
                break
            for rec in recs:
                if rec.payload != backlog_payload(n) or rec.txid != first_txid + n:
                    bad += 1
                    first_bad = first_bad or f"record {n}: txid {rec.txid}, payload {rec.payload[:16]!r}"
                n += 1
        extra = r.read_batch(10, 300)
    return {"checked": n, "mismatched": bad, "first_mismatch": first_bad, "records_past_the_end": len(extra),
            "ok": n == records and bad == 0 and not extra}


def replicate_backlog(sb_a: Any, sb_b: Any, clients: tuple[Any, Any], rep: ReplicatorProcess,
                      sampler: MetricsSampler, records: int) -> dict[str, Any]:
    """Start the replicator and time its copy of the backlog into B."""
    ns_a = clients[0].namespace(NAMESPACE)
    bookie_pids = sb_a.pids + sb_b.pids
    b0 = sum(cpu_seconds(p) for p in bookie_pids)
    host0 = cpu_times()
    rep.start()
    sampler.start()
    r0 = rep.cpu_seconds()
    done, held, first = wait_held(clients[1], BACKLOG, records, max(600.0, records / 1_000), rep)
    out: dict[str, Any] = {
        "records": records, "held_on_b": held, "complete": held >= records,
        "startup_s": rep.ready - rep.started, "from_query_start_s": done - rep.ready,
        "from_process_start_s": done - rep.started,
        "replicator_cpu_s_after_start": rep.cpu_seconds() - r0,
        "bookies_cpu_s": sum(cpu_seconds(p) for p in bookie_pids) - b0,
        "host_steal_share": steal_share(host0, cpu_times())}
    out["records_per_s"] = held / out["from_query_start_s"]
    time.sleep(1.5)   # the monitor's next pass writes the last batch into status.json
    out["batches"] = [b for b in rep.recent_batches() if b.get("trigger_ms")]
    if first is not None and held > first[1] and done > first[0]:
        # After the first batch (Spark's JVM and Python workers warm): B's records from when it first
        # held any to when it held all (the query's rows are spans, not records).
        out["first_batch_records"] = first[1]
        out["warm_records_per_s"] = (held - first[1]) / (done - first[0])
    out["records_per_s_from_process_start"] = held / out["from_process_start_s"]
    out["verify"] = verify(ns_a, clients[1].namespace(NAMESPACE), BACKLOG, records)
    return out


def backlog_behind(sb_a: Any, sb_b: Any, clients: tuple[Any, Any], rep: ReplicatorProcess,
                   records: int) -> dict[str, Any]:
    """A backlog behind a running replicator, as after a partition between the clusters: its Spark
    JVM is stopped while ``records`` are written to a new stream on A, then continued; the time
    until B holds them all. A's catch-up read of the same stream right after is this phase's
    baseline."""
    ns_a = clients[0].namespace(NAMESPACE)
    pid = rep.pause_spark()
    try:
        written = write_backlog(ns_a, BEHIND, records)
    finally:
        bookie_pids = sb_a.pids + sb_b.pids
        b0, r0, host0 = sum(cpu_seconds(p) for p in bookie_pids), rep.cpu_seconds(), cpu_times()
        t0 = time.monotonic()
        rep.resume_spark(pid)
    done, held, first = wait_held(clients[1], BEHIND, records, max(600.0, records / 1_000), rep)
    out: dict[str, Any] = {
        "records": records, "write": written, "held_on_b": held, "complete": held >= records,
        "seconds": done - t0, "records_per_s": held / (done - t0),
        "first_on_b_s": None if first is None else first[0] - t0,
        "replicator_cpu_s": rep.cpu_seconds() - r0,
        "bookies_cpu_s": sum(cpu_seconds(p) for p in bookie_pids) - b0,
        "host_steal_share": steal_share(host0, cpu_times())}
    out["verify"] = verify(ns_a, clients[1].namespace(NAMESPACE), BEHIND, records)
    out["catch_up"] = catch_up(ns_a, BEHIND, records)
    time.sleep(1.5)   # the monitor's next pass writes the last batch into status.json
    out["batches"] = [b for b in rep.recent_batches()[-3:] if b.get("trigger_ms")]
    return out


# ---------------------------------------------------------------- the steady state


def _start_reader(zk_b: str, records: int, limit_s: float) -> subprocess.Popen[str]:
    """The tailing reader on B: ``records`` timed records, or what it has after ``limit_s``."""
    proc = subprocess.Popen([sys.executable, "-c", READER_SCRIPT, zk_b, NAMESPACE, STEADY, str(records), str(limit_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the reader on B did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc


def _paced_writes(w: Any, rate: float, seconds: float) -> list[Any]:
    """Open loop: record i is due at t0 + i/rate and carries that time; its future."""
    n = max(1, int(rate * seconds))
    step = int(1e9 / rate)
    futs = []
    t0 = time.monotonic_ns()
    for i in range(n):
        due = t0 + i * step
        delay = (due - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        futs.append(w.write_async(steady_payload(due, i)))
    return futs


def steady_state(clients: tuple[Any, Any], zk_b: str, rep: ReplicatorProcess, sampler: MetricsSampler,
                 rate: float, seconds: float) -> dict[str, Any]:
    """A paced writer on A, a tailing reader on B (another process): each record's lag."""
    n = max(1, int(rate * seconds))
    with clients[0].namespace(NAMESPACE).open_writer(STEADY) as w:
        w.write(steady_payload(0, -1))   # the stream exists on B (a new stream found) before timing starts
        t_new = time.monotonic()
        at, held, _first = wait_held(clients[1], STEADY, 1, 300.0, rep)
        if held < 1:
            raise RuntimeError(f"the replicator did not copy the new stream {STEADY} in 300 s:\n{rep.tail()}")
        new_stream_s = at - t_new
        proc = _start_reader(zk_b, n, seconds + 120.0)
        try:
            sampler.phase = "steady"
            host0 = cpu_times()
            futs = _paced_writes(w, rate, seconds)
            w.flush()
            failed = sum(1 for f in futs if f.exception(120) is not None)
            host1 = cpu_times()
            out, err = proc.communicate(timeout=300)
            sampler.phase = "after"
        finally:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"the reader on B failed: {err[-2000:]}")
    lat = [ms / 1000 for ms in json.loads(out.strip().splitlines()[-1])]   # pct() takes seconds
    return {"rate": rate, "seconds": seconds, "written": n, "write_failures": failed, "read_on_b": len(lat),
            "new_stream_s": new_stream_s, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "max_ms": max(lat) * 1000 if lat else float("nan"), "host_steal_share": steal_share(host0, host1),
            "batches": rep.recent_batches(),
            "segments_on_b": len(clients[1].namespace(NAMESPACE).stream_info(STEADY).segments)}


# ---------------------------------------------------------------- the run


def _host_floors(root: Path, seconds: float) -> dict[str, dict[str, float]]:
    trips = round_trips(1000.0, seconds)
    syncs = fdatasyncs(root, 1000.0, seconds, RECORD_BYTES)
    return {"host_round_trip": {"p50_ms": pct(trips, 50), "p99_ms": pct(trips, 99)},
            "host_fdatasync": {"p50_ms": pct(syncs, 50), "p99_ms": pct(syncs, 99)}}


def _on_a(client_a: Any, records: int, res: dict[str, Any], progress: StepProgress) -> None:
    ns = client_a.create_namespace(NAMESPACE)
    res["namespace"] = {k: getattr(ns.settings, k) for k in ("ensemble_size", "write_quorum_size",
                                                             "ack_quorum_size", "segment_rolling_bytes")}
    res["write"] = write_backlog(ns, BACKLOG, records)
    progress.step("backlog written")
    res["catch_up"] = catch_up(ns, BACKLOG, records)
    res["catch_up_arrow"] = catch_up(ns, BACKLOG, records, arrow=True)
    progress.step("catch-up read")


def bench_replicate(args: argparse.Namespace) -> int:
    from ledger_client import LedgerClient
    from spark_bookie.local.sandbox import Sandbox
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    records = 20_000 if args.quick else args.records
    steady_s = 5.0 if args.quick else args.steady_s
    root = Path(tempfile.mkdtemp(prefix="bench-replicate-"))
    res: dict[str, Any] = {"record_bytes": RECORD_BYTES, "load_average_at_start": os.getloadavg()}
    progress = StepProgress("bench replicate", ("clusters", "host floors", "backlog written", "catch-up read",
                                                "backlog replicated", "steady state",
                                                "backlog behind a running replicator"))
    zk = EmbeddedZooKeeper(free_port(), root / "zookeeper")
    rep: ReplicatorProcess | None = None
    try:
        zk.start()
        with Sandbox(root / "cluster-a", 3, zk_connect=f"{zk.connect_string}/a/ledgers") as sb_a, \
                Sandbox(root / "cluster-b", 3, zk_connect=f"{zk.connect_string}/b/ledgers") as sb_b, \
                LedgerClient(sb_a.connect_string) as ca, LedgerClient(sb_b.connect_string) as cb:
            progress.step("clusters")
            res.update(_host_floors(root, 0.5 if args.quick else 3.0))
            progress.step("host floors")
            _on_a(ca, records, res, progress)
            rep = ReplicatorProcess(sb_a.connect_string, sb_b.connect_string, f"{NAMESPACE}/*", root,
                                    args.trigger_interval_ms, args.max_records_per_trigger)
            res["replicator"] = {"command": " ".join(["spark-bookie", *rep.cli_args]), "settings": rep.settings()}
            sampler = MetricsSampler(rep)
            try:
                res["replicated"] = replicate_backlog(sb_a, sb_b, (ca, cb), rep, sampler, records)
                progress.step("backlog replicated")
                res["steady"] = steady_state((ca, cb), sb_b.connect_string, rep, sampler, args.rate, steady_s)
                progress.step("steady state")
                sampler.phase = "behind"
                res["behind"] = backlog_behind(sb_a, sb_b, (ca, cb), rep, records)
                progress.step("backlog behind a running replicator")
            finally:
                sampler.stop()
                res["replicator"]["exit_code"] = rep.stop()
            res["metrics"] = {"scrapes": sampler.scrapes, "failures": sampler.failures, "max": sampler.max}
    finally:
        if rep is not None:
            rep.stop()
            if rep.log.exists():   # kept beside the JSON: the replicator's own account of the run
                shutil.copy(rep.log, Path(args.json).with_suffix(".replicator.log"))
        progress.close()
        zk.stop()
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args.json, _report)


# ---------------------------------------------------------------- the table


def _metric_max(res: dict[str, Any], phase: str, metric: str, stream: str) -> float | None:
    return res["metrics"]["max"].get(phase, {}).get(metric, {}).get(f"{NAMESPACE}/{stream}")


def _rows(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    w, cu, ar, rp, st = res["write"], res["catch_up"], res["catch_up_arrow"], res["replicated"], res["steady"]
    ratio = rp["records_per_s"] / cu["records_per_s"]
    lag_max = _metric_max(res, "steady", "replication_lag_seconds", STEADY)
    return [
        (f"backlog written on A (write_async, window {w['window']:,})", f"{w['records_per_s']:,.0f} records/s",
         f"{w['records']:,} records in {w['seconds']:.1f} s"),
        ("A catch-up read (read_batch, one reader)", f"{cu['records_per_s']:,.0f} records/s",
         f"client CPU {cu['client_cpu_us_per_record']:.2f} us/record"),
        ("A catch-up read (read_arrow_batch)",
         f"{ar['records_per_s']:,.0f} records/s" if "records_per_s" in ar else "-", ar.get("error", "")),
        ("replicated to B, from query start", f"{rp['records_per_s']:,.0f} records/s",
         f"{rp['held_on_b']:,} records in {rp['from_query_start_s']:.1f} s; {ratio:.3f}x catch-up"),
        ("replicated to B, batches after the first (Spark's JVM warm)",
         f"{rp['warm_records_per_s']:,.0f} records/s" if "warm_records_per_s" in rp else "-",
         (f"after the first {rp['first_batch_records']:,} records; "
          f"{rp['warm_records_per_s'] / cu['records_per_s']:.3f}x catch-up") if "warm_records_per_s" in rp else
         "one batch only"),
        ("replicated to B, from process start", f"{rp['records_per_s_from_process_start']:,.0f} records/s",
         f"{rp['from_process_start_s']:.1f} s (start-up {rp['startup_s']:.1f} s)"),
        ("steady lag A -> B at {:,.0f}/s, {:.0f} s".format(st["rate"], st["seconds"]),
         f"p50 {st['p50_ms'] / 1000:.2f} s  p99 {st['p99_ms'] / 1000:.2f} s  max {st['max_ms'] / 1000:.2f} s",
         f"{st['read_on_b']:,} of {st['written']:,} records read on B; {st.get('segments_on_b', '-')} segments on B"),
        ("replicator /metrics replication_lag_seconds, max in steady state",
         "-" if lag_max is None else f"{lag_max:.2f} s", f"{res['metrics']['scrapes']} scrapes"),
        *_behind_rows(res["behind"]),
    ]


def _behind_rows(bh: dict[str, Any]) -> list[tuple[str, str, str]]:
    w, cu = bh["write"], bh["catch_up"]
    first = "-" if bh["first_on_b_s"] is None else f"{bh['first_on_b_s']:.1f} s"
    return [
        ("backlog behind the running replicator, written on A (Spark stopped)", f"{w['records_per_s']:,.0f} records/s",
         f"{w['records']:,} records into a new stream in {w['seconds']:.1f} s"),
        ("A catch-up read of that backlog (read_batch, one reader)", f"{cu['records_per_s']:,.0f} records/s",
         f"client CPU {cu['client_cpu_us_per_record']:.2f} us/record"),
        ("replicated to B once Spark continues", f"{bh['records_per_s']:,.0f} records/s",
         f"{bh['held_on_b']:,} records in {bh['seconds']:.1f} s (first on B after {first}); "
         f"{bh['records_per_s'] / cu['records_per_s']:.3f}x catch-up"),
    ]


def _report(res: dict[str, Any]) -> None:
    cu, rp, st = res["catch_up"], res["replicated"], res["steady"]
    h, d = res["host_round_trip"], res["host_fdatasync"]
    ratio = rp["records_per_s"] / cu["records_per_s"]
    print()
    print(f"replicator: {res['replicator']['command']}")
    print("  settings: " + ", ".join(f"{k}={v}" for k, v in res["replicator"]["settings"].items()))
    print(f"namespace on A: {res['namespace']}; 3 bookies per cluster, default bookie settings")
    rows = _rows(res)
    width = max(len(r[0]) for r in rows)
    for what, figure, note in rows:
        print(f"{what:<{width}}  {figure:>38}  {note}")
    v = rp["verify"]
    print(f"B's backlog checked record by record: {v['checked']:,} records, {v['mismatched']} mismatched, "
          f"{v['records_past_the_end']} past the end ({'OK' if v['ok'] else 'WRONG: ' + str(v['first_mismatch'])})")
    print(f"while copying the backlog: replicator CPU {rp['replicator_cpu_s_after_start']:.1f} s (process tree, "
          f"after its query started), 6 bookies' CPU {rp['bookies_cpu_s']:.1f} s (from process start), "
          f"host steal {rp['host_steal_share']:.0%}; a new stream first on B after {st['new_stream_s']:.1f} s")
    print(f"host: one byte to another process and back at 1,000/s: p50 {h['p50_ms']:.2f} ms  p99 {h['p99_ms']:.2f} ms; "
          f"{RECORD_BYTES} bytes fdatasynced at 1,000/s: p50 {d['p50_ms']:.2f} ms  p99 {d['p99_ms']:.2f} ms; "
          f"steal during the steady run: {st['host_steal_share']:.0%}")
    print(f"load average {res['load_average_at_start'][0]:.1f} at start, {res['load_average_at_end'][0]:.1f} at end "
          "(2 cores)")
    bh = res["behind"]
    vb = bh["verify"]
    print(f"the backlog behind it, checked record by record: {vb['checked']:,} records, {vb['mismatched']} mismatched, "
          f"{vb['records_past_the_end']} past the end ({'OK' if vb['ok'] else 'WRONG: ' + str(vb['first_mismatch'])}); "
          f"replicator CPU {bh['replicator_cpu_s']:.1f} s, 6 bookies' CPU {bh['bookies_cpu_s']:.1f} s, "
          f"host steal {bh['host_steal_share']:.0%}")
    print(f"from a new replicator's start (its first batch starts Spark's Python processes): {ratio:.3f}x "
          f"catch-up ({rp['records_per_s']:,.0f} vs {cu['records_per_s']:,.0f} records/s)")
    complete = (rp["complete"] and v["ok"] and bh["complete"] and vb["ok"] and st["read_on_b"] == st["written"]
                and not st["write_failures"])
    behind = bh["records_per_s"] / bh["catch_up"]["records_per_s"]
    goals = {f"replicated records/s >= {GOAL_RATIO}x catch-up read, a backlog behind a running replicator":
             complete and behind >= GOAL_RATIO,
             f"steady lag p99 < {GOAL_P99_S:.0f} s": complete and st["p99_ms"] < GOAL_P99_S * 1000}
    figures = [f"{behind:.3f}x ({bh['records_per_s']:,.0f} vs {bh['catch_up']['records_per_s']:,.0f} records/s)",
               f"p99 {st['p99_ms'] / 1000:.2f} s"]
    res["goals"] = goals
    for (goal, ok), fig in zip(goals.items(), figures, strict=True):
        print(f"goal {goal}: {'met' if ok else 'missed'}: {fig}" + ("" if complete else " (copy incomplete)"))
