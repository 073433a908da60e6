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

from jobs.connect import close_shared
from jobs.options import SinkOptions
from jobs.stream_sink import SinkMessage, abort_batch, commit_batch
from ledger_client import errors
from ledger_client.stream.sink import (
    TAG_CTIME,
    TAG_STREAM,
    TAG_WRITE,
    TaskLedgerWriter,
    _read_nodes,
    collect_orphans,
)
from metadata.streams.linking import SparkBatch

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _no_clients_left():
    """The driver's steps run in this process and keep a client per cluster (jobs.connect.task_client):
    closed before the test's cluster stops, so no client outlives it in the tests that follow."""
    yield
    close_shared()


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
        assert c.store.streams.list_task_ledgers("ns", "s") == sorted(m.task.ledger_id for m in aborted)
        abort_batch(opts(sb), aborted + [None])
        assert tagged_ledgers(c) == set() and c.store.streams.list_task_ledgers("ns", "s") == []
        assert ns.view("s").segments == {}      # made by the first task ledger's marker, left empty
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


class CountingReads:
    """Every node a metadata read asks for (get, listing, stat), through the client's one session."""

    def __init__(self, nodes, monkeypatch) -> None:
        self.paths: list[str] = []
        self.requests = 0
        for name in ("get_many", "children_many", "children_versioned", "stat_many"):
            monkeypatch.setattr(nodes, name, self._counted(getattr(nodes, name)))

    def _counted(self, real):
        def read(paths, *args, **kw):
            self.paths += list(paths)
            self.requests += 1
            return real(paths, *args, **kw)
        return read


def unrelated_ledgers(c, n: int) -> list[int]:
    from concurrent.futures import ThreadPoolExecutor

    def make(_i: int) -> int:
        h = c.create_ledger(1, 1, 1)
        h.close()
        return h.ledger_id

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(make, range(n)))


def test_a_sweep_reads_the_metadata_of_the_streams_task_ledgers_only(cluster_factory, monkeypatch):
    """collect_orphans lists the stream's task markers and reads those ledgers: what it asks of
    ZooKeeper does not grow with the cluster's other ledgers (500 here)."""
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        b = SparkBatch.query("q", 0)
        assert commit_batch(opts(sb), b, [task_write(ns, b, 0, [b"linked"])], sweep=False)
        dead = task_write(ns, SparkBatch.query("q-dead", 3), 0, [b"orphan"])
        others = unrelated_ledgers(c, 500)
        reads = CountingReads(c.store.nodes, monkeypatch)
        assert collect_orphans(c, ns, "s", older_than_ms=0) == [dead.task.ledger_id]
        other_paths = {c.store.ledgers._paths.ledger(lid) for lid in others}
        assert not other_paths.intersection(reads.paths)
        assert reads.requests <= 8 and len(reads.paths) <= 20, (reads.requests, reads.paths)
        assert c.store.streams.list_task_ledgers("ns", "s") == []
        reads.paths.clear()
        reads.requests = 0
        assert collect_orphans(c, ns, "s", older_than_ms=0) == []   # nothing marked: one listing
        assert reads.requests == 1, reads.paths


def test_a_sweep_drops_linked_and_gone_markers_and_old_orphans_keeps_young_ones(cluster_factory):
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        b = SparkBatch.query("q", 0)
        msgs = [task_write(ns, b, p, [b"r%d" % p]) for p in range(2)]
        assert commit_batch(opts(sb), b, msgs, sweep=False)
        linked = sorted(m.task.ledger_id for m in msgs)
        assert c.store.streams.list_task_ledgers("ns", "s") == linked     # linked: left to the next sweep
        old = task_write(ns, SparkBatch.query("q-dead", 1), 0, [b"old"])
        gone = task_write(ns, SparkBatch.query("q-dead", 2), 0, [b"gone"])
        c.delete_ledger(gone.task.ledger_id)                             # deleted behind the sweep's back
        time.sleep(2.0)
        young = task_write(ns, SparkBatch.query("q-live", 1), 0, [b"young"])
        assert collect_orphans(c, ns, "s", older_than_ms=1500, dry_run=True) == [old.task.ledger_id]
        assert len(c.store.streams.list_task_ledgers("ns", "s")) == 5    # a dry run changes nothing
        assert collect_orphans(c, ns, "s", older_than_ms=1500) == [old.task.ledger_id]
        assert c.store.streams.list_task_ledgers("ns", "s") == [young.task.ledger_id]
        with pytest.raises(errors.NoSuchLedgerError):
            c.ledger_metadata(old.task.ledger_id)
        assert c.ledger_metadata(young.task.ledger_id).custom_metadata[TAG_STREAM] == b"ns/s"
        assert tagged_ledgers(c) == set(linked) | {young.task.ledger_id}
        ns.delete_stream("s")                                            # with markers left under it
        assert not ns.stream_exists("s") and tagged_ledgers(c) == {young.task.ledger_id}


def test_a_full_scan_finds_a_task_ledger_without_a_marker(cluster_factory):
    """A task ledger written before the markers existed (or by a task that died before marking
    it): only ``scan_all`` (the CLI's --all-ledgers) finds it."""
    sb = cluster_factory(1)
    with client(sb) as c:
        ns = c.create_namespace("ns", ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        ns.ensure_stream("s")
        unrelated_ledgers(c, 300)                                        # more than one batch of reads
        tags = {TAG_STREAM: b"ns/s", TAG_WRITE: b"q-old#0", TAG_CTIME: b"1000"}
        h = c.create_ledger(1, 1, 1, custom_metadata=tags, namespace="ns")
        h.close()
        assert collect_orphans(c, ns, "s", older_than_ms=0) == []
        listed = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", sb.connect_string,
                                 "gc", "ns/s", "--older-than-ms", "0", "--dry-run", "--all-ledgers"],
                                capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == [str(h.ledger_id)]
        assert collect_orphans(c, ns, "s", older_than_ms=0, scan_all=True) == [h.ledger_id]
        assert tagged_ledgers(c) == set()


SECRET = b"the-sink-tenants-cluster-secret-0123456789"
SUPER = "cluster:super-s3cret"
MEMBERS = "members:member-s3cret"
ROLES = {"root": ("admin", SUPER), "acme-admin": ("client", "acme-admin:a-pw"), "ingest": ("client", "ingest:i-pw"),
         "intruder": ("client", "intruder:x-pw")}


def role_client(sb, role: str):
    from ledger_client import ClientConfig, LedgerClient
    from spark_bookie.server.auth import mint_token

    claim, zk = ROLES[role]
    extra = {} if role == "root" else {"zk_member_auth": MEMBERS}
    return LedgerClient(sb.connect_string, config=ClientConfig(auth_token=mint_token(SECRET, role, claim, ttl_s=3600),
                                                               zk_auth=zk, operation_timeout_ms=15_000, **extra))


@pytest.fixture
def secured(cluster_factory, tmp_path):
    """Per-tenant ZooKeeper ACLs on (metadata/zk/tenant_acl.py); ``ingest`` may only produce in
    acme's namespace ``payments``; ``intruder`` has no grant."""
    from spark_bookie.server.auth import mint_token

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    conf = tmp_path / "root.toml"
    conf.write_text(f'[client]\nzk_auth = "{SUPER}"\nzk_member_auth = "{MEMBERS}"\n'
                    f'auth_token = "{mint_token(SECRET, "root", "admin", 3600)}"\n')
    sb = cluster_factory(1, auth_enabled=True, auth_token_secret_path=str(secret), zk_auth=SUPER,
                         client_conf=str(conf))
    done = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(conf), "shell", "--zk",
                           sb.connect_string, "secure-metadata", "--tenants"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "per-tenant ACLs on" in done.stdout, done.stderr
    with role_client(sb, "root") as c:
        for role in ("acme-admin", "ingest", "intruder"):
            c.store.tenants.register_role(role, ROLES[role][1])
        c.create_tenant("acme", admin_roles=["acme-admin"])
    with role_client(sb, "acme-admin") as c:
        c.create_namespace("payments", tenant="acme", ensemble_size=1, write_quorum_size=1,
                           ack_quorum_size=1).grant_permission("ingest", ["produce"])
    return sb


def test_a_produce_only_role_marks_sweeps_and_scans_past_ledgers_it_may_not_read(secured):
    """With per-tenant ZooKeeper ACLs a role granted only 'produce' makes the stream, the tasks
    directory and its markers, and its sweeps delete them; a full scan skips the ledgers it may
    not read (another role's) instead of failing."""
    with role_client(secured, "intruder") as c:
        foreign = c.create_ledger(1, 1, 1, password=b"x")
        foreign.close()
    with role_client(secured, "ingest") as c:
        ns = c.namespace("payments")
        with pytest.raises(errors.UnauthorizedAccessError):
            c.ledger_metadata(foreign.ledger_id)
        w = TaskLedgerWriter(ns, "s", SparkBatch.query("q-dead", 0), 0, relative_txids=True)
        w.add(b"orphan")
        dead = w.finish()
        assert c.store.streams.list_task_ledgers("payments", "s") == [dead.ledger_id]
        tags = {TAG_STREAM: b"payments/s", TAG_WRITE: b"q-old#0", TAG_CTIME: b"1000"}
        unmarked = c.create_ledger(1, 1, 1, custom_metadata=tags, namespace="payments")
        unmarked.close()
        assert collect_orphans(c, ns, "s", older_than_ms=0) == [dead.ledger_id]
        assert c.store.streams.list_task_ledgers("payments", "s") == []
        with pytest.raises(errors.UnauthorizedAccessError, match="'ingest' may not read ledgers"):
            _read_nodes(c, sorted(c.list_ledgers()), skip_denied=False)   # a batch holding the foreign one
        assert collect_orphans(c, ns, "s", older_than_ms=0, scan_all=True) == [unmarked.ledger_id]
        with pytest.raises(errors.NoSuchLedgerError):
            c.ledger_metadata(unmarked.ledger_id)
    with role_client(secured, "intruder") as c:
        assert c.ledger_metadata(foreign.ledger_id).ledger_id == foreign.ledger_id   # left alone
