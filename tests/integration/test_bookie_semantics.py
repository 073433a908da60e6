"""Bookie semantics and bad input against real bookie processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from bookie_helpers import KEY, add_all, body, check_entry, dir_bytes, tmpfs_fixture, wait_until  # noqa: F401

from ledger_client import errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import master_key
from ledger_client.transport import BookieClient, StreamLimits
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration


def test_wrong_master_key_is_unauthorized(cluster_factory):
    sb = cluster_factory(1)
    with BookieClient(sb.bookies[0].bookie_id) as c:
        assert add_all(c, 1, range(3))[-1].status == pb.EOK
        wrong = master_key(b"not the password")
        r = add_all(c, 1, range(3, 4), key=wrong)[0]
        assert r.status == pb.EUA and "master key" in r.detail
        assert c.read(1, 0, fence=True, master_key=wrong).status == pb.EUA
        # Nothing was lost or fenced by the rejected requests.
        assert add_all(c, 1, range(3, 4))[0].status == pb.EOK
        for e in range(4):
            check_entry(c, 1, e)


def test_reads_of_unknown_ledger_and_entry(cluster_factory):
    sb = cluster_factory(1)
    with BookieClient(sb.bookies[0].bookie_id) as c:
        assert c.read(404, 0).status == pb.ENOLEDGER
        add_all(c, 2, range(3))
        assert c.read(2, 5).status == pb.ENOENTRY
        r = c.read(2, -1)
        assert r.status == pb.EOK and r.entry_id == 2 and r.body == body(2, 2)
        rr = c.read_range(2, 0, 10)
        assert rr.status == pb.EOK and list(rr.bodies) == [body(2, e) for e in range(3)]


def test_malformed_and_oversized_requests(cluster_factory):
    sb = cluster_factory(1, entry_size_bytes_max=64 * 1024, grpc_message_bytes_max=1 << 20)
    addr = sb.bookies[0].bookie_id
    with BookieClient(addr) as c:
        big = add_all(c, 4, range(1), size=100 * 1024)[0]
        assert big.status == pb.EBADREQ and "entry_size_bytes_max" in big.detail
        mismatch = c.add(4, 1, KEY, body(4, 2)).result(timeout=10)
        assert mismatch.status == pb.EBADREQ and "header" in mismatch.detail
        short = c.add(4, 1, KEY, b"tiny").result(timeout=10)
        assert short.status == pb.EBADREQ
        neg = c.add(-4, 1, KEY, body(-4, 1)).result(timeout=10)
        assert neg.status == pb.EBADREQ
        badkey = c.add(4, 1, b"short", body(4, 1)).result(timeout=10)
        assert badkey.status == pb.EBADREQ and "master key" in badkey.detail
        assert c.read(4, -7).status == pb.EBADREQ
        assert c.read_range(4, 5, 1).status == pb.EBADREQ
    # Bytes that are not a protobuf message at all, and a message over the gRPC limit.
    with grpc.insecure_channel(addr) as ch:
        raw = ch.unary_unary("/spark_bookie.v1.Bookie/Read")
        with pytest.raises(grpc.RpcError) as ei:
            raw(b"\xff\xff\xff\xff garbage", timeout=10)
        assert ei.value.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
        assert "parsing" in ei.value.details() or "corrupt" in ei.value.details()
        huge = pb.ReadRangeRequest(ledger_id=1, first_entry_id=0, last_entry_id=0).SerializeToString() + \
            pb.ReadRequest(master_key=b"x" * (2 << 20)).SerializeToString()
        with pytest.raises(grpc.RpcError) as ei:
            ch.unary_unary("/spark_bookie.v1.Bookie/ReadRange")(huge, timeout=10)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The bookie keeps serving.
    with BookieClient(addr) as c:
        assert add_all(c, 4, range(2))[-1].status == pb.EOK
        check_entry(c, 4, 1)
        assert c.info().status == pb.EOK


def test_both_add_forms_and_a_misshapen_group(cluster_factory):
    """One AddBatch may carry one-message-per-add requests and packed LedgerAdds; a packed group
    whose columns do not line up is refused add by add (EBADREQ), and nothing of it is stored."""
    sb = cluster_factory(1)
    addr = sb.bookies[0].bookie_id
    batch = pb.AddBatch(
        adds=[pb.AddRequest(ledger_id=7, entry_id=e, master_key=KEY, body=body(7, e), request_id=100 + e)
              for e in range(2)],
        ledger_adds=[
            pb.LedgerAdds(ledger_id=8, master_key=KEY, entry_ids=[0, 1, 2], request_ids=[200, 201, 202],
                          bodies=[body(8, e) for e in range(3)]),
            pb.LedgerAdds(ledger_id=9, master_key=KEY, entry_ids=[0, 1], request_ids=[300, 301, 302],
                          bodies=[body(9, 0)]),
        ])
    with grpc.insecure_channel(addr) as ch:
        stream = ch.stream_stream("/spark_bookie.v1.Bookie/AddStream",
                                  request_serializer=pb.AddBatch.SerializeToString,
                                  response_deserializer=pb.AddBatchResponse.FromString)
        ok: set[int] = set()
        failed: dict[int, pb.AddResponse] = {}
        for resp in stream(iter([batch]), timeout=20):
            ok.update(resp.ok_request_ids)
            failed.update((r.request_id, r) for r in resp.responses)
    assert ok == {100, 101, 200, 201, 202}
    assert set(failed) == {300, 301, 302}
    assert all(r.status == pb.EBADREQ and "line up" in r.detail for r in failed.values())
    assert [failed[r].entry_id for r in (300, 301, 302)] == [0, 1, -1]
    with BookieClient(addr) as c:
        for lid, n in ((7, 2), (8, 3)):
            for e in range(n):
                check_entry(c, lid, e)
        assert c.read(9, 0).status == pb.ENOLEDGER


def test_too_many_adds_in_flight(cluster_factory):
    sb = cluster_factory(1, in_flight_adds_per_stream_max=50)
    with BookieClient(sb.bookies[0].bookie_id, batch_entries_max=500) as c:
        # Queue many adds at once: one batch of more than 50 exceeds the stream's bound.
        statuses = {r.status for r in add_all(c, 6, range(400))}
        assert pb.ETOOMANYREQUESTS in statuses
        resp = add_all(c, 6, range(400, 401))
        assert resp[0].status == pb.EOK


def test_client_keeps_in_flight_adds_under_the_bookies_bound(cluster_factory):
    """The same flood as above, with the client's in-flight bound under the bookie's: nothing is
    refused (the rest waits in the client), and every add becomes durable."""
    sb = cluster_factory(1, in_flight_adds_per_stream_max=50)
    limits = StreamLimits(batch_entries_max=500, in_flight_adds_max=40)
    with BookieClient(sb.bookies[0].bookie_id, limits=limits) as c:
        assert {r.status for r in add_all(c, 6, range(400))} == {pb.EOK}
        check_entry(c, 6, 399)


def test_a_bookie_too_far_behind_is_refused_more_adds(cluster_factory):
    """backlog_adds_max bounds what waits for one bookie: the next add fails at once with
    BookieUnavailableError (a writer then replaces that bookie) instead of growing memory."""
    sb = cluster_factory(1)
    limits = StreamLimits(in_flight_adds_max=1, backlog_adds_max=5)
    with BookieClient(sb.bookies[0].bookie_id, limits=limits) as c:
        futures = []
        with pytest.raises(errors.BookieUnavailableError, match="backlog_adds_max"):
            for e in range(1000):
                futures.append(c.add(8, e, KEY, body(8, e)))
        assert 5 <= len(futures) < 1000
        assert all(f.result(timeout=20).status == pb.EOK for f in futures)


def test_read_only_mode_engages_and_clears(cluster_factory, tmpfs):
    """Past its disk-usage threshold a bookie turns read-only (reads still served) and comes back
    below the low-water mark. On a 256 MiB filesystem of its own (journal and ledgers), which
    nothing else running on the machine fills or frees."""
    sb = cluster_factory(0)
    disk = tmpfs(sb.root / "bookie-0", 256)
    b = sb.add_bookie(disk_usage_threshold=0.5, disk_usage_lwm=0.3, disk_check_interval_ms=100)
    store = sb.store
    store.ledgers.create_ledger_node(8, b"")   # turning read-only runs a GC round: a ledger it keeps
    with BookieClient(b.bookie_id) as c:
        add_all(c, 8, range(5))
        filler = disk / "filler.bin"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 160 << 20)   # 62% used
        try:
            # The bookie joins the read-only list before it leaves the writable one
            # (BookKeeper's order: never in neither list), so wait for both.
            wait_until(lambda: b.bookie_id in store.cluster.list_bookies(readonly=True)
                       and b.bookie_id not in store.cluster.list_bookies(),
                       what="read-only registration replacing the writable one")
            r = add_all(c, 8, range(5, 6))[0]
            assert r.status == pb.EREADONLY
            assert c.info().read_only
            check_entry(c, 8, 4)  # reads are still served
        finally:
            filler.unlink()
        wait_until(lambda: b.bookie_id in store.cluster.list_bookies()
                   and b.bookie_id not in store.cluster.list_bookies(readonly=True),
                   what="writable registration replacing the read-only one")
        assert add_all(c, 8, range(5, 6))[0].status == pb.EOK


def test_gc_frees_a_deleted_ledgers_space(cluster_factory):
    sb = cluster_factory(1, entry_log_size_bytes_max=1 << 20, gc_interval_ms=300, flush_interval_ms=200)
    b = sb.bookies[0]
    sb.store.ledgers.create_ledger_node(11, b"")
    sb.store.ledgers.create_ledger_node(12, b"")
    size = 8 * 1024
    with BookieClient(b.bookie_id) as c:
        add_all(c, 11, range(1500), size=size)   # ~12 MB in many entry logs
        add_all(c, 12, range(50), size=size)
        wait_until(lambda: dir_bytes(b.ledger_dir) > 10e6, what="entries flushed to entry logs")
        before = dir_bytes(b.ledger_dir)
        sb.store.ledgers.delete_ledger_node(11)
        wait_until(lambda: dir_bytes(b.ledger_dir) < before - 8e6, timeout_s=60, what="GC to reclaim space")
        assert c.read(11, 0).status == pb.ENOLEDGER
        for e in range(50):
            check_entry(c, 12, e, size=size)


# ---------------------------------------------------------------------- refusals to start

def _run_bookie(zk: str, port: int, journal: Path, ledgers: Path, *extra: str,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spark_bookie.cli", "bookie", "--zk", zk, "--port", str(port),
           "--journal-dir", str(journal), "--ledger-dir", str(ledgers), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_cookie_refusals(cluster_factory, tmp_path):
    sb = cluster_factory(1)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        add_all(c, 1, range(3))
    assert b.stop() == 0  # clean shutdown on SIGTERM
    zk, port, j, lg = sb.connect_string, b.port, b.journal_dir, b.ledger_dir

    swapped = _run_bookie(zk, port, lg, j)
    assert swapped.returncode == 2 and "swapped" in swapped.stderr, swapped.stderr

    other_port = _run_bookie(zk, free_port(), j, lg)
    assert other_port.returncode == 2 and "port" in other_port.stderr, other_port.stderr

    saved = tmp_path / "saved-journal"
    shutil.move(str(j), str(saved))
    j.mkdir()
    emptied = _run_bookie(zk, port, j, lg)
    assert emptied.returncode == 2 and "no cookie" in emptied.stderr, emptied.stderr
    shutil.rmtree(j)
    shutil.move(str(saved), str(j))

    cookie = sb.store.cluster.read_cookie(b.bookie_id)
    sb.store.cluster.delete_cookie(b.bookie_id, cookie[1])
    no_zk_cookie = _run_bookie(zk, port, j, lg)
    assert no_zk_cookie.returncode == 2 and "ZooKeeper has none" in no_zk_cookie.stderr
    sb.store.cluster.write_cookie(b.bookie_id, cookie[0], None)

    # With everything put back, the same bookie starts and still has its data.
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        for e in range(3):
            check_entry(c, 1, e)


def test_bad_directory_port_in_use_and_zookeeper_down(cluster_factory, tmp_path):
    sb = cluster_factory(1)
    zk = sb.connect_string
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    r = _run_bookie(zk, free_port(), a_file, tmp_path / "l1")
    assert r.returncode == 2 and "not a directory" in r.stderr, r.stderr

    r = _run_bookie(zk, sb.bookies[0].port, tmp_path / "j2", tmp_path / "l2")
    assert r.returncode == 2 and "already in use" in r.stderr, r.stderr

    conf = tmp_path / "fast.toml"
    conf.write_text("[bookie]\nzk_connect_timeout_ms = 2000\n")
    t0 = time.monotonic()
    r = _run_bookie(f"127.0.0.1:{free_port()}", free_port(), tmp_path / "j3", tmp_path / "l3",
                    "--conf", str(conf))
    assert r.returncode == 2 and "ZooKeeper" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30

    conf.write_text("[bookie]\nno_such_key = 1\n")
    r = _run_bookie(zk, free_port(), tmp_path / "j4", tmp_path / "l4", "--conf", str(conf))
    assert r.returncode == 2 and "no_such_key" in r.stderr, r.stderr


def test_restart_after_kill_takes_over_the_registration_its_dead_predecessor_left(cluster_factory):
    """The killed bookie's node lingers until its session times out; the same bookie restarted on
    this machine sees from the node that its writer is dead, removes it and registers at once."""
    sb = cluster_factory(1, registration_wait_ms_max=60_000)
    b = sb.bookies[0]
    b.kill()
    assert b.bookie_id in sb.store.cluster.list_bookies()  # the dead session's ephemeral node lingers
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        assert c.info().status == pb.EOK
    said = Path(b.log_path).read_text()
    assert "left by a process of this bookie that is no longer running" in said, said[-2000:]


def test_a_registration_held_by_a_live_process_is_waited_for_and_refused(cluster_factory):
    """A node of the bookie's id whose writer still runs (here: this test, on its own session) is
    never taken over: the bookie waits registration_wait_ms_max, then refuses to start."""
    import json

    from metadata.errors import NodeExistsError
    from spark_bookie.local.sandbox import SandboxError
    from spark_bookie.server.process_identity import this_process, written_by_dead_process

    sb = cluster_factory(1, registration_wait_ms_max=1_500)
    b = sb.bookies[0]
    b.stop()
    live = json.dumps({"id": b.bookie_id, **this_process()}).encode()
    sb.store.cluster.register_bookie(b.bookie_id, readonly=False, data=live, wait_ms_max=0)
    with pytest.raises(SandboxError, match="already registered"):
        sb.restart(b)
    assert sb.store.cluster.list_bookies() == [b.bookie_id]   # still the live holder's
    sb.store.cluster.unregister_bookie(b.bookie_id, readonly=False)
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        assert c.info().status == pb.EOK
    with pytest.raises(NodeExistsError):   # and the live bookie's node is not taken over either
        sb.store.cluster.register_bookie(b.bookie_id, readonly=False, data=live, wait_ms_max=0,
                                         left_by_dead=written_by_dead_process)
