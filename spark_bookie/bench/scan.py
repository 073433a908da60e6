"""`spark-bookie bench scan`: scanning a closed ledger with read_arrow, and with Spark.

Three bookie processes (--bookies); one E3/Qw3/Qa2 ledger of 1 KiB entries (1 GiB by default,
--total-mib to shrink) and the same entries in a striped ledger (E = --bookies, Qw2/Qa2: no bookie
holds a contiguous range). Measured in the same run: (1) one client's ReadHandle.read_arrow over the
whole closed ledger (entries/s, MB/s, client CPU per entry), the unstriped and the striped ledger
alternately, two rounds each; (2) a Spark count through the `ledger` source on
local-cluster[2,1,1024]; (3) each executor's own read_arrow rate on its share of the ledger, all
executors at once (a plain mapPartitions, no data source). Goals (issue 6): read_arrow >= 100,000
entries/s per client, and the Spark scan within 2x of the sum of its executors' read_arrow rates
(the data source's overhead: planning, Arrow hand-off to the JVM, task scheduling). Issue 17: the
striped scan >= 0.8x the unstriped one, and >= 100,000 entries/s.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench.common import finish

GOAL_ENTRIES_PER_S = 100_000
GOAL_SPARK_RATIO = 2.0
GOAL_STRIPED_RATIO = 0.8
SCAN_WINDOW = 65_536   # entries per read_arrow call in a scan (64 MiB of 1 KiB entries)


def add_scan_parser(sub: Any) -> None:
    p = sub.add_parser("scan", help="read_arrow scan of a closed ledger and a Spark count via the ledger source")
    p.add_argument("--total-mib", type=int, default=1024, help="size of the ledger to scan")
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--executors", type=int, default=2, help="Spark executors (local-cluster[N,1,1024])")
    p.add_argument("--bookies", type=int, default=3, help="bookie processes; the striped ledger is E=bookies, Qw=2")
    p.add_argument("--json", default="bench-scan.json")
    p.add_argument("--quick", action="store_true", help="a 16 MiB ledger (smoke test)")
    p.set_defaults(func_bench=bench_scan)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scan(zk: str, ledger_id: int, first: int, last: int, window: int = SCAN_WINDOW) -> dict[str, float]:
    """read_arrow over first..last in windows, by one client; rows and payload bytes are checked."""
    from ledger_client import LedgerClient

    with LedgerClient(zk) as c:
        h = c.open_ledger(ledger_id, b"", recovery=False)
        h.read_arrow(first, first)  # not timed: imports, channels to the bookies
        rows = nbytes = 0
        c0, t0 = _cpu_s(), time.perf_counter()
        for a in range(first, last + 1, window):
            b = h.read_arrow(a, min(last, a + window - 1))
            rows += b.num_rows
            nbytes += b.column(2).nbytes
        elapsed, cpu = time.perf_counter() - t0, _cpu_s() - c0
    if rows != last - first + 1:
        raise RuntimeError(f"read_arrow returned {rows} rows for {last - first + 1} entries")
    return {"entries": rows, "seconds": elapsed, "entries_per_s": rows / elapsed, "mb_per_s": nbytes / elapsed / 1e6,
            "client_cpu_us_per_entry": cpu / rows * 1e6}


def _executor_scan(zk: str, ledger_id: int, entries: int, shares: int) -> Any:
    """mapPartitions body: this task's share of the ledger, read with read_arrow on its executor."""

    def run(index: int, _it: Iterator[Any]) -> Iterator[dict[str, Any]]:
        per = -(-entries // shares)
        first, last = index * per, min(entries, (index + 1) * per) - 1
        if first > last:
            return
        res: dict[str, Any] = dict(scan(zk, ledger_id, first, last))
        res["task"] = index
        res["worker_daemon_pid"] = os.getppid()   # one pyspark daemon per executor
        yield res

    return run


def _write_ledger(client: Any, entries: int, size: int, ensemble: int = 3, write_quorum: int = 3) -> tuple[int, float]:
    w = client.create_ledger(ensemble, write_quorum, 2)
    payload = os.urandom(size)
    t0 = time.perf_counter()
    window = 5_000   # well below the bookie's per-stream in-flight limit, even for the replica that lags
    for a in range(0, entries, window):  # bounded memory: one window of futures at a time
        futs = [w.append_async(payload) for _ in range(a, min(entries, a + window))]
        futs[-1].result(timeout=600)
    elapsed = time.perf_counter() - t0
    w.close()
    return w.ledger_id, entries / elapsed


def _spark(executors: int) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(f"local-cluster[{executors},1,1024]").appName("bench-scan")
            .config("spark.ui.enabled", "false").config("spark.driver.memory", "1g")
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).getOrCreate())


def spark_scans(spark: Any, zk: str, ledger_id: int, entries: int, executors: int,
                warm_ledger_id: int) -> dict[str, Any]:
    """Warm the Python workers, then: a Spark count via the source; each executor's read_arrow rate."""
    def df(lid: int) -> Any:
        return spark.read.format("ledger").option("zk", zk).option("ledgers", str(lid))

    # Warm-up on a small ledger: Python workers forked, modules imported on every executor.
    df(warm_ledger_id).option("min_partitions", str(executors)).load().count()
    rdd = spark.sparkContext.parallelize(range(executors), executors)
    # The executors' own rate right before and right after the Spark count (this machine's load
    # moves a lot; the mean of the two is what the count is compared with).
    before = rdd.mapPartitionsWithIndex(_executor_scan(zk, ledger_id, entries, executors)).collect()
    parts = max(executors, -(-entries // 100_000))
    t0 = time.perf_counter()
    n = df(ledger_id).option("min_partitions", str(parts)).load().count()
    spark_s = time.perf_counter() - t0
    if n != entries:
        raise RuntimeError(f"Spark counted {n} rows for {entries} entries")
    after = rdd.mapPartitionsWithIndex(_executor_scan(zk, ledger_id, entries, executors)).collect()
    sums = [sum(r["entries_per_s"] for r in runs) for runs in (before, after)]
    sum_rates = (sums[0] + sums[1]) / 2
    return {"spark_count": {"entries": n, "seconds": spark_s, "entries_per_s": n / spark_s, "partitions": parts},
            "executor_read_arrow": before + after, "executors_sum_entries_per_s_before_after": sums,
            "executors_sum_entries_per_s": sum_rates, "ratio_sum_of_executors_to_spark": sum_rates / (n / spark_s)}


def _plain_and_striped(zk: str, plain: int, striped: int, entries: int, bookies: int) -> dict[str, Any]:
    """read_arrow of the unstriped and the striped ledger, alternately, two rounds (the host's load
    moves within minutes; alternating puts both under the same), each figure the mean of its two."""
    for lid in (plain, striped):
        scan(zk, lid, 0, min(entries, 20_000) - 1)  # warm-up
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "striped": []}
    for _round in range(2):
        runs["plain"].append(scan(zk, plain, 0, entries - 1))
        runs["striped"].append(scan(zk, striped, 0, entries - 1))

    def mean(rs: list[dict[str, float]]) -> dict[str, float]:
        return {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}

    plain_r, striped_r = mean(runs["plain"]), mean(runs["striped"])
    return {"read_arrow": plain_r, "read_arrow_striped": striped_r, "read_arrow_runs": runs,
            "striped_shape": f"E{bookies}/Qw2/Qa2",
            "striped_to_plain": striped_r["entries_per_s"] / plain_r["entries_per_s"]}


def bench_scan(args: argparse.Namespace) -> int:
    from ledger_client import LedgerClient
    from spark_bookie.local.sandbox import Sandbox

    total = (16 << 20) if args.quick else args.total_mib << 20
    entries = max(1, total // args.entry_bytes)
    root = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    res: dict[str, Any] = {"entries": entries, "entry_bytes": args.entry_bytes, "executors": args.executors,
                           "load_average_at_start": os.getloadavg()}
    progress = StepProgress("bench scan", ("ledgers written", "read_arrow scans", "Spark scans"))
    try:
        with Sandbox(root / "cluster", max(3, args.bookies)) as sb:
            with LedgerClient(sb.connect_string) as client:
                lid, res["write_entries_per_s"] = _write_ledger(client, entries, args.entry_bytes)
                striped, _rate = _write_ledger(client, entries, args.entry_bytes, max(3, args.bookies), 2)
                warm_lid, _rate = _write_ledger(client, 1000, args.entry_bytes)
            progress.step("ledgers written")
            res.update(_plain_and_striped(sb.connect_string, lid, striped, entries, max(3, args.bookies)))
            progress.step("read_arrow scans")
            spark = _spark(args.executors)
            try:
                res.update(spark_scans(spark, sb.connect_string, lid, entries, args.executors, warm_lid))
                progress.step("Spark scans")
            finally:
                spark.stop()
    finally:
        progress.close()
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args.json, _report)


def _report(res: dict[str, Any]) -> None:
    ra, sc = res["read_arrow"], res["spark_count"]
    print()
    print(f"ledger: {res['entries']:,} entries of {res['entry_bytes']} B (written at "
          f"{res['write_entries_per_s']:,.0f} entries/s); load average {res['load_average_at_start'][0]:.1f} "
          f"at start, {res['load_average_at_end'][0]:.1f} at end (2 cores)")
    print(f"read_arrow, 1 client:       {ra['entries_per_s']:>10,.0f} entries/s  {ra['mb_per_s']:,.0f} MB/s  "
          f"client CPU {ra['client_cpu_us_per_entry']:.1f} us/entry  (E3/Qw3/Qa2, mean of 2 runs)")
    st = res["read_arrow_striped"]
    print(f"read_arrow, striped:        {st['entries_per_s']:>10,.0f} entries/s  {st['mb_per_s']:,.0f} MB/s  "
          f"client CPU {st['client_cpu_us_per_entry']:.1f} us/entry  ({res['striped_shape']}, mean of 2 runs; "
          f"{res['striped_to_plain']:.2f}x the unstriped)")
    for r in res["executor_read_arrow"]:
        print(f"read_arrow, executor task {r['task']:<2} {r['entries_per_s']:>10,.0f} entries/s  "
              f"{r['mb_per_s']:,.0f} MB/s  ({r['entries']:,} entries)")
    b, a = res["executors_sum_entries_per_s_before_after"]
    print(f"executors together (sum):   {res['executors_sum_entries_per_s']:>10,.0f} entries/s  "
          f"(mean of {b:,.0f} before and {a:,.0f} after the Spark count)")
    print(f"Spark count via the source: {sc['entries_per_s']:>10,.0f} entries/s  ({sc['seconds']:.1f} s, "
          f"{sc['partitions']} partitions); sum of executors / Spark = {res['ratio_sum_of_executors_to_spark']:.2f}")
    goals = {
        f"read_arrow >= {GOAL_ENTRIES_PER_S:,} entries/s per client": ra["entries_per_s"] >= GOAL_ENTRIES_PER_S,
        f"striped read_arrow >= {GOAL_STRIPED_RATIO}x the unstriped and >= {GOAL_ENTRIES_PER_S:,} entries/s":
            res["striped_to_plain"] >= GOAL_STRIPED_RATIO and st["entries_per_s"] >= GOAL_ENTRIES_PER_S,
        f"Spark scan within {GOAL_SPARK_RATIO}x of its executors' read_arrow":
            res["ratio_sum_of_executors_to_spark"] <= GOAL_SPARK_RATIO,
    }
    res["goals"] = goals
    for goal, ok in goals.items():
        print(f"goal {goal}: {'PASS' if ok else 'FAIL'}")
