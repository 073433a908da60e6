"""spark.read / readStream .format("ledger").option("streams", ...) on a local-cluster against real
bookies: exactly the acknowledged records (counts, contents per stream, DLSN order) across tiered,
sealed and in-progress segments; globs; pushdown on stream and txid; a stream created later and
segments tiered while a query runs; a restart from the checkpoint reads nothing twice."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from chispa import assert_df_equality
from hosting_helpers import wait_until
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from jobs.compact_to_delta import main
from jobs.stream_tiering import TieringConfig, tier_streams
from ledger_client import ClientConfig, LedgerClient

pytestmark = pytest.mark.spark

KILLER = """
import os, sys
from jobs.stream_tiering import TieringConfig, tier_streams
zk, table, stream, step = sys.argv[1:5]
tier_streams(TieringConfig(zk, table, stream), hook=lambda name: name == step and os.kill(os.getpid(), 9))
sys.exit(3)
"""

ROWS = StructType([StructField("stream", StringType()), StructField("segment", LongType()),
                   StructField("entry_id", LongType()), StructField("slot", IntegerType()),
                   StructField("txid", LongType()), StructField("payload", BinaryType())])
ORDER = ("stream", "segment", "entry_id", "slot")


def payload(stream: str, i: int) -> bytes:
    return f"{stream} record {i} ".encode() * (1 + i % 5)


class Log:
    """What writers were told is durable: (stream, dlsn, txid, payload) per record."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def write(self, w, stream: str, txids: range) -> None:
        futs = [(t, w.write_async(payload(stream, t), txid=t)) for t in txids]
        for t, f in futs:
            d = f.result(30)
            self.rows.append((stream, d.segment, d.entry_id, d.slot, t, payload(stream, t)))

    def df(self, spark, streams: set[str] | None = None):
        rows = sorted(r for r in self.rows if streams is None or r[0] in streams)
        return spark.createDataFrame(rows, ROWS)


def visible(c: LedgerClient, ns, log: Log, stream: str, timeout_s: float = 30.0) -> None:
    """Wait until the segment in progress has a LAC that covers the last acknowledged record (the
    writer's idle control record carries it), so a read up to the LAC reads every such record."""
    seq, eid = max((r[1], r[2]) for r in log.rows if r[0] == f"{ns.name}/{stream}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seg = next(s for s in ns.stream_info(stream).segments if s.sequence == seq)
        if seg.state != "in_progress":
            return
        h = c.open_ledger(seg.ledger_id, ns.settings.ledger_password, recovery=False)
        if h.read_last_add_confirmed() >= eid:
            return
        time.sleep(0.05)
    raise AssertionError(f"{stream}: the LAC never covered entry {eid} of segment {seq}")


def ordered(df):
    return df.orderBy(*ORDER)


def read(spark, zk: str, streams: str, **opts: str):
    r = spark.read.format("ledger").option("zk", zk).option("streams", streams)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


@contextmanager
def pushdown_enabled(spark):
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _client(sb) -> LedgerClient:
    return LedgerClient(sb.connect_string, config=ClientConfig(zk_session_timeout_ms=4_000))


def test_batch_read_of_tiered_sealed_and_in_progress_segments(spark, cluster_factory, tmp_path):
    sb = cluster_factory(3)
    zk, table, log = sb.connect_string, str(tmp_path / "tier"), Log()
    with _client(sb) as c:
        pay = c.create_namespace("pay", segment_rolling_bytes=4_000, output_buffer_bytes=600)
        other = c.create_namespace("other")
        orders = pay.open_writer("orders")
        log.write(orders, "pay/orders", range(0, 400))
        tiered = tier_streams(TieringConfig(zk, table, "pay/orders"))
        assert tiered.marked["pay/orders"]
        log.write(orders, "pay/orders", range(400, 800))       # sealed segments, and one in progress
        with pay.open_writer("refunds") as w:
            log.write(w, "pay/refunds", range(1000, 1150))
        with other.open_writer("orders") as w:                 # not matched by the globs
            log.write(w, "other/orders", range(5))
        visible(c, pay, log, "orders")
        states = {s.state for s in pay.stream_info("orders").segments}
        assert states == {"tiered", "sealed", "in_progress"}

        df = read(spark, zk, "pay/orders,pay/*", entries_per_partition="20")
        assert df.schema == ROWS and df.rdd.getNumPartitions() > 3
        assert_df_equality(ordered(df), log.df(spark, {"pay/orders", "pay/refunds"}))
        assert_df_equality(ordered(read(spark, zk, "*/orders")), log.df(spark, {"pay/orders", "other/orders"}))

        text = read(spark, zk, "pay/refunds", decode="utf8").where(F.col("txid") == 1003).collect()
        assert [r.payload for r in text] == [payload("pay/refunds", 1003).decode()]

        with pushdown_enabled(spark):
            narrow = read(spark, zk, "pay/*", entries_per_partition="20").where(
                (F.col("stream") == "pay/orders") & (F.col("txid") >= 100) & (F.col("txid") < 120))
            assert narrow.rdd.getNumPartitions() < df.rdd.getNumPartitions()
            want = log.df(spark).where((F.col("stream") == "pay/orders") & F.col("txid").between(100, 119))
            assert_df_equality(ordered(narrow), ordered(want))
        with pytest.raises(Exception, match="does not exist"):
            read(spark, zk, "pay/nope").collect()

        # A tiering process killed after marking (ledgers not deleted yet), then the command run
        # again (spark-submit jobs/compact_to_delta.py --stream ... --tier, executors writing files)
        killed = subprocess.run([sys.executable, "-c", KILLER, zk, table, "pay/refunds", "marked"],
                                capture_output=True, text=True, timeout=120)
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert_df_equality(ordered(read(spark, zk, "pay/refunds")), log.df(spark, {"pay/refunds"}))
        assert main(["--zk", zk, "--table", table, "--stream", "pay/refunds", "--tier"], spark=spark) == 0
        assert {s.state for s in pay.stream_info("refunds").segments} == {"tiered"}
        assert_df_equality(ordered(read(spark, zk, "pay/*")), log.df(spark, {"pay/orders", "pay/refunds"}))
        orders.close()


def start_query(spark, zk: str, out: str, checkpoint: str, **opts: str):
    r = spark.readStream.format("ledger").option("zk", zk).option("streams", "pay/*")
    for k, v in opts.items():
        r = r.option(k, v)
    return (r.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())


def test_streaming_read_picks_up_new_streams_tiering_and_restarts(spark, cluster_factory, tmp_path):
    sb = cluster_factory(3)
    zk, table, log = sb.connect_string, str(tmp_path / "tier"), Log()
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with _client(sb) as c:
        pay = c.create_namespace("pay", segment_rolling_bytes=3_000, output_buffer_bytes=500)
        orders = pay.open_writer("orders")
        log.write(orders, "pay/orders", range(0, 300))
        visible(c, pay, log, "orders")
        q = start_query(spark, zk, out, ck)
        assert q.awaitTermination(180)
        assert_df_equality(ordered(spark.read.parquet(out)), log.df(spark))

        # While stopped: more records (the in-progress segment rolls), a new stream, and the
        # segments the first run read are tiered. The restart reads only what is new, in capped
        # microbatches, the tiered part of it from Delta.
        log.write(orders, "pay/orders", range(300, 700))
        with pay.open_writer("new") as w:
            log.write(w, "pay/new", range(50, 120))
        assert tier_streams(TieringConfig(zk, table, "pay/orders")).marked["pay/orders"]
        visible(c, pay, log, "orders")
        q = start_query(spark, zk, out, ck, max_records_per_trigger="150")
        assert q.awaitTermination(300)
        batches = [p for p in q.recentProgress if p["numInputRows"]]
        assert len(batches) >= 3 and all(p["numInputRows"] <= 150 + 40 for p in batches)
        assert_df_equality(ordered(spark.read.parquet(out)), log.df(spark))

        # startingOffsets=latest: a fresh query sees only what comes after it started.
        q = start_query(spark, zk, str(tmp_path / "out2"), str(tmp_path / "ck2"), startingOffsets="latest")
        assert q.awaitTermination(180)
        before = len(log.rows)
        log.write(orders, "pay/orders", range(700, 760))
        visible(c, pay, log, "orders")
        q = start_query(spark, zk, str(tmp_path / "out2"), str(tmp_path / "ck2"))
        assert q.awaitTermination(180)
        late = spark.createDataFrame(sorted(log.rows[before:]), ROWS)
        assert_df_equality(ordered(spark.read.parquet(str(tmp_path / "out2"))), late)
        orders.close()


def test_streaming_read_tails_a_live_writer_while_segments_are_tiered(spark, cluster_factory, tmp_path):
    sb = cluster_factory(3)
    zk, table, log = sb.connect_string, str(tmp_path / "tier"), Log()
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    with _client(sb) as c:
        pay = c.create_namespace("pay", segment_rolling_bytes=3_000, output_buffer_bytes=500)
        w = pay.open_writer("live")
        q = (spark.readStream.format("ledger").option("zk", zk).option("streams", "pay/live").load()
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
             .trigger(processingTime="1 second").start())
        try:
            def seen() -> int:
                return sum(p["numInputRows"] for p in q.recentProgress)

            for r in range(6):   # the query reads while the writer goes on and tiering moves segments
                before = seen()
                log.write(w, "pay/live", range(r * 100, r * 100 + 100))
                if r % 2:
                    tier_streams(TieringConfig(zk, table, "pay/live"))
                wait_until(lambda b=before: seen() > b, 120, f"round {r} to be read")
            visible(c, pay, log, "live")
            wait_until(lambda: seen() >= len(log.rows), 120, "every record to be read")
        finally:
            q.stop()
        assert {s.state for s in pay.stream_info("live").segments} >= {"tiered", "in_progress"}
        assert_df_equality(ordered(spark.read.parquet(out)), log.df(spark))
        w.close()
