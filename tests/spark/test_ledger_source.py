"""spark.read.format("ledger") on a local-cluster against real bookies: exact rows, partitions,
pushdown, decoding, SQL — with no registration call (pyspark_ledger.DefaultSource is discovered)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from ledger_client import ClientConfig, LedgerClient

pytestmark = pytest.mark.spark

ROWS = StructType([StructField("ledger_id", LongType()), StructField("entry_id", LongType()),
                   StructField("payload", BinaryType())])


def payload(lid: int, eid: int) -> bytes:
    return f"ledger {lid} entry {eid} ".encode() * (1 + eid % 7)


def write(c: LedgerClient, n: int, e: int = 3, qw: int = 3, close: bool = True, **meta: bytes) -> int:
    w = c.create_ledger(e, qw, 2, password=b"pw", custom_metadata=meta)
    if close:
        for fut in [w.append_async(payload(w.ledger_id, i)) for i in range(n)]:
            fut.result(30)
        w.close()
    else:  # one at a time: each entry carries the LAC before it, so readers see n - 1 entries
        for i in range(n):
            w.append(payload(w.ledger_id, i))
    return w.ledger_id


def expected(spark, counts: dict[int, int]):
    rows = [(lid, eid, payload(lid, eid)) for lid, n in sorted(counts.items()) for eid in range(n)]
    return spark.createDataFrame(rows, ROWS)


def ordered(df):
    return df.orderBy("ledger_id", "entry_id")


@contextmanager
def pushdown_enabled(spark):
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "true")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def test_reads_exactly_the_entries_of_several_ledgers(spark, cluster_factory):
    sb = cluster_factory(3)
    with LedgerClient(sb.connect_string, config=ClientConfig(read_timeout_ms=5000)) as c:
        plain = write(c, 400, app=b"a")
        striped = write(c, 250, e=3, qw=2, app=b"a")
        empty = write(c, 0, app=b"a")
        other = write(c, 30, app=b"b")
        still_open = write(c, 40, close=False, app=b"a")
        reader = spark.read.format("ledger").option("zk", sb.connect_string).option("password", "pw")

        # Default: every closed ledger; 128 entries per partition → several tasks on both executors.
        df = reader.option("entries_per_partition", "128").load()
        assert df.schema == ROWS
        assert df.rdd.getNumPartitions() >= 6
        assert_df_equality(ordered(df), expected(spark, {plain: 400, striped: 250, other: 30}))

        # Custom-metadata filter, and an open ledger named explicitly (read up to its LAC, not fenced).
        df = reader.option("metadata.app", "a").load()
        counts = {r["ledger_id"]: r["count"] for r in df.groupBy("ledger_id").count().collect()}
        assert counts == {plain: 400, striped: 250}
        df = reader.option("ledgers", f"{still_open},{empty},{plain}").load()
        lac = c.open_ledger(still_open, b"pw", recovery=False).last_add_confirmed
        assert lac == 38
        assert_df_equality(ordered(df), expected(spark, {plain: 400, still_open: lac + 1}))
        assert not c.ledger_metadata(still_open).state.name == "CLOSED"

        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW ledger_rows USING ledger OPTIONS "
                  f"(zk '{sb.connect_string}', ledgers '{plain},{other}', password 'pw')")
        got = spark.sql("SELECT ledger_id, count(*) AS n, sum(length(payload)) AS bytes FROM ledger_rows "
                        "GROUP BY ledger_id ORDER BY ledger_id").collect()
        assert [tuple(r) for r in got] == [
            (lid, n, sum(len(payload(lid, i)) for i in range(n))) for lid, n in ((plain, 400), (other, 30))]

        with pytest.raises(Exception, match="wrong password"):
            spark.read.format("ledger").option("zk", sb.connect_string).option("ledgers", str(plain)).load().count()


def test_pushdown_prunes_ledgers_and_entry_ranges(spark, cluster_factory):
    sb = cluster_factory(3)
    with LedgerClient(sb.connect_string) as c:
        a, b = write(c, 300), write(c, 300, e=3, qw=2)
    reader = (spark.read.format("ledger").option("zk", sb.connect_string).option("password", "pw")
              .option("entries_per_partition", "50"))
    cases = [
        (F.col("ledger_id") == a, {a: range(300)}),
        ((F.col("entry_id") >= 120) & (F.col("entry_id") < 130), {a: range(120, 130), b: range(120, 130)}),
        ((F.col("ledger_id") == b) & F.col("entry_id").isin(5, 6, 7, 299, 400), {b: [5, 6, 7, 299]}),
        ((F.col("ledger_id") > a) & (F.col("entry_id") <= 3), {b: range(4)}),
    ]
    for cond, want in cases:
        rows = [(lid, e, payload(lid, e)) for lid, ids in want.items() for e in ids]
        with pushdown_enabled(spark):
            df = reader.load().where(cond)
            assert_df_equality(ordered(df), ordered(spark.createDataFrame(rows, ROWS)))
            pruned_parts = df.rdd.getNumPartitions()
        full_parts = reader.load().where(cond).rdd.getNumPartitions()   # pushdown off (Spark's default)
        assert full_parts == 12
        assert pruned_parts == max(1, -(-len(rows) // 50)) if len(want) == 1 else pruned_parts < full_parts
    with pushdown_enabled(spark):   # a filter on payload stays with Spark, and still applies
        n = reader.load().where((F.col("ledger_id") == a) & (F.length("payload") > 100)).count()
    assert n == sum(1 for e in range(300) if len(payload(a, e)) > 100)


def test_decode_utf8_and_json(spark, cluster_factory):
    sb = cluster_factory(3)
    docs = [json.dumps({"id": i, "name": f"n{i}", "extra": [1]}).encode() for i in range(20)]
    docs[3] = b"not json"
    docs[4] = b'{"id": "x", "name": 5}'
    docs[5] = json.dumps({"id": 5, "name": "two\nlines"}, indent=1).encode()   # an entry over several lines
    docs[6] = "caf\u00e9".encode() + b"\xff"
    with LedgerClient(sb.connect_string) as c:
        w = c.create_ledger(3, 3, 2)
        for d in docs:
            w.append(d)
        w.close()
        lid = w.ledger_id
    reader = spark.read.format("ledger").option("zk", sb.connect_string).option("ledgers", str(lid))
    text = reader.option("decode", "utf8").load()
    assert text.schema["payload"].dataType == StringType()
    got = [r["payload"] for r in ordered(text).collect()]
    assert got == [d.decode("utf-8", "replace") for d in docs]

    structs = reader.option("decode", "json").option("schema", "id INT, name STRING").load()
    assert structs.schema["payload"].dataType.simpleString() == "struct<id:int,name:string>"
    got = [(r["entry_id"], None if r["payload"] is None else (r["payload"]["id"], r["payload"]["name"]))
           for r in ordered(structs).collect()]
    want = [(i, (i, f"n{i}")) for i in range(20)]
    want[3], want[4], want[5], want[6] = (3, None), (4, None), (5, (5, "two\nlines")), (6, None)
    assert got == want
    assert ordered(structs).select("payload.name").collect()[0][0] == "n0"


def test_missing_zk_is_a_clear_error(spark, monkeypatch):
    monkeypatch.delenv("SPARK_BOOKIE_ZK", raising=False)
    with pytest.raises(Exception, match="needs option zk"):
        spark.read.format("ledger").load()


@pytest.mark.slow
def test_bench_scan_runs_end_to_end(tmp_path):
    """`spark-bookie bench scan` on a tiny ledger: prints its table and goals, writes JSON (speed is
    the benchmark's business, never asserted here)."""
    import subprocess
    import sys

    out = tmp_path / "scan.json"
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bench", "scan", "--total-mib", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["read_arrow"]["entries"] == data["entries"] == 2048
    assert data["spark_count"]["entries"] == 2048 and len(data["executor_read_arrow"]) == 4
    assert "goal read_arrow >= 100,000 entries/s per client" in r.stdout
