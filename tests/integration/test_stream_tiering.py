"""Tiering stream segments into Delta against real ZooKeeper and bookie processes (DESIGN §4.6,
invariant 8): run twice, and interrupted after each step (an exception, or the process killed),
every record ends up exactly once, readable through the Python reader with its DLSN and txid."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from bookie_helpers import module_cluster
from client_helpers import client
from stream_helpers import read_all

from jobs.stream_tiering import STEPS, TieringConfig, tier_streams
from ledger_client import errors

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the interrupted-tiering tests, each in a namespace of its own "
                       "(no test stops a bookie).")


class Crash(Exception):
    pass


def fill(ns, stream: str, n: int, start: int = 0, keep_open: bool = True):
    """n records (txid = i) in several segments; with keep_open, the last segment stays in progress."""
    w = ns.open_writer(stream)
    futs = [w.write_async(b"%s-%06d" % (stream.encode(), i) * 3, txid=i) for i in range(start, start + n)]
    dlsns = [f.result(30) for f in futs]
    if keep_open:
        w.write(b"%s-%06d" % (stream.encode(), start + n) * 3, txid=start + n)   # the segment in progress
        return w, dlsns
    w.close()
    return None, dlsns


def expected(stream: str, n: int) -> list[tuple[int, bytes]]:
    return [(i, b"%s-%06d" % (stream.encode(), i) * 3) for i in range(n)]


def check_exactly_once(c, ns, stream: str, n: int, table: str) -> None:
    """The reader returns records 0..n exactly once in DLSN order; the table holds every tiered
    segment's records once; tiered segments name no ledger and their ledgers are gone."""
    from deltalake import DeltaTable

    recs = read_all(ns, stream, n + 1)
    assert [(r.txid, r.payload) for r in recs] == expected(stream, n + 1)
    assert [r.dlsn for r in recs] == sorted({r.dlsn for r in recs})
    info = ns.stream_info(stream)
    tiered = [s for s in info.segments if s.state == "tiered"]
    assert tiered and info.segments[-1].state == "in_progress"
    rows = DeltaTable(table).to_pyarrow_table(filters=[("stream", "=", f"{ns.name}/{stream}")])
    keys = list(zip(*(rows.column(k).to_pylist() for k in ("segment", "entry_id", "slot")), strict=True))
    assert len(keys) == len(set(keys)) == sum(s.record_count for s in tiered)
    assert {k[0] for k in keys} == {s.sequence for s in tiered}
    for s in tiered:
        assert s.ledger_id is None and s.table == table and s.delta_version is not None
    return None


def test_tier_twice_adds_nothing_and_readers_see_every_record(cluster_factory, tmp_path):
    sb = cluster_factory(3)
    table = str(tmp_path / "streams_delta")
    with client(sb) as c:
        ns = c.create_namespace("pay", segment_rolling_bytes=3_000, output_buffer_bytes=400)
        w, dlsns = fill(ns, "orders", 600)
        w2, _ = fill(ns, "refunds", 200, keep_open=True)
        sealed = {s.sequence: s.ledger_id for s in ns.stream_info("orders").segments if s.state == "sealed"}
        assert len(sealed) >= 3
        first = tier_streams(TieringConfig(sb.connect_string, table, "pay/*"))
        assert first.marked["pay/orders"] == sorted(sealed) and "pay/refunds" in first.marked
        assert set(sealed.values()) <= set(first.deleted_ledgers)
        for lid in sealed.values():
            with pytest.raises(errors.NoSuchLedgerError):
                c.ledger_metadata(lid)
        check_exactly_once(c, ns, "orders", 600, table)
        check_exactly_once(c, ns, "refunds", 200, table)
        again = tier_streams(TieringConfig(sb.connect_string, table, "pay/orders"))
        assert (again.written, again.rows, again.marked, again.table_version) == ((), 0, {}, first.table_version)
        check_exactly_once(c, ns, "orders", 600, table)
        # the writer goes on; the next run tiers only what sealed since, the reader still sees all
        more = [w.write_async(b"orders-%06d" % i * 3, txid=i) for i in range(601, 900)]
        [f.result(30) for f in more]
        third = tier_streams(TieringConfig(sb.connect_string, table, "pay/orders"))
        assert third.written and not set(third.marked["pay/orders"]) & set(sealed)
        check_exactly_once(c, ns, "orders", 899, table)
        w.close()
        w2.close()
        with pytest.raises(Exception, match="does not exist"):
            tier_streams(TieringConfig(sb.connect_string, table, "pay/nope"))


@pytest.mark.parametrize("step", STEPS)
def test_tiering_interrupted_after_each_step_then_rerun(sb, tmp_path, step):
    table = str(tmp_path / "t")
    stream = f"crash-{step}/s"   # a namespace of its own on the module's cluster
    with client(sb) as c:
        ns = c.create_namespace(stream.split("/")[0], segment_rolling_bytes=2_000, output_buffer_bytes=300)
        w, _ = fill(ns, "s", 300)

        def crash(name: str) -> None:
            if name == step:
                raise Crash(name)

        with pytest.raises(Crash):
            tier_streams(TieringConfig(sb.connect_string, table, stream), hook=crash)
        assert len(read_all(ns, "s", 301)) == 301       # readable between the steps too
        rerun = tier_streams(TieringConfig(sb.connect_string, table, stream))
        if step == "written":
            assert rerun.written    # files of the crashed run were never committed: written again
        else:
            assert not rerun.written and rerun.rows == 0
        check_exactly_once(c, ns, "s", 300, table)
        w.close()


KILLER = textwrap.dedent("""
    import os, sys
    from jobs.stream_tiering import TieringConfig, tier_streams
    zk, table, stream, step = sys.argv[1:5]
    def die(name):
        if name == step:
            os.kill(os.getpid(), 9)
    tier_streams(TieringConfig(zk, table, stream), hook=die)
    sys.exit(3)
""")


@pytest.mark.parametrize("step", ["committed", "marked", "deleted"])
def test_tiering_process_killed_after_a_step_then_rerun(sb, tmp_path, step):
    table = str(tmp_path / "t")
    stream = f"killed-{step}/s"   # a namespace of its own on the module's cluster
    with client(sb) as c:
        ns = c.create_namespace(stream.split("/")[0], segment_rolling_bytes=2_000, output_buffer_bytes=300)
        w, _ = fill(ns, "s", 250)
        proc = subprocess.run([sys.executable, "-c", KILLER, sb.connect_string, table, stream, step],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == -9, proc.stderr[-2000:]
        tier_streams(TieringConfig(sb.connect_string, table, stream))
        check_exactly_once(c, ns, "s", 250, table)
        w.close()


def test_compact_to_delta_command_tiers_a_namespace_and_refuses_bad_input(cluster_factory, tmp_path, capsys):
    import json

    from jobs.compact_to_delta import main

    sb = cluster_factory(3)
    table = str(tmp_path / "t")
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=2_000, output_buffer_bytes=300)
        w, _ = fill(ns, "a", 120)
        _w, _ = fill(ns, "b", 80, keep_open=False)
        argv = ["--zk", sb.connect_string, "--table", table, "--engine", "local"]
        assert main([*argv, "--stream", "ns/*", "--tier"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert set(summary["marked_tiered"]) == {"ns/a", "ns/b"} and summary["rows"] >= 120
        assert [s.state for s in ns.stream_info("b").segments] == ["tiered"] * len(ns.stream_info("b").segments)
        check_exactly_once(c, ns, "a", 120, table)
        assert [(r.txid, r.payload) for r in read_all(ns, "b", 80)] == expected("b", 80)
        assert main([*argv, "--stream", "ns/*", "--tier"]) == 0
        assert json.loads(capsys.readouterr().out)["segments_written"] == 0
        for bad in (["--stream", "ns/zzz"], ["--stream", "no-slash"], ["--tier"],
                    ["--stream", "ns/a", "--ledgers", "1"]):
            assert main([*argv, *bad]) == 2
        w.close()


def test_reads_planned_or_started_before_tiering_finish_from_delta(cluster_factory, tmp_path):
    """A Spark partition planned while a segment was sealed (its ledger deleted by the time it
    runs) and a Python reader that is halfway through the stream both return every record once."""
    import pyarrow as pa

    from jobs.stream_planning import StreamPushdown, plan_stream_spans, stream_end
    from jobs.stream_source import gather, read_span, start_of

    sb = cluster_factory(3)
    table = str(tmp_path / "t")
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=2_000, output_buffer_bytes=300)
        w, _ = fill(ns, "s", 400)
        w.flush()
        view, xs = gather(c, [("ns", "s")])["ns/s"]
        plans = plan_stream_spans(xs, {"ns/s": (start_of(view), stream_end(xs, view.meta.next_sequence))},
                                  StreamPushdown(), 7)
        reader = ns.open_reader("s")
        head = reader.read_batch(50, 5_000)
        tier_streams(TieringConfig(sb.connect_string, table, "ns/s"))
        planned = {span.ledger_id for p in plans for span in p if span.sequence < xs[-1].sequence}
        assert planned and None not in planned
        for lid in planned:   # the sealed segments' ledgers the plan names are gone
            with pytest.raises(errors.NoSuchLedgerError):
                c.ledger_metadata(lid)
        rows = pa.concat_tables([t for p in plans for span in p for t in read_span(c, span)])
        assert list(zip(rows.column("txid").to_pylist(), rows.column("payload").to_pylist(), strict=True)) == \
            expected("s", 401)[:rows.num_rows] and rows.num_rows >= 400
        rest = []
        while len(head) + len(rest) < 401:
            got = reader.read_batch(1_000, 5_000)
            assert got, "the reader stalled"
            rest += got
        reader.close()
        assert [(r.txid, r.payload) for r in head + rest] == expected("s", 401)
        w.close()


def test_stream_maintenance_tiers_what_is_older_than_tier_after_ms(cluster_factory, tmp_path):
    """The auditor's stream maintenance with jobs.stream_tiering.tier_step: a namespace with
    tier_after_ms and tier_table gets its old sealed segments tiered into <tier_table>/<stream>."""
    from jobs.stream_tiering import tier_step
    from recovery import StreamMaintenance

    sb = cluster_factory(3)
    tiers = tmp_path / "tiers"
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=2_000, output_buffer_bytes=300,
                                tier_after_ms=3_600_000, tier_table=str(tiers))
        w, _ = fill(ns, "s", 200)
        sealed = [s for s in ns.stream_info("s").segments if s.state == "sealed"]
        m = StreamMaintenance(c, 0, tier=tier_step)
        assert m.run_once().segments_tiered == 0 and not tiers.exists()   # nothing is an hour old
        ns.update_settings(tier_after_ms=0)
        stats = m.run_once()
        assert stats.segments_tiered == len(sealed) > 0 and stats.errors == 0
        check_exactly_once(c, ns, "s", 200, str(tiers / "s"))
        assert m.run_once().segments_tiered == len(sealed)    # cumulative: the third pass tiered nothing
        w.close()


def test_python_reader_reads_big_tiered_segments_in_chunks_from_any_position(cluster_factory, tmp_path):
    """Segments of many entries are read from Delta a chunk at a time, from the start or from a
    DLSN in the middle, with the same DLSNs and txids the writer got."""
    from ledger_client import DLSN

    sb = cluster_factory(3)
    table = str(tmp_path / "t")
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=120_000, output_buffer_bytes=200)
        _w, dlsns = fill(ns, "big", 3_000, keep_open=False)
        segs = ns.stream_info("big").segments
        assert max(s.last_dlsn.entry_id for s in segs) > 600 and len(segs) >= 2
        tier_streams(TieringConfig(sb.connect_string, table, "ns/big"))
        assert {s.state for s in ns.stream_info("big").segments} == {"tiered"}
        recs = read_all(ns, "big", 3_000)
        assert [(r.txid, r.payload) for r in recs] == expected("big", 3_000) and [r.dlsn for r in recs] == dlsns
        mid = dlsns[1_777]
        assert mid.entry_id > 256
        part = read_all(ns, "big", 3_000 - 1_777, start=DLSN(*mid))
        assert [r.dlsn for r in part] == dlsns[1_777:]

        # Entries of many records: Arrow and records alike, from inside an entry, past a txid floor.
        packed = c.create_namespace("packed", segment_rolling_bytes=120_000)
        _w, pdlsns = fill(packed, "p", 3_000, keep_open=False)
        tier_streams(TieringConfig(sb.connect_string, str(tmp_path / "p"), "packed/p"))
        assert {s.state for s in packed.stream_info("p").segments} == {"tiered"}
        inside = next(i for i, d in enumerate(pdlsns) if d.slot >= 3 and i > 1_000)
        for kw, first in (({}, 0), ({"start": DLSN(*pdlsns[inside])}, inside), ({"start_txid": 2_222}, 2_222)):
            recs = read_all(packed, "p", 3_000 - first, **kw)
            assert [r.dlsn for r in recs] == pdlsns[first:] and [r.txid for r in recs] == list(range(first, 3_000))
            with packed.open_reader("p", **kw) as r:
                rows: list = []
                while sum(b.num_rows for b in rows) < 3_000 - first:
                    got = r.read_arrow_batch(1_000, 2_000)
                    assert got is not None
                    rows.append(got)
            cols = [[v for b in rows for v in b.column(i).to_pylist()] for i in range(5)]
            assert list(zip(*cols[:3], strict=True)) == [tuple(d) for d in pdlsns[first:]]
            assert cols[3] == list(range(first, 3_000)) and cols[4] == [p for _t, p in expected("p", 3_000)[first:]]

        # Readers read at the recorded Delta version: a later delete in the table changes nothing;
        # once vacuum removes that version's files, reading fails loudly instead of skipping rows.
        from deltalake import DeltaTable

        DeltaTable(table).delete("segment = 1 AND entry_id = 5")
        assert [r.dlsn for r in read_all(ns, "big", 3_000)] == dlsns
        DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        with pytest.raises(errors.ReadError):
            read_all(ns, "big", 3_000, timeout_s=20)
