"""readStream.format("ledger").option("subscription", NAME) on a local-cluster against real
bookies (DESIGN §4.11): an availableNow query and then a running one commit the subscription as
their batches commit (no backlog left, the position at the last record read), the restarted
query reads from its checkpoint, and a Python reader of the subscription resumes right after what
the queries consumed."""

from __future__ import annotations

import pytest
from hosting_helpers import wait_until

from ledger_client import ClientConfig, LedgerClient

pytestmark = pytest.mark.spark


def write(w, txids: range) -> list:
    futs = [w.write_async(f"record {t}".encode(), txid=t) for t in txids]
    return [f.result(30) for f in futs]


def start_query(spark, zk: str, out: str, ck: str, **trigger):
    return (spark.readStream.format("ledger").option("zk", zk).option("streams", "pay/orders")
            .option("subscription", "etl").load()
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
            .trigger(**trigger).start())


def test_queries_commit_their_subscription_and_a_reader_resumes_after_it(spark, cluster_factory, tmp_path):
    sb = cluster_factory(3)
    zk, out, ck = sb.connect_string, str(tmp_path / "out"), str(tmp_path / "ck")
    with LedgerClient(zk, config=ClientConfig(zk_session_timeout_ms=4_000)) as c:
        pay = c.create_namespace("pay", segment_rolling_bytes=3_000, output_buffer_bytes=500)
        w = pay.open_writer("orders")
        first = write(w, range(200))
        wait_until(lambda: pay.stream_info("orders").last_dlsn == first[-1], 30, "the last record to be visible")

        def caught_up(last) -> bool:
            s = pay.subscriptions("orders").get("etl")
            return s is not None and s.backlog_records == 0 and s.position >= last

        q = start_query(spark, zk, out, ck, availableNow=True)
        assert q.awaitTermination(180)
        assert caught_up(first[-1]), pay.subscriptions("orders")

        more = write(w, range(200, 300))     # a running query from the same checkpoint reads only these
        q = start_query(spark, zk, out, ck, processingTime="1 second")
        try:
            wait_until(lambda: caught_up(more[-1]), 120, "the running query's subscription to catch up")
        finally:
            q.stop()
        assert spark.read.parquet(out).count() == 300

        tail = write(w, range(300, 310))
        with pay.open_reader("orders", subscription="etl") as r:
            got: list = []
            while len(got) < len(tail):
                got += r.read_batch(100, 5_000)
        assert [rec.dlsn for rec in got] == tail
        w.close()
