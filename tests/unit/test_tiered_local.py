"""A local tiered table is read by pyarrow itself (ledger_client/stream/tiered_local.py): the same
rows, order and counts as through delta-rs, files pruned by the Delta log's statistics, and a table
written again at the same path read again, never from the file list kept for the old one."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake

from ledger_client.stream import tiered, tiered_local
from metadata.streams import SegmentMeta, SegmentState

pytestmark = pytest.mark.unit


def rows(stream: str, segment: int, entries: range, slots: int = 3, tag: bytes = b"") -> pa.Table:
    cols: dict[str, list] = {c: [] for c in tiered.COLUMNS}
    for e in entries:
        for s in range(slots):
            cols["stream"].append(stream)
            cols["segment"].append(segment)
            cols["entry_id"].append(e)
            cols["slot"].append(s)
            cols["txid"].append(e * slots + s)
            cols["payload"].append(tag + f"{stream}/{segment}/{e}/{s}".encode())
    return pa.table(cols, schema=tiered.table_schema())


@pytest.fixture()
def table(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows("ns/a", 1, range(0, 40)))        # version 0
    write_deltalake(path, rows("ns/b", 1, range(0, 30)), mode="append")   # 1: another stream's segment 1
    write_deltalake(path, rows("ns/a", 2, range(0, 25)), mode="append")   # 2
    mixed = pa.concat_tables([rows("ns/a", 3, range(0, 50)), rows("ns/b", 3, range(0, 10)),
                              rows("ns/a", 3, range(50, 60))])    # 3: row groups of 32 rows, two streams in some
    write_deltalake(path, mixed, mode="append", writer_properties=WriterProperties(max_row_group_size=32))
    return path


def through_delta_rs(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(tiered, "segment_dataset", lambda *a: None)
        m.setattr(tiered, "logged_row_count", lambda *a: None)
        return fn(*args)


CASES = [("ns/a", 1, 0, None), ("ns/a", 1, 10, 19), ("ns/b", 1, 5, 29), ("ns/a", 2, 24, None), ("ns/c", 1, 0, None),
         ("ns/a", 4, 0, None), ("ns/a", 3, 0, None), ("ns/a", 3, 30, 55), ("ns/b", 3, 2, 7), ("ns/b", 3, 0, None)]


@pytest.mark.parametrize("stream,segment,first,last", CASES)
def test_same_rows_as_through_delta_rs(table, monkeypatch, stream, segment, first, last):
    local = tiered.read_tiered_arrow(table, 3, stream, segment, first, last)
    assert tiered_local.segment_dataset(table, 3, segment) is not None
    assert local.equals(through_delta_rs(monkeypatch, tiered.read_tiered_arrow, table, 3, stream, segment, first, last))
    assert tiered.tiered_row_count(table, 3, stream, segment) == \
        through_delta_rs(monkeypatch, tiered.tiered_row_count, table, 3, stream, segment)


def test_a_segment_alone_in_its_files_is_counted_by_the_log(table):
    """The log's counts where a segment's files hold it alone; a scan where they hold another
    stream's rows too, or where a name is long enough for a writer to cut its statistics."""
    assert tiered_local.logged_row_count(table, 3, "ns/a", 1) == 40 * 3
    assert tiered_local.logged_row_count(table, 3, "ns/b", 1) == 30 * 3
    assert tiered_local.logged_row_count(table, 3, "ns/a", 2) == 25 * 3
    assert tiered_local.logged_row_count(table, 3, "ns/c", 1) == 0         # files of ns/a and ns/b alone
    assert tiered_local.logged_row_count(table, 3, "ns/a", 3) is None      # mixed with ns/b's rows
    assert tiered_local.logged_row_count(table, 3, "ns/a", 4) == 0         # no file may hold it
    long_name = "ns/" + "x" * 29
    path = table + "-long"
    write_deltalake(path, rows(long_name, 1, range(0, 4)))
    assert tiered_local.logged_row_count(path, 0, long_name, 1) is None
    assert tiered.tiered_row_count(path, 0, long_name, 1) == 12


def test_a_version_reads_only_its_snapshot(table):
    assert tiered.read_tiered_arrow(table, 1, "ns/a", 2).num_rows == 0   # segment 2 came with version 2
    assert tiered.read_tiered_arrow(table, 2, "ns/a", 2).num_rows == 25 * 3


def test_files_are_pruned_by_the_logs_statistics(table):
    dt = DeltaTable(table, version=3)
    assert len(dt.file_uris()) == 4
    files = tiered_local.local_files(dt) or []
    assert len(tiered_local.segment_files(files, 2)) == 1
    assert len(tiered_local.segment_files(files, 1)) == 2   # ns/a's and ns/b's segment 1
    assert tiered_local.segment_files(files, 4) == []


def test_a_table_written_again_at_its_path_is_read_again(table):
    before = tiered.read_tiered_arrow(table, 0, "ns/a", 1)
    shutil.rmtree(table)
    write_deltalake(table, rows("ns/a", 1, range(0, 40), tag=b"new:"))
    after = tiered.read_tiered_arrow(table, 0, "ns/a", 1)
    assert after.num_rows == before.num_rows
    assert after.column("payload")[0].as_py().startswith(b"new:")


def test_only_local_tables_are_read_by_pyarrow():
    assert tiered_local.local_root("s3://bucket/t") is None
    assert tiered_local.segment_dataset("s3://bucket/t", 0, 1) is None
    assert tiered_local.local_root("file:///data/t%20x/") == "/data/t x"


def _sealed(entries: int, records: int, payload_bytes: int) -> SegmentMeta:
    return SegmentMeta(1, None, SegmentState.TIERED, 0, last_txid=records - 1, last_entry_id=entries - 1,
                       record_count=records, bytes=payload_bytes)


def test_a_readers_step_follows_the_segments_counts():
    """Steps of about two row groups of small records, few entries of large ones, a default when
    the metadata has no counts."""
    assert tiered.step_entries(_sealed(5_200, 1_000_000, 112_083_200)) == 681      # 100-byte records
    assert tiered.step_entries(_sealed(100, 100, 100 << 20)) == 16                 # 1 MiB records
    assert tiered.step_entries(_sealed(3, 3, 3 << 30)) == 1                        # 1 GiB records
    assert tiered.step_entries(_sealed(0, 0, 0)) == tiered.STEP_ENTRIES_UNKNOWN
