"""Streams and namespaces against real ZooKeeper and bookie processes (DESIGN §4.5, invariants 8, 9)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from bookie_helpers import module_cluster
from client_helpers import client
from stream_helpers import WriterProcess, payload, read_all

from ledger_client import DLSN, errors
from metadata.zk.testing import expire_session

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the tests that stop nothing, each in a namespace of its own; a test "
                       "that kills a process, stops ZooKeeper or lists every namespace starts its own.")


def test_write_read_info_and_positions(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c:
        ns = c.create_namespace("payments", segment_rolling_bytes=4_000, output_buffer_bytes=500)
        assert c.list_namespaces() == ["payments"] and c.namespace("payments").settings.segment_rolling_bytes == 4_000
        with ns.open_writer("orders") as w:   # a missing stream is created
            first = w.write(b"first", txid=100)
            assert first == DLSN(1, 0, 0) and str(first) == "1/0/0" and DLSN.parse("1/0/0") == first
            futs = [w.write_async(payload(i)) for i in range(1, 1000)]
            dlsns = [f.result(30) for f in futs]
        assert dlsns == sorted(dlsns) and len(set(dlsns)) == 999 and dlsns[-1].segment >= 3
        assert ns.list_streams() == ["orders"] and ns.stream_exists("orders") and not ns.stream_exists("other")
        info = ns.stream_info("orders")
        assert info.last_txid == 1099 and sum(s.record_count for s in info.segments) == 1000
        assert all(s.state == "sealed" for s in info.segments) and info.last_dlsn == dlsns[-1]
        assert [s.first_txid for s in info.segments][0] == 100
        recs = read_all(ns, "orders", 1000)
        assert [r.payload for r in recs] == [b"first"] + [payload(i) for i in range(1, 1000)]
        assert [r.txid for r in recs] == list(range(100, 1100)) and [r.dlsn for r in recs] == [first] + dlsns
        mid = dlsns[500]
        assert [r.dlsn for r in read_all(ns, "orders", 498, start=mid)] == dlsns[500:]
        by_txid = read_all(ns, "orders", 400, start_txid=700)
        assert by_txid[0].txid == 700 and len(by_txid) == 400


def test_reader_across_many_segments_and_tailing_a_live_writer(sb, seed):
    rng = random.Random(seed)
    with client(sb) as c:
        ns = c.create_namespace("many-segments", segment_rolling_bytes=2_000, output_buffer_bytes=400)  # >= 10 segments
        w = ns.open_writer("s")
        tail = ns.open_reader("s")
        got: list = []
        stop = threading.Event()

        def follow() -> None:
            while not stop.is_set() or len(got) < 1500:
                got.extend(tail.read_batch(1000, 100))

        t = threading.Thread(target=follow)
        t.start()
        for i in range(1500):
            w.write_async(payload(i))
            if rng.random() < 0.02:
                w.flush()
        w.flush()
        stop.set()
        t.join(60)
        tail.close()
        assert [r.payload for r in got] == [payload(i) for i in range(1500)]
        segs = ns.stream_info("s").segments
        assert len(segs) >= 10
        recs = read_all(ns, "s", 1500)
        assert [r.payload for r in recs] == [payload(i) for i in range(1500)]
        k = rng.randrange(100, 400)   # from a middle DLSN and from a txid, each across >= 8 segments
        assert [r.dlsn for r in read_all(ns, "s", 1500 - k, start=recs[k].dlsn)] == [r.dlsn for r in recs[k:]]
        from_txid = read_all(ns, "s", 1500 - k, start_txid=recs[k].txid)
        assert [r.payload for r in from_txid] == [payload(i) for i in range(k, 1500)]
        assert len({r.dlsn.segment for r in from_txid}) >= 8
        w.close()


def test_tailing_reader_sees_an_idle_writers_last_record_promptly(sb):
    with client(sb) as c:
        ns = c.create_namespace("idle-writer")
        with ns.open_writer("s") as w, ns.open_reader("s", start="latest") as r:
            for i in range(20):
                sent = time.monotonic()
                d = w.write(payload(i))
                rec = r.read_next(timeout_ms=2_000)
                seen = time.monotonic()
                assert rec is not None and rec.dlsn == d and rec.payload == payload(i)
                # The writer is idle after each write: the reader sees it through the LAC it announces.
                # Without the announcement nothing would show it before the next write, which waits
                # for this read: read_next would time out (2 s). The bound leaves room for a busy CI
                # host (a neighbouring worker's Spark tests: 75 ms seen once at 50 ms); speed is
                # `bench stream`'s to measure.
                assert seen - sent < 0.5, f"record {i} seen after {seen - sent:.3f}s"
                time.sleep(0.1)
            # The segment holds the records' entries only: the announcements wrote none.
            assert w.write(payload(20)).entry_id == 20


def test_a_tailing_reader_that_stops_reading_catches_up_in_order_and_closes_at_once(sb):
    """The caller polls the tail (stream/tail.py): after a pause in which the writer wrote a few
    thousand entries, every record comes back once, in order; closing does not wait out a poll."""
    with client(sb) as c:
        ns = c.create_namespace("pausing", output_buffer_bytes=200)   # a few records per entry
        with ns.open_writer("s") as w:
            r = ns.open_reader("s", start="latest")
            w.write(payload(0))
            got = r.read_batch(10, 5_000)
            assert [x.payload for x in got] == [payload(0)]   # the caller holds the tail now
            for f in [w.write_async(payload(i)) for i in range(1, 3_001)]:
                f.result(30)
            deadline = time.monotonic() + 60
            while len(got) < 3_001 and time.monotonic() < deadline:
                got += r.read_batch(1_000, 1_000)
            assert [x.payload for x in got] == [payload(i) for i in range(3_001)]
            assert len({x.dlsn.entry_id for x in got}) > 100   # many entries (a poll takes at most 16)
            started = time.monotonic()
            r.close()
            assert time.monotonic() - started < 5
            with pytest.raises(errors.StreamClosedError):
                r.read_batch()


def test_flush_returns_with_every_future_settled_and_works_inside_a_callback(sb):
    with client(sb) as c:
        ns = c.create_namespace("flush-settles")
        with ns.open_writer("s") as w:
            for _ in range(3):
                seen: list[int] = []
                futs = [w.write_async(payload(i)) for i in range(200)]
                for i, f in enumerate(futs):
                    f.add_done_callback(lambda _f, i=i, seen=seen: (time.sleep(0.0005), seen.append(i)))
                w.flush()
                assert all(f.done() for f in futs) and seen == list(range(200))   # callbacks ran, in order
            # A callback that flushes (its record the last one): flush does not wait for itself.
            inner: list[bool] = []
            last = w.write_async(payload(0))
            last.add_done_callback(lambda _f: (w.flush(), inner.append(True)))
            w.flush()
            assert inner == [True]


def test_writer_killed_mid_stream_a_new_writer_recovers_and_goes_on(cluster_factory, tmp_path):
    sb = cluster_factory(3)
    with client(sb) as c:
        c.create_namespace("ns", segment_rolling_bytes=3_000)
        p = WriterProcess(sb.connect_string, "ns", "s", 100_000)
        deadline = time.monotonic() + 60
        while len(p.acked) < 800 and time.monotonic() < deadline and p.proc.poll() is None:
            time.sleep(0.01)
        p.kill()                                   # SIGKILL, mid-stream
        acked = dict(p.acked)
        assert len(acked) >= 800, p.lines[-5:]
        ns = c.namespace("ns")
        with ns.open_writer("s", lock_timeout_ms=20_000) as w:   # recovers the dead writer's segment
            start = w.last_txid + 1
            assert start > max(acked)
            for i in range(start, start + 100):
                w.write_async(payload(i), txid=i)
        recs = read_all(ns, "s", len(acked) + 100)
        txids = [r.txid for r in recs]
        assert txids == sorted(txids) and len(set(txids)) == len(txids)   # in order, each once
        by_txid = {r.txid: r for r in recs}
        for i, dlsn in acked.items():                  # every acknowledged record, byte for byte
            assert by_txid[i].payload == payload(i) and str(by_txid[i].dlsn) == dlsn
        assert txids[-100:] == list(range(start, start + 100))


def test_two_writers_racing_only_the_lock_holder_gets_acks(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as ca, client(sb) as cb:
        ns_a = ca.create_namespace("ns")
        wa = ns_a.open_writer("s")
        acked_a = [wa.write(payload(i), txid=i) for i in range(10)]
        expire_session(ca.store, timeout_s=4)          # A's lock goes with its session ...
        wb = cb.namespace("ns").open_writer("s", lock_timeout_ms=20_000)   # ... B takes it, fences A's segment
        with pytest.raises((errors.LedgerFencedError, errors.StreamClosedError)):
            for i in range(10, 20):
                wa.write(payload(i), txid=i)           # A gets no more acks
        acked_b = [wb.write(payload(i), txid=i) for i in range(100, 110)]
        wb.close()
        recs = read_all(cb.namespace("ns"), "s", 20)
        assert [r.txid for r in recs] == list(range(10)) + list(range(100, 110))
        assert [r.dlsn for r in recs] == acked_a + acked_b
        wa.close()                                     # closing a writer that lost the stream is quiet
        assert [r.txid for r in read_all(cb.namespace("ns"), "s", 20)] == list(range(10)) + list(range(100, 110))


def test_second_live_writer_waits_then_is_refused(sb):
    with client(sb) as c1, client(sb) as c2:
        w1 = c1.create_namespace("two-writers").open_writer("s")
        w1.write(b"x")
        t0 = time.monotonic()
        with pytest.raises(errors.StreamLockedError):
            c2.namespace("two-writers").open_writer("s", lock_timeout_ms=1_000)
        assert 0.9 < time.monotonic() - t0 < 10
        w1.close()
        with c2.namespace("two-writers").open_writer("s", lock_timeout_ms=5_000) as w2:
            assert w2.write(b"y") == DLSN(2, 0, 0)


def test_truncation_and_retention(sb):
    with client(sb) as c:
        ns = c.create_namespace("truncation", segment_rolling_bytes=1_000)
        with ns.open_writer("s") as w:
            dlsns = [w.write_async(payload(i)).result(30) for i in range(300)]
            segs_before = ns.stream_info("s").segments
            cut = dlsns[150]
            w.truncate(cut)
        info = ns.stream_info("s")
        assert info.truncated_before == cut and info.first_dlsn == cut
        assert all(s.sequence >= cut.segment for s in info.segments) and len(info.segments) < len(segs_before)
        deleted = [s.ledger_id for s in segs_before if s.sequence < cut.segment]
        assert deleted and all(lid not in set(c.list_ledgers()) for lid in deleted)
        recs = read_all(ns, "s", 150)
        assert recs[0].dlsn == cut and [r.payload for r in recs] == [payload(i) for i in range(150, 300)]
        early = read_all(ns, "s", 150, start=DLSN.INITIAL)   # before the truncation point: starts at it
        assert early[0].dlsn == cut
        ns.update_settings(retention_bytes=600)
        assert ns.apply_retention("s") > 0
        kept = ns.stream_info("s")
        assert sum(s.bytes for s in kept.segments[:-1]) <= 600 + kept.segments[0].bytes
        assert read_all(ns, "s", 1)[0].dlsn >= kept.segments[0].first_dlsn


def test_end_of_stream(sb):
    with client(sb) as c:
        ns = c.create_namespace("end-of-stream")
        w = ns.open_writer("s")
        for i in range(5):
            w.write(payload(i))
        w.mark_end_of_stream()
        with pytest.raises((errors.EndOfStreamError, errors.StreamClosedError)):
            w.write(b"more")
        with pytest.raises(errors.EndOfStreamError):
            ns.open_writer("s").write(b"more")
        with ns.open_reader("s") as r:
            assert [x.payload for x in r] == [payload(i) for i in range(5)]   # iteration ends at the end
            with pytest.raises(errors.EndOfStreamError):
                r.read_next(100)
        assert ns.stream_info("s").end_of_stream


def test_bad_input_gets_typed_errors_and_loses_nothing(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c:
        for bad in ("a/b", "", "..", "sp ace"):
            with pytest.raises(errors.InvalidStreamNameError):
                c.create_namespace(bad)
        with pytest.raises(errors.NoSuchNamespaceError):
            c.namespace("nope")
        with pytest.raises(errors.IncorrectParameterError):
            c.create_namespace("x", ensemble_size=2, write_quorum_size=3)
        with pytest.raises(errors.IncorrectParameterError):
            c.create_namespace("x", no_such_setting=1)
        ns = c.create_namespace("ns", record_size_bytes_max=1_000)
        with pytest.raises(errors.NamespaceExistsError):
            c.create_namespace("ns")
        with pytest.raises(errors.NoSuchStreamError):
            ns.stream_info("nope")
        with pytest.raises(errors.NoSuchStreamError):
            ns.open_reader("nope")
        w = ns.open_writer("s")
        ok = w.write(b"ok", txid=10)
        with pytest.raises(errors.RecordTooLargeError):
            w.write(b"x" * 1001)
        with pytest.raises(errors.TransactionIdOutOfOrderError):
            w.write(b"late", txid=9)
        with pytest.raises(errors.IncorrectParameterError):
            w.write("not bytes")  # type: ignore[arg-type]
        assert w.write(b"same txid", txid=10) > ok    # non-decreasing: equal is fine
        with pytest.raises(errors.IncorrectParameterError):
            DLSN.parse("1/2")
        with pytest.raises(errors.NamespaceNotEmptyError):
            c.delete_namespace("ns")
        w.close()
        with pytest.raises(errors.StreamClosedError):
            w.write(b"after close")
        with ns.open_reader("s", start=DLSN(50, 0, 0)) as r:       # past the end: waits
            assert r.read_next(300) is None
        assert [x.payload for x in read_all(ns, "s", 2)] == [b"ok", b"same txid"]
        c.delete_namespace("ns", force=True)
        assert c.list_namespaces() == []


def test_zookeeper_down_is_a_clear_error_within_the_timeout(cluster_factory, tmp_path):
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk")
    zk.start()
    try:
        from ledger_client import ClientConfig, LedgerClient
        from metadata import connect

        with connect(zk.connect_string) as store:
            store.cluster.init_cluster()
        c = LedgerClient(zk.connect_string, config=ClientConfig(zk_session_timeout_ms=4_000,
                                                                 operation_timeout_ms=10_000))
        ns = c.create_namespace("ns")
        zk.stop()
        t0 = time.monotonic()
        with pytest.raises(errors.MetadataServiceError):
            ns.stream_info("s")
        with pytest.raises(errors.MetadataServiceError):
            c.list_namespaces()
        assert time.monotonic() - t0 < 20
        c.close()
    finally:
        zk.stop()


def test_async_surface(cluster_factory):
    import asyncio

    from ledger_client import AsyncLedgerClient

    sb = cluster_factory(3)

    async def main() -> list:
        async with AsyncLedgerClient(sb.connect_string) as ac:
            ns = await ac.create_namespace("aio", segment_rolling_bytes=500, output_buffer_bytes=100)
            assert await ac.list_namespaces() == ["aio"]
            async with await ns.open_writer("s") as w:
                first = await w.write(b"one")
                rest = await asyncio.gather(*[w.write_async(payload(i)) for i in range(50)])
                assert first == DLSN(1, 0, 0) and rest == sorted(rest)
                await w.mark_end_of_stream()
            assert (await ns.stream_info("s")).end_of_stream
            async with await ns.open_reader("s") as r:
                head = (await r.read_arrow_batch(10, 5_000)).column("payload").to_pylist()
                return head + [rec.payload async for rec in r]

    assert asyncio.run(main()) == [b"one"] + [payload(i) for i in range(50)]


def test_autorecovery_process_applies_retention_to_an_idle_stream(cluster_factory, tmp_path):
    from autorecovery_helpers import AutoRecoveryProcess, write_autorecovery_conf
    from bookie_helpers import wait_until

    sb = cluster_factory(3)
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=300, output_buffer_bytes=100)
        with ns.open_writer("idle") as w:
            for i in range(200):
                w.write(payload(i))
        before = ns.stream_info("idle").segments
        assert len(before) >= 5
        ns.update_settings(retention_bytes=400)          # nothing writes any more: only the auditor trims
        conf = write_autorecovery_conf(tmp_path / "ar.toml", stream_maintenance_interval_ms=300)
        ar = AutoRecoveryProcess(sb.connect_string, conf, "ar-1", tmp_path / "ar.log")
        try:
            ar.wait_ready()
            wait_until(lambda: len(ns.stream_info("idle").segments) < len(before), 30, what="retention")
        finally:
            ar.stop()
        kept = ns.stream_info("idle")
        assert kept.truncated_before is not None and kept.segments[-1].sequence == before[-1].sequence
        recs = read_all(ns, "idle", 1)
        assert recs and recs[-1].payload == payload(199) and recs[0].dlsn >= kept.truncated_before


def test_autorecovery_process_tiers_old_sealed_segments_by_itself(cluster_factory, tmp_path):
    """A namespace with tier_after_ms + tier_table: the `spark-bookie autorecovery` process's auditor
    moves sealed segments into Delta; the reader still returns every record with its DLSN."""
    from autorecovery_helpers import AutoRecoveryProcess, write_autorecovery_conf
    from bookie_helpers import wait_until

    sb = cluster_factory(3)
    with client(sb) as c:
        ns = c.create_namespace("ns", segment_rolling_bytes=300, output_buffer_bytes=100)
        with ns.open_writer("old") as w:
            dlsns = [w.write(payload(i)) for i in range(100)]
        sealed = ns.stream_info("old").segments
        assert len(sealed) >= 3 and all(s.state == "sealed" for s in sealed)
        ns.update_settings(tier_after_ms=0, tier_table=str(tmp_path / "tiered"))
        conf = write_autorecovery_conf(tmp_path / "ar.toml", stream_maintenance_interval_ms=300)
        ar = AutoRecoveryProcess(sb.connect_string, conf, "ar-1", tmp_path / "ar.log")
        try:
            ar.wait_ready()
            wait_until(lambda: all(s.state == "tiered" for s in ns.stream_info("old").segments), 60,
                       what="tiering by the autorecovery process")
        finally:
            ar.stop()
        assert all(s.ledger_id is None for s in ns.stream_info("old").segments)   # their ledgers are gone
        recs = read_all(ns, "old", 100)
        assert [r.payload for r in recs] == [payload(i) for i in range(100)] and [r.dlsn for r in recs] == dlsns
