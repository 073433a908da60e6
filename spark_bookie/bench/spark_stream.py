"""`spark-bookie bench spark-stream`: Spark writing and reading streams, and tiered reads.

Three bookie processes, a namespace E3/Qw3/Qa2, one Spark session on local-cluster[2,1,1024].
Measured in the same run, each pair alternating (two rounds) so the host's load hits both sides:
(1) a DataFrame of 100-byte payloads written into a stream through the `ledger` sink (tasks write
    ledgers, the driver links them in one metadata change) against the same DataFrame written as a
    Delta table with delta-rs (Arrow collected on the driver, `write_deltalake`): goal (issue 32)
    >= 1x;
(2) a Spark aggregation over the stream through the `ledger` source against the sum of its
    executors' own stream-reader rates (each executor reads a share of the segments with the
    Python StreamReader, all at once): goal within 2x (the source's overhead);
(3) a Python catch-up read of a stream whose segments live in ledgers against the same records
    after tiering into Delta (`jobs/compact_to_delta.py --tier`, as a user runs it), through
    `read_batch` and through `read_arrow_batch`: goal (issue 32) tiered >= 1x ledgers, both ways.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench.common import finish
from spark_bookie.bench.stream import catch_up, catch_up_arrow

GOAL_WRITE_RATIO = 1.0
GOAL_TIERED_RATIO = 1.0
GOAL_READ_RATIO = 2.0
PAYLOAD_BYTES = 100


def add_spark_stream_parser(sub: Any) -> None:
    p = sub.add_parser("spark-stream",
                       help="Spark write/read of streams vs delta-rs and executor readers; tiered reads")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the DataFrame written")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--json", default="bench-spark-stream.json")
    p.add_argument("--quick", action="store_true", help="a smoke-sized run")
    p.set_defaults(func_bench=bench_spark_stream)


def _spark() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local-cluster[2,1,1024]").appName("bench-spark-stream")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).getOrCreate())


def _frame(spark: Any, rows: int, partitions: int) -> Any:
    pad = "x" * (PAYLOAD_BYTES - 12)
    df = spark.range(0, rows, numPartitions=partitions).selectExpr(
        f"cast(concat(lpad(cast(id AS string), 12, '0'), '{pad}') AS binary) AS payload")
    return df.cache()


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def write_pair(spark: Any, zk: str, df: Any, rows: int, workdir: Path, k: int) -> dict[str, float]:
    from deltalake import write_deltalake

    stream = f"bench/written-{k}"
    ours = _timed(lambda: df.write.format("ledger").option("zk", zk).option("stream", stream).mode("append").save())
    table = workdir / f"delta-{k}"
    theirs = _timed(lambda: write_deltalake(str(table), df.toArrow(), mode="append"))
    return {"stream_rows_per_s": rows / ours, "delta_rows_per_s": rows / theirs}


def _executor_read(zk: str, stream: str, shares: int) -> Any:
    """mapPartitions body: this task's share of the stream's segments, read with a StreamReader."""

    def run(index: int, _it: Iterator[Any]) -> Iterator[dict[str, Any]]:
        from ledger_client import DLSN, LedgerClient

        ns_name, name = stream.split("/", 1)
        with LedgerClient(zk) as c:
            ns = c.namespace(ns_name)
            segs = [s for s in ns.stream_info(name).segments if s.sequence % shares == index]
            n = 0
            t0 = time.perf_counter()
            for seg in segs:   # each segment of this share by a reader of its own, up to its end
                got = 0
                with ns.open_reader(name, start=DLSN(seg.sequence, 0, 0)) as r:
                    while got < seg.record_count:
                        got += sum(1 for rec in r.read_batch(100_000, 5_000) if rec.dlsn.segment == seg.sequence)
                n += got
            yield {"records": n, "seconds": time.perf_counter() - t0}

    return run


def read_pair(spark: Any, zk: str, stream: str, rows: int, executors: int) -> dict[str, float]:
    t0 = time.perf_counter()
    got = (spark.read.format("ledger").option("zk", zk).option("streams", stream).load()
           .selectExpr("count(*) AS n", "sum(length(payload)) AS b").collect()[0])
    spark_s = time.perf_counter() - t0
    if got["n"] != rows:
        raise RuntimeError(f"the Spark read of {stream} counted {got['n']} records, not {rows}")
    rdd = spark.sparkContext.parallelize(range(executors), executors)
    per = rdd.mapPartitionsWithIndex(_executor_read(zk, stream, executors)).collect()
    summed = sum(p["records"] / p["seconds"] for p in per if p["seconds"] > 0)
    return {"spark_records_per_s": rows / spark_s, "executors_summed_records_per_s": summed}


def _tier(zk: str, stream: str, table: Path) -> None:
    job = Path(__file__).resolve().parents[2] / "jobs" / "compact_to_delta.py"
    r = subprocess.run([sys.executable, str(job), "--zk", zk, "--stream", stream, "--table", str(table), "--tier",
                        "--engine", "local"], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"tiering {stream} failed: {r.stdout[-1000:]}{r.stderr[-1000:]}")


def bench_spark_stream(args: argparse.Namespace) -> int:
    from ledger_client import LedgerClient
    from spark_bookie.local.sandbox import Sandbox

    rows = 20_000 if args.quick else args.rows
    root = Path(tempfile.mkdtemp(prefix="bench-spark-stream-"))
    res: dict[str, Any] = {"rows": rows, "payload_bytes": PAYLOAD_BYTES, "load_average_at_start": os.getloadavg()}
    spark = None
    progress = StepProgress("bench spark-stream", ("spark", "writes", "reads", "tiering", "tiered reads"))
    try:
        with Sandbox(root / "cluster", 3) as sb, \
                LedgerClient(sb.connect_string) as client:
            ns = client.create_namespace("bench", ensemble_size=3, write_quorum_size=3, ack_quorum_size=2)
            spark = _spark()
            df = _frame(spark, rows, args.partitions)
            df.count()
            write_pair(spark, sb.connect_string, _frame(spark, 10_000, 2), 10_000, root, 99)   # warm-up
            progress.step("spark")
            res["write"] = [write_pair(spark, sb.connect_string, df, rows, root, k) for k in range(2)]
            progress.step("writes")
            res["read"] = [read_pair(spark, sb.connect_string, "bench/written-0", rows, 2) for _ in range(2)]
            progress.step("reads")
            _tier(sb.connect_string, "bench/written-1", root / "tiered")
            progress.step("tiering")
            res["tiered"] = [{"ledgers_records_per_s": catch_up(ns, "written-0", rows)["records_per_s"],
                              "delta_records_per_s": catch_up(ns, "written-1", rows)["records_per_s"],
                              "ledgers_arrow_records_per_s": catch_up_arrow(ns, "written-0", rows)["records_per_s"],
                              "delta_arrow_records_per_s": catch_up_arrow(ns, "written-1", rows)["records_per_s"]}
                             for _ in range(2)]
            progress.step("tiered reads")
    finally:
        progress.close()
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    return finish(res, args.json, _report)


def _mean(xs: list[dict[str, float]], key: str) -> float:
    return sum(x[key] for x in xs) / len(xs)


def _report(res: dict[str, Any]) -> None:
    w, r, t = res["write"], res["read"], res["tiered"]
    ours, delta = _mean(w, "stream_rows_per_s"), _mean(w, "delta_rows_per_s")
    spark, summed = _mean(r, "spark_records_per_s"), _mean(r, "executors_summed_records_per_s")
    led, tier = _mean(t, "ledgers_records_per_s"), _mean(t, "delta_records_per_s")
    led_a, tier_a = _mean(t, "ledgers_arrow_records_per_s"), _mean(t, "delta_arrow_records_per_s")
    print()
    print(f"Spark write of {res['rows']:,} rows of {res['payload_bytes']} bytes into a stream: {ours:>10,.0f} rows/s; "
          f"the same DataFrame as a Delta table with delta-rs: {delta:>10,.0f} rows/s; ratio {ours / delta:.2f}")
    print(f"Spark read of the stream (count, sum of lengths): {spark:>10,.0f} records/s; its executors' summed "
          f"StreamReader rates: {summed:>10,.0f} records/s; ratio {summed / spark:.2f}")
    print(f"Python catch-up read: segments in ledgers {led:>10,.0f} records/s; tiered into Delta {tier:>10,.0f} "
          f"records/s ({tier / led:.2f}x)")
    print(f"  through read_arrow_batch: segments in ledgers {led_a:>10,.0f} records/s; tiered into Delta "
          f"{tier_a:>10,.0f} records/s ({tier_a / led_a:.2f}x)")
    print(f"load average {res['load_average_at_start'][0]:.1f} at start, {res['load_average_at_end'][0]:.1f} at end "
          "(2 cores)")
    goals = {f"Spark write into a stream >= {GOAL_WRITE_RATIO}x delta-rs": ours >= GOAL_WRITE_RATIO * delta,
             f"Spark read within {GOAL_READ_RATIO}x of its executors' readers": summed <= GOAL_READ_RATIO * spark,
             f"tiered reads >= {GOAL_TIERED_RATIO}x ledger reads (read_batch and read_arrow_batch)":
                 tier >= GOAL_TIERED_RATIO * led and tier_a >= GOAL_TIERED_RATIO * led_a}
    res["goals"] = goals
    for goal, ok in goals.items():
        print(f"goal {goal}: {'PASS' if ok else 'FAIL'}")
