"""df.write / df.writeStream .format("ledger").option("stream", ...) on local-cluster: every row
lands exactly once (invariant 10), read back with the Python StreamReader, when tasks fail and
retry, when a job fails, and when a streaming query restarts from its checkpoint after Spark lost
the record of a batch it had committed to the stream."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from client_helpers import client  # noqa: E402
from stream_helpers import read_all  # noqa: E402

from ledger_client.stream.sink import TAG_STREAM  # noqa: E402

pytestmark = pytest.mark.spark


def namespace(c, name: str = "ns"):
    return c.create_namespace(name, ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                              output_buffer_bytes=2_000)


def unlinked_task_ledgers(c, ns, stream: str) -> set[int]:
    linked = {s.ledger_id for s in ns.stream_info(stream).segments} if ns.stream_exists(stream) else set()
    tagged = {lid for lid in c.list_ledgers() if TAG_STREAM in c.ledger_metadata(lid).custom_metadata}
    return tagged - linked


def test_batch_write_lands_once_with_assigned_then_given_txids(spark, cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = namespace(c)
        df = spark.range(0, 600, numPartitions=3).select(F.format_string("r-%05d", "id").alias("payload"))
        df.write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s").mode("append").save()
        recs = read_all(ns, "s", 600)
        assert [r.payload for r in recs] == [b"r-%05d" % i for i in range(600)]   # range partitions keep order
        assert [r.txid for r in recs] == list(range(600))
        info = ns.stream_info("s")
        assert len(info.segments) == 3 and all(s.state == "sealed" for s in info.segments)
        given = spark.range(0, 50, numPartitions=2).select(
            F.col("id").cast("string").cast("binary").alias("payload"), (F.col("id") * 10 + 1_000).alias("txid"))
        given.write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s").mode("append").save()
        recs = read_all(ns, "s", 650)
        assert [r.txid for r in recs[600:]] == [i * 10 + 1_000 for i in range(50)]
        with pytest.raises(Exception, match="TransactionIdOutOfOrder|below the stream's last txid"):
            given.write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s") \
                .mode("append").save()
        assert len(read_all(ns, "s", 650, timeout_s=2)) == 650
        assert unlinked_task_ledgers(c, ns, "s") == set()
        with pytest.raises(Exception, match="payload"):
            spark.range(3).write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s") \
                .mode("append").save()


def fail_first_attempt(marker_dir: str):
    """A UDF that raises in partition 1 on its first attempt, after the task wrote some rows."""
    def f(pid: int, value: str) -> str:
        import os

        from pyspark import TaskContext

        ctx = TaskContext.get()
        marker = os.path.join(marker_dir, f"failed-{ctx.partitionId()}")
        if ctx.partitionId() == 1 and pid >= 1_250 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected task failure")
        return value
    return F.udf(f, "string")


def test_a_failed_task_is_retried_and_its_rows_land_once(spark, cluster_factory, tmp_path):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = namespace(c)
        udf = fail_first_attempt(str(tmp_path))
        df = spark.range(0, 3_000, numPartitions=3).select(
            udf("id", F.format_string("r-%05d", "id")).alias("payload"))
        df.write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s").mode("append").save()
        assert (tmp_path / "failed-1").exists()
        recs = read_all(ns, "s", 3_000)
        assert [r.payload for r in recs] == [b"r-%05d" % i for i in range(3_000)]
        assert unlinked_task_ledgers(c, ns, "s") == set()


def test_a_failed_job_is_aborted_and_leaves_no_ledgers(spark, cluster_factory):
    sb = cluster_factory(1)

    def always_fail(pid: int) -> str:
        if pid >= 150:
            raise RuntimeError("injected job failure")
        return "x"

    with client(sb) as c:
        ns = namespace(c)
        ns.create_stream("s")
        df = spark.range(0, 300, numPartitions=3).select(F.udf(always_fail, "string")("id").alias("payload"))
        with pytest.raises(Exception, match="injected job failure"):
            df.write.format("ledger").option("zk", sb.connect_string).option("stream", "ns/s") \
                .mode("append").save()
        assert ns.stream_info("s").segments == []
        assert unlinked_task_ledgers(c, ns, "s") == set()


def run_available(spark, src: Path, zk: str, checkpoint: Path) -> None:
    q = (spark.readStream.format("text").load(str(src)).select(F.col("value").alias("payload"))
         .writeStream.format("ledger").option("zk", zk).option("stream", "ns/out")
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the streaming query did not finish"
    assert q.exception() is None, q.exception()


def test_streaming_write_lands_each_batch_once_across_restarts(spark, cluster_factory, tmp_path):
    sb = cluster_factory(1)
    src, ck = tmp_path / "src", tmp_path / "checkpoint"
    src.mkdir()
    lines = [[f"a-{i:04d}" for i in range(200)], [f"b-{i:04d}" for i in range(300)]]
    with client(sb) as c:
        ns = namespace(c)
        (src / "1.txt").write_text("\n".join(lines[0]) + "\n")
        run_available(spark, src, sb.connect_string, ck)
        (src / "2.txt").write_text("\n".join(lines[1]) + "\n")
        run_available(spark, src, sb.connect_string, ck)
        want = sorted(x.encode() for x in lines[0] + lines[1])
        recs = read_all(ns, "out", 500)
        assert sorted(r.payload for r in recs) == want and [r.txid for r in recs] == list(range(500))
        meta = c.store.streams.read_stream("ns", "out").meta
        assert len(meta.spark_batches) == 1 and list(meta.spark_batches.values()) == [1]
        # Spark loses the record of batch 1 (as if the driver died after our commit, before its own):
        # the restarted query runs batch 1 again, and the stream's record makes that a no-op.
        for f in (ck / "commits" / "1", ck / "commits" / ".1.crc"):
            f.unlink(missing_ok=True)
        run_available(spark, src, sb.connect_string, ck)
        assert (ck / "commits" / "1").exists()   # Spark ran batch 1 again and committed it
        assert sorted(r.payload for r in read_all(ns, "out", 500, timeout_s=3)) == want
        assert c.store.streams.read_stream("ns", "out").meta.spark_batches == meta.spark_batches
        assert unlinked_task_ledgers(c, ns, "out") == set()
        run_available(spark, src, sb.connect_string, ck)   # nothing new: nothing added
        assert len(read_all(ns, "out", 500, timeout_s=2)) == 500


def test_the_stream_writers_commit_called_twice_adds_nothing(spark, cluster_factory):
    from pyspark.sql.types import BinaryType, StructField, StructType

    from jobs.stream_sink import SinkMessage, StreamSinkStreamWriter
    from ledger_client.stream.sink import TaskLedgerWriter
    from metadata.streams.linking import SparkBatch

    sb = cluster_factory(1)
    with client(sb) as c:
        ns = namespace(c)
        writer = StreamSinkStreamWriter.build({"zk": sb.connect_string, "stream": "ns/s"},
                                              StructType([StructField("payload", BinaryType())]), False)
        batch = SparkBatch.query("direct", 5)
        msgs = []
        for p in range(2):
            w = TaskLedgerWriter(ns, "s", batch, p, relative_txids=True)
            w.add_many([b"%d-%d" % (p, i) for i in range(10)])
            msgs.append(SinkMessage(w.finish(), batch))
        writer.commit(msgs, 5)
        writer.commit(msgs, 5)
        with pytest.raises(Exception, match="batch 5"):
            writer.commit(msgs, 6)
        recs = read_all(ns, "s", 20, timeout_s=5)
        assert [r.payload for r in recs] == [b"%d-%d" % (p, i) for p in range(2) for i in range(10)]
        assert len(ns.stream_info("s").segments) == 2
    from jobs.connect import close_shared

    close_shared()   # the driver's steps ran in this process: their client goes before the cluster
