"""The Spark sink's two phases without Spark (jobs/stream_sink.py, ledger_client/stream/sink.py):
task ledgers written, linked once by the driver's commit, aborted, orphaned and collected, against
real ZooKeeper and bookie processes. tests/spark/test_stream_sink.py runs the same through Spark."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from client_helpers import client
from stream_helpers import WriterProcess, payload, read_all

from jobs.options import SinkOptions
from jobs.stream_sink import SinkMessage, abort_batch, commit_batch
from ledger_client import errors
from ledger_client.stream.sink import TAG_STREAM, TaskLedgerWriter, collect_orphans
from metadata.streams.linking import SparkBatch

pytestmark = pytest.mark.integration


def opts(sb, **kw) -> SinkOptions:
    return SinkOptions(sb.connect_string, "ns", "s", has_txid=kw.pop("has_txid", False), payload_is_string=False,
                       **kw)


def task_write(ns, batch: SparkBatch, partition: int, payloads: list[bytes],
               txids: list[int] | None = None) -> SinkMessage:
    w = TaskLedgerWriter(ns, "s", batch, partition, relative_txids=txids is None)
    w.add_many(payloads, txids)
    return SinkMessage(w.finish(), batch)


def tagged_ledgers(c) -> set[int]:
    return {lid for lid in c.list_ledgers() if TAG_STREAM in c.ledger_metadata(lid).custom_metadata}


def test_commit_links_once_and_a_replay_adds_nothing(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                output_buffer_bytes=200)
        with ns.open_writer("s") as w:   # a Python writer first: the batch's txids follow its last
            w.write(b"py-0", txid=41)
        b = SparkBatch.query("query-1", 0)
        msgs = [task_write(ns, b, p, [b"p%d-%03d" % (p, i) for i in range(40)]) for p in (1, 0)]
        assert commit_batch(opts(sb), b, msgs, sweep=False)
        assert not commit_batch(opts(sb), b, msgs, sweep=False)        # the same commit again
        again = [task_write(ns, b, 0, [b"dup"])]                        # the batch re-run after a restart
        assert not commit_batch(opts(sb), b, again, sweep=False)
        recs = read_all(ns, "s", 81)
        assert [r.payload for r in recs] == [b"py-0"] + [b"p%d-%03d" % (p, i) for p in (0, 1) for i in range(40)]
        assert [r.txid for r in recs] == list(range(41, 122))           # assigned in commit order
        assert [r.dlsn for r in recs] == sorted(r.dlsn for r in recs)
        info = ns.stream_info("s")
        assert [s.state for s in info.segments] == ["sealed"] * 3 and info.last_txid == 121
        assert tagged_ledgers(c) == {s.ledger_id for s in info.segments[1:]}   # the re-run's ledger is gone


def test_txid_column_kept_and_checked(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        b1 = SparkBatch.write("0000000000001-a")
        m = [task_write(ns, b1, 0, [b"a", b"b"], [100, 100]), task_write(ns, b1, 1, [b"c"], [250])]
        assert commit_batch(opts(sb, has_txid=True), b1, m, sweep=True)
        assert [r.txid for r in read_all(ns, "s", 3)] == [100, 100, 250]
        b2 = SparkBatch.write("0000000000002-b")
        low = [task_write(ns, b2, 0, [b"x"], [249])]
        with pytest.raises(errors.TransactionIdOutOfOrderError):
            commit_batch(opts(sb, has_txid=True), b2, low, sweep=False)
        abort_batch(opts(sb), low)
        w = TaskLedgerWriter(ns, "s", b2, 0, relative_txids=False)
        w.add(b"1", 5)
        with pytest.raises(errors.TransactionIdOutOfOrderError):
            w.add(b"2", 4)
        with pytest.raises(errors.IncorrectParameterError):
            w.add(b"3", None)
        w.discard()
        assert tagged_ledgers(c) == {s.ledger_id for s in ns.stream_info("s").segments}


def test_abort_and_orphans_of_a_dead_driver_are_deleted(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        b = SparkBatch.write("0000000000003-c")
        aborted = [task_write(ns, b, p, [b"x"] * 5) for p in range(2)]
        abort_batch(opts(sb), aborted + [None])
        assert tagged_ledgers(c) == set() and not ns.stream_exists("s")
        dead = [task_write(ns, SparkBatch.query("q-dead", 7), p, [b"y"]) for p in range(2)]  # never committed
        assert {m.task.ledger_id for m in dead} == tagged_ledgers(c)
        assert collect_orphans(c, ns, "s", older_than_ms=3_600_000) == []   # young: maybe a running job's
        listed = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", sb.connect_string,
                                 "gc", "ns/s", "--older-than-ms", "0", "--dry-run"],
                                capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert sorted(map(int, listed.stdout.split())) == sorted(m.task.ledger_id for m in dead)
        assert len(tagged_ledgers(c)) == 2
        b2 = SparkBatch.write("0000000000004-d")
        kept = task_write(ns, b2, 0, [b"z"])
        assert commit_batch(opts(sb, orphan_grace_ms=0), b2, [kept], sweep=True)   # a later commit collects
        assert tagged_ledgers(c) == {kept.task.ledger_id}
        gone = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", sb.connect_string,
                               "gc", "ns/s", "--older-than-ms", "0"], capture_output=True, text=True, timeout=120)
        assert gone.returncode == 0 and gone.stdout.strip() == "", gone.stderr


def test_a_live_python_writer_makes_the_commit_wait_then_fail(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        b = SparkBatch.query("q", 0)
        msgs = [task_write(ns, b, 0, [b"spark"])]
        w = ns.open_writer("s")
        w.write(b"python")
        with pytest.raises(errors.StreamLockedError, match="held"):
            commit_batch(opts(sb, lock_timeout_ms=300), b, msgs, sweep=False)
        released = threading.Timer(0.5, w.close)   # the writer lets go while the next commit waits
        released.start()
        assert commit_batch(opts(sb, lock_timeout_ms=30_000), b, msgs, sweep=False)
        released.join()
        with ns.open_writer("s") as after:     # a Python writer goes on after Spark's segments
            after.write(b"python again")
        recs = read_all(ns, "s", 3)
        assert [(r.payload, r.txid) for r in recs] == [(b"python", 0), (b"spark", 1), (b"python again", 2)]


def test_a_dead_writers_segment_is_sealed_first_and_a_stale_attempt_is_collected(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        p = WriterProcess(sb.connect_string, "ns", "s", 100_000)
        deadline = time.monotonic() + 60
        while len(p.acked) < 200 and time.monotonic() < deadline and p.proc.poll() is None:
            time.sleep(0.01)
        p.kill()                                     # SIGKILL: its segment stays in progress, its lock a while
        acked = dict(p.acked)
        assert len(acked) >= 200, p.lines[-5:]
        b = SparkBatch.write("0000000000005-e")
        stale = task_write(ns, b, 0, [b"stale attempt"])   # an attempt Spark gave up on: not in the messages
        msgs = [task_write(ns, b, 0, [b"spark-%d" % i for i in range(30)])]
        assert commit_batch(opts(sb, lock_timeout_ms=30_000), b, msgs, sweep=True)
        recs = read_all(ns, "s", len(acked) + 30)
        by_txid = {r.txid: r for r in recs}
        for i, dlsn in acked.items():                # every acknowledged record, then the batch after them
            assert by_txid[i].payload == payload(i) and str(by_txid[i].dlsn) == dlsn
        assert [r.payload for r in recs[-30:]] == [b"spark-%d" % i for i in range(30)]
        txids = [r.txid for r in recs]
        assert txids == sorted(txids) and txids[-30:] == list(range(txids[-31] + 1, txids[-31] + 31))
        assert all(s.state == "sealed" for s in ns.stream_info("s").segments)
        assert stale.task.ledger_id not in tagged_ledgers(c) == {msgs[0].task.ledger_id}


def test_arrow_columns_write_the_same_entries_as_records_one_by_one(cluster_factory, seed):
    """TaskLedgerWriter.add_arrow (the Spark sink's path: record sets cut from the column's
    buffers) writes byte for byte the entries add_many writes: sliced and string columns, both
    kinds of txids; bad columns are refused before anything is written."""
    import random

    import numpy as np
    import pyarrow as pa

    rng = random.Random(seed)
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, output_buffer_bytes=300)
        payloads = [rng.randbytes(rng.randrange(0, 120)) for _ in range(500)]
        txids = sorted(rng.randrange(0, 10_000) for _ in range(500))
        b = SparkBatch.write("0000000000009-z")

        def entries(lid: int) -> list[bytes]:
            h = c.open_ledger(lid, ns.settings.ledger_password)
            return [e.data for e in h.read(0, h.last_add_confirmed)]

        for tx in (None, txids):
            one = TaskLedgerWriter(ns, "s", b, 0, relative_txids=tx is None)
            one.add_many(payloads, tx)
            col = pa.array([b"skip"] + payloads, pa.binary()).slice(1)      # an offset into its buffers
            cols = TaskLedgerWriter(ns, "s", b, 1, relative_txids=tx is None)
            cols.add_arrow(col, None if tx is None else np.asarray(tx, np.int64))
            a, z = one.finish(), cols.finish()
            assert entries(a.ledger_id) == entries(z.ledger_id) and len(entries(a.ledger_id)) > 50
            assert (a.record_count, a.last_slot, a.nbytes, a.first_txid, a.last_txid) == \
                   (z.record_count, z.last_slot, z.nbytes, z.first_txid, z.last_txid)
        text = TaskLedgerWriter(ns, "s", b, 2, relative_txids=True)
        text.add_arrow(pa.array(["ä", "bc"], pa.string()))
        assert [e[-4:] for e in entries(text.finish().ledger_id)] == ["äbc".encode()]
        bad = TaskLedgerWriter(ns, "s", b, 3, relative_txids=False)
        with pytest.raises(errors.TransactionIdOutOfOrderError):
            bad.add_arrow(pa.array([b"x", b"y"]), np.asarray([5, 4]))
        with pytest.raises(errors.IncorrectParameterError):
            bad.add_arrow(pa.array([b"x", None]), np.asarray([5, 6]))
        with pytest.raises(errors.RecordTooLargeError):
            bad.add_arrow(pa.array([b"x" * (ns.settings.record_size_bytes_max + 1)]), np.asarray([7]))
        assert bad.ledger_id is None


def test_a_second_replicator_adds_no_copy_twice_and_its_redundant_ledgers_go(cluster_factory):
    """The per-row sink with source positions (jobs/stream_fanout.py): a batch of another query
    copying records the replica holds links only the new copies, and deletes the ledger of the
    old ones at once; a copy that overlaps the replica in part is refused."""
    from jobs.options import FanoutOptions
    from jobs.stream_fanout import FanoutMessage
    from jobs.stream_fanout import commit_batch as fanout_commit

    sb = cluster_factory(1)
    opts = FanoutOptions(sb.connect_string, has_txid=False, payload_is_string=False, copies_positions=True)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)

        def copy(batch: SparkBatch, partition: int, entry: int, n: int):
            w = TaskLedgerWriter(ns, "r", batch, partition, relative_txids=True)
            w.copying((1, entry, 0), (1, entry, n - 1))
            w.add_many([b"e%d-%d" % (entry, i) for i in range(n)])
            return ("ns/r", w.finish())

        q1, q2 = SparkBatch.query("one", 0), SparkBatch.query("two", 0)
        assert fanout_commit(opts, q1, [FanoutMessage((copy(q1, 0, 0, 10),), q1)], sweep=False) == 1
        held, new = copy(q2, 0, 0, 10), copy(q2, 1, 1, 5)
        fanout_commit(opts, q2, [FanoutMessage((held,), q2), FanoutMessage((new,), q2)], sweep=False)
        assert [r.payload for r in read_all(ns, "r", 15)] == [b"e0-%d" % i for i in range(10)] + \
               [b"e1-%d" % i for i in range(5)]
        with pytest.raises(errors.NoSuchLedgerError):
            c.ledger_metadata(held[1].ledger_id)            # the redundant copy's ledger is gone
        assert [s.source for s in ns.view("r").ordered()] == [((1, 0, 0), (1, 0, 9)), ((1, 1, 0), (1, 1, 4))]
        q3 = SparkBatch.query("three", 0)
        part = copy(q3, 0, 1, 8)                             # (1,1,0)..(1,1,7): the replica holds up to (1,1,4)
        with pytest.raises(errors.IncorrectParameterError, match="twice"):
            fanout_commit(opts, q3, [FanoutMessage((part,), q3)], sweep=False)
