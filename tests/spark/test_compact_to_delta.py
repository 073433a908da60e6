"""Compaction of closed ledgers into Delta, end to end: real bookies, real ZooKeeper, a real Spark
local-cluster for phase one (executors read ledgers and write parquet), delta-rs commits.

What a user would notice: every entry of every closed ledger is in the table exactly once however
often compaction runs or crashes; open ledgers are not touched; ledgers are deleted only when the
table holds them; Spark reads the table back equal to the ledgers (without the Delta jars).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import types as T

import jobs.delta_compaction as dc
from jobs.compact_to_delta import main
from jobs.delta_read import delta_jars_available, read_delta
from jobs.errors import ConcurrentCompactionError
from ledger_client import ClientConfig, LedgerClient

pytestmark = pytest.mark.spark

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=3_000, read_timeout_ms=3_000, operation_timeout_ms=60_000,
                    zk_session_timeout_ms=4_000)
ENTRIES_SCHEMA = T.StructType([T.StructField("ledger_id", T.LongType()), T.StructField("entry_id", T.LongType()),
                               T.StructField("payload", T.BinaryType())])


def payload(lid: int, eid: int) -> bytes:
    return f"ledger {lid} entry {eid} ".encode() * (1 + eid % 5)


def write_ledger(c: LedgerClient, n: int, close: bool = True, password: bytes = PW):
    w = c.create_ledger(3, 2, 2, password=password)
    futs = [w.append_async(payload(w.ledger_id, i)) for i in range(n)]
    for f in futs:
        f.result(timeout=30)
    if close:
        w.close()
    return w


def ledger_entries(spark, c: LedgerClient, ids, password: bytes = PW):
    """What the ledgers hold, read back through the client (the reference for the table)."""
    rows = []
    for lid in ids:
        r = c.open_ledger(lid, password=password, recovery=False)
        if r.last_add_confirmed >= 0:
            rows += [(e.ledger_id, e.entry_id, e.data) for e in r.read(0, r.last_add_confirmed)]
    return spark.createDataFrame(rows, ENTRIES_SCHEMA)


def table_entries(spark, path: Path):
    return read_delta(spark, path).select("ledger_id", "entry_id", "payload")


def compact(spark, zk: str, table: Path, *extra: str, capsys=None) -> dict:
    argv = ["--zk", zk, "--table", str(table), "--password", PW.decode(), "--entries-per-read", "100", *extra]
    assert main(argv, spark=spark) == 0
    if capsys is None:
        return {}
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_compaction_twice_gives_each_entry_once_and_skips_open_ledgers(spark, cluster_factory, tmp_path, capsys):
    sb = cluster_factory(3)
    table = tmp_path / "table"
    with LedgerClient(sb.connect_string, config=FAST) as c:
        closed = [write_ledger(c, n).ledger_id for n in (250, 0, 7, 31)]   # 250 → three read batches
        open_w = write_ledger(c, 5, close=False)
        assert not delta_jars_available(spark)   # so read_delta reads the snapshot's file list

        first = compact(spark, sb.connect_string, table, capsys=capsys)
        assert first["compacted"] == closed and first["skipped_not_closed"] == [open_w.ledger_id]
        assert first["rows"] == 288
        assert_df_equality(table_entries(spark, table), ledger_entries(spark, c, closed),
                           ignore_row_order=True, ignore_nullable=True)

        second = compact(spark, sb.connect_string, table, capsys=capsys)
        assert second["compacted"] == [] and second["already_compacted"] == closed
        assert second["table_version"] == first["table_version"]     # nothing committed at all
        assert_df_equality(table_entries(spark, table), ledger_entries(spark, c, closed),
                           ignore_row_order=True, ignore_nullable=True)

        open_w.close()   # once closed, the next run picks it up, and only it
        third = compact(spark, sb.connect_string, table, capsys=capsys)
        assert third["compacted"] == [open_w.ledger_id]
        assert_df_equality(table_entries(spark, table), ledger_entries(spark, c, [*closed, open_w.ledger_id]),
                           ignore_row_order=True, ignore_nullable=True)
        assert c.ledger_metadata(closed[0]) is not None   # without --delete-after-commit nothing is deleted


def test_crash_between_write_and_commit_leaves_no_duplicate(spark, cluster_factory, tmp_path, monkeypatch):
    sb = cluster_factory(3)
    table = tmp_path / "table"
    real_commit = dc.commit_files

    def crash(tbl, files, ledgers, partition_column):
        assert files and all((table / f.path).exists() for f in files)   # phase one really wrote them
        raise RuntimeError("driver died before the Delta commit")

    with LedgerClient(sb.connect_string, config=FAST) as c:
        ids = [write_ledger(c, n).ledger_id for n in (40, 60)]
        monkeypatch.setattr(dc, "commit_files", crash)
        with pytest.raises(RuntimeError, match="driver died"):
            main(["--zk", sb.connect_string, "--table", str(table), "--password", "pw"], spark=spark)
        orphans = list(table.rglob("*.parquet"))
        assert orphans, "phase one left its files behind"
        assert read_delta(spark, table).count() == 0                 # the snapshot does not see them
        assert spark.read.parquet(str(table)).count() == 100         # listing the directory does

        monkeypatch.setattr(dc, "commit_files", real_commit)
        compact(spark, sb.connect_string, table)
        assert_df_equality(table_entries(spark, table), ledger_entries(spark, c, ids),
                           ignore_row_order=True, ignore_nullable=True)
        # Why never spark.read.parquet(dir): the crashed run's files are still there and counted twice.
        assert spark.read.parquet(str(table)).count() == 200
        assert read_delta(spark, table).count() == 100


def test_delete_after_commit_deletes_only_compacted_ledgers(spark, cluster_factory, tmp_path, monkeypatch, capsys):
    sb = cluster_factory(3)
    table = tmp_path / "table"
    with LedgerClient(sb.connect_string, config=FAST) as c:
        done = [write_ledger(c, n).ledger_id for n in (12, 3)]
        still_open = write_ledger(c, 4, close=False)
        foreign = write_ledger(c, 6, password=b"other").ledger_id    # another application's ledger
        unlisted = write_ledger(c, 2).ledger_id                      # closed but not asked for
        listed = ",".join(str(i) for i in [*done, still_open.ledger_id, foreign])

        def failing_commit(*args, **kwargs):
            raise ConcurrentCompactionError("simulated lost commit")

        monkeypatch.setattr(dc, "commit_files", failing_commit)
        assert main(["--zk", sb.connect_string, "--table", str(table), "--password", "pw", "--ledgers", listed,
                     "--delete-after-commit"], spark=spark) == 1
        assert set(done) <= set(c.list_ledgers()), "a failed commit must not delete anything"
        monkeypatch.undo()
        capsys.readouterr()

        out = compact(spark, sb.connect_string, table, "--ledgers", listed, "--delete-after-commit", capsys=capsys)
        assert out["deleted"] == done and out["skipped_wrong_password"] == [foreign]
        assert sorted(c.list_ledgers()) == sorted([still_open.ledger_id, foreign, unlisted])
        assert sorted(r.ledger_id for r in read_delta(spark, table).select("ledger_id").distinct().collect()) == done
        assert read_delta(spark, table).count() == 15
        still_open.close()


def test_partition_by_date_and_a_ledger_subset(spark, cluster_factory, tmp_path, capsys):
    sb = cluster_factory(3)
    table = tmp_path / "by-date"
    with LedgerClient(sb.connect_string, config=FAST) as c:
        a, b = (write_ledger(c, n).ledger_id for n in (20, 9))
        day = dc.ctime_date(c.ledger_metadata(a).ctime).isoformat()
        compact(spark, sb.connect_string, table, "--partition-by", "date", "--ledgers", str(a))
        assert [p.name for p in table.iterdir() if not p.name.startswith("_")] == [f"ctime_date={day}"]
        assert_df_equality(table_entries(spark, table), ledger_entries(spark, c, [a]),
                           ignore_row_order=True, ignore_nullable=True)

        out = compact(spark, sb.connect_string, table, "--partition-by", "date", capsys=capsys)
        assert out["compacted"] == [b] and out["already_compacted"] == [a]
        df = read_delta(spark, table)
        assert df.columns == ["ledger_id", "entry_id", "payload", "ctime_date"]
        assert {str(r.ctime_date) for r in df.select("ctime_date").distinct().collect()} == {day}
        assert_df_equality(df.select("ledger_id", "entry_id", "payload"), ledger_entries(spark, c, [a, b]),
                           ignore_row_order=True, ignore_nullable=True)
        # The table keeps the partitioning it was created with: a mismatch is a usage error (exit 2).
        assert main(["--zk", sb.connect_string, "--table", str(table), "--partition-by", "ledger_id"],
                    spark=spark) == 2


def test_a_racing_run_on_the_same_ledgers_cannot_commit_them_again(cluster_factory, tmp_path):
    """Two compactions of the same ledger at once: the second commit is refused, nothing doubles."""
    sb = cluster_factory(3)
    table = tmp_path / "table"
    cfg = dc.CompactionConfig(sb.connect_string, str(table), password=PW)
    real_commit = dc.commit_files

    def racing_commit(tbl, files, ledgers, partition_column):
        dc.commit_files = real_commit          # the rival run commits first, normally
        try:
            dc.compact(cfg)
        finally:
            dc.commit_files = racing_commit
        return real_commit(tbl, files, ledgers, partition_column)

    with LedgerClient(sb.connect_string, config=FAST) as c:
        lid = write_ledger(c, 30).ledger_id
        dc.commit_files = racing_commit
        try:
            with pytest.raises(ConcurrentCompactionError):
                dc.compact(cfg)
        finally:
            dc.commit_files = real_commit
        from deltalake import DeltaTable

        rows = DeltaTable(str(table)).to_pyarrow_table()
        assert rows.num_rows == 30 and set(rows.column("ledger_id").to_pylist()) == {lid}
