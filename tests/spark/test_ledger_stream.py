"""spark.readStream.format("ledger") while a writer appends: every entry exactly once, across a
ledger that closes, a ledger that appears, and a restart from the checkpoint."""

from __future__ import annotations

import threading
import time

import pytest
from chispa import assert_df_equality
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from ledger_client import LedgerClient

pytestmark = pytest.mark.spark

ROWS = StructType([StructField("ledger_id", LongType()), StructField("entry_id", LongType()),
                   StructField("payload", BinaryType())])


def payload(lid: int, eid: int) -> bytes:
    return f"{lid}/{eid}|".encode() * 8


class Writer(threading.Thread):
    """Appends to two ledgers of stream s1 (plus one of s2, which the query must not see). Once the
    query has seen rows, the first ledger closes and a new s1 ledger takes its place; the writer
    stops once the query has seen rows of that phase too. Records what was acknowledged."""

    def __init__(self, client: LedgerClient, seen_rows, pause_s: float = 0.05, rounds_min: int = 30) -> None:
        super().__init__(daemon=True)
        self.c, self.seen_rows, self.pause_s, self.rounds_min = client, seen_rows, pause_s, rounds_min
        self.written: dict[int, int] = {}
        self.tailed: list[int] = []   # rows the query had seen at the end of each phase
        self.error: BaseException | None = None

    def _new(self, stream: bytes):
        return self.c.create_ledger(3, 3, 2, password=b"pw", custom_metadata={"stream": stream})

    def _phase(self, live: list, seen_before: int, deadline_s: float = 180.0) -> None:
        end = time.monotonic() + deadline_s
        rounds = 0
        while rounds < self.rounds_min or (self.seen_rows() <= seen_before and time.monotonic() < end):
            for w in live:   # one at a time: each entry carries the LAC, so readers see the one before
                eid = w.append(payload(w.ledger_id, self.written.get(w.ledger_id, 0)))
                self.written[w.ledger_id] = eid + 1
            rounds += 1
            time.sleep(self.pause_s)
        self.tailed.append(self.seen_rows())

    def run(self) -> None:
        try:
            a, b, other = self._new(b"s1"), self._new(b"s1"), self._new(b"s2")
            live = [a, b, other]
            self._phase(live, 0)
            a.close()
            live[0] = self._new(b"s1")
            self._phase(live, self.tailed[-1])
            for w in live:
                w.close()
            self.written.pop(other.ledger_id)
        except BaseException as e:  # surfaced by the test
            self.error = e


def expected(spark, counts: dict[int, int]):
    rows = [(lid, e, payload(lid, e)) for lid, n in sorted(counts.items()) for e in range(n)]
    return spark.createDataFrame(rows, ROWS).orderBy("ledger_id", "entry_id")


def start(spark, zk: str, out: str, checkpoint: str):
    df = (spark.readStream.format("ledger").option("zk", zk).option("password", "pw")
          .option("metadata.stream", "s1").load())
    return (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second").start())


def test_stream_sees_every_entry_once_while_a_writer_appends(spark, cluster_factory, tmp_path):
    sb = cluster_factory(3)
    out, ck = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    with LedgerClient(sb.connect_string) as c:
        query = start(spark, sb.connect_string, out, ck)
        try:
            writer = Writer(c, lambda: sum(p["numInputRows"] for p in query.recentProgress))
            writer.start()
            writer.join(timeout=420)
            assert not writer.is_alive() and writer.error is None, writer.error
            query.processAllAvailable()
        finally:
            query.stop()
        assert len(writer.written) == 3
        # The query was tailing: it saw rows while the first ledgers were open, then more rows
        # while the new ledger was being written.
        assert 0 < writer.tailed[0] < writer.tailed[1] < sum(writer.written.values())
        result = spark.read.parquet(out).orderBy("ledger_id", "entry_id")
        assert_df_equality(result, expected(spark, writer.written))

        # Restart from the checkpoint: nothing is read twice; a ledger created meanwhile is picked up.
        w = c.create_ledger(3, 3, 2, password=b"pw", custom_metadata={"stream": b"s1"})
        for i in range(25):
            w.append(payload(w.ledger_id, i))
        w.close()
        query = start(spark, sb.connect_string, out, ck)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        result = spark.read.parquet(out).orderBy("ledger_id", "entry_id")
        assert_df_equality(result, expected(spark, {**writer.written, w.ledger_id: 25}))
