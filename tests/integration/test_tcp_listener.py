"""The bookie's TCP add listener: its wire format, bad input on it, restarts, and the gRPC fallback."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from bookie_helpers import DIGEST, KEY, add_all, body, check_entry, wait_closed_by_bookie

from ledger_client import ClientConfig, DigestType, LedgerClient, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import ADD_HELLO, frame, read_frames
from ledger_client.transport import BookieClient, StreamLimits
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration


def _connect(bookie_id: str) -> tuple[socket.socket, int]:
    with BookieClient(bookie_id) as c:
        port = c.info().add_port
    assert port > 0
    s = socket.create_connection((bookie_id.rsplit(":", 1)[0], port), timeout=10)
    return s, port


def test_wire_format_hello_then_length_prefixed_batches(cluster_factory):
    sb = cluster_factory(1)
    bid = sb.bookies[0].bookie_id
    s, _ = _connect(bid)
    with s:
        batch = pb.AddBatch(ledger_adds=[pb.LedgerAdds(
            ledger_id=3, master_key=KEY, entry_ids=[0, 1], request_ids=[10, 11], bodies=[body(3, 0), body(3, 1)])])
        s.sendall(ADD_HELLO + frame(bid.encode()) + frame(batch.SerializeToString()))
        ok: list[int] = []
        for raw in read_frames(s, 1 << 20):
            ok.extend(pb.AddBatchResponse.FromString(raw).ok_request_ids)
            if len(ok) == 2:
                break
        assert sorted(ok) == [10, 11]
    with BookieClient(bid) as c:
        check_entry(c, 3, 0)
        check_entry(c, 3, 1)


def _explicit_lac(c: BookieClient, lid: int) -> int | None:
    resp = c.read_lac(lid)
    assert resp.status == pb.EOK
    return DIGEST.unframe_lac(resp.lac_body, lid) if resp.lac_body else None


def test_an_announced_lac_is_taken_only_with_the_ledgers_key_unfenced_and_well_formed(cluster_factory):
    """pb.LedgerAdds.lac_body: applied on receipt (ReadLac answers it), never answered; a wrong
    key, a fenced ledger or a malformed body leave the LAC as it was and the connection serving.
    Each announcement is followed on the same connection by an add whose answer proves the bookie
    took the announcement first (a connection's batches are applied in order)."""
    sb = cluster_factory(1)
    bid = sb.bookies[0].bookie_id
    with BookieClient(bid) as c:
        assert add_all(c, 3, range(3))[-1].status == pb.EOK
        assert add_all(c, 4, range(1))[-1].status == pb.EOK
    s, _ = _connect(bid)
    answers = read_frames(s, 1 << 20)

    def announce_then_add(lac_groups: list[pb.LedgerAdds], entry: int) -> None:
        add = pb.LedgerAdds(ledger_id=4, master_key=KEY, entry_ids=[entry], request_ids=[entry],
                            bodies=[body(4, entry)])
        s.sendall(frame(pb.AddBatch(ledger_adds=[*lac_groups, add]).SerializeToString()))
        resp = pb.AddBatchResponse.FromString(next(answers))
        assert list(resp.ok_request_ids) == [entry] and not resp.responses   # nothing answers the LAC

    with s, BookieClient(bid) as c:
        s.sendall(ADD_HELLO + frame(bid.encode()))
        announce_then_add([pb.LedgerAdds(ledger_id=3, master_key=b"w" * 20, lac_body=DIGEST.frame_lac(3, 2)),
                           pb.LedgerAdds(ledger_id=3, master_key=KEY, lac_body=b"\x01\x02"),
                           pb.LedgerAdds(ledger_id=3, master_key=KEY, lac_body=DIGEST.frame_lac(4, 2)),
                           pb.LedgerAdds(ledger_id=9, master_key=KEY, lac_body=DIGEST.frame_lac(9, 2))], 1)
        assert _explicit_lac(c, 3) is None       # wrong key, malformed, another ledger's
        assert c.read_lac(9).status == pb.ENOLEDGER   # an unknown ledger is not created for a LAC
        announce_then_add([pb.LedgerAdds(ledger_id=3, master_key=KEY, lac_body=DIGEST.frame_lac(3, 1))], 2)
        assert _explicit_lac(c, 3) == 1
        assert c.read(3, 0, fence=True, master_key=KEY).status == pb.EOK
        announce_then_add([pb.LedgerAdds(ledger_id=3, master_key=KEY, lac_body=DIGEST.frame_lac(3, 2))], 3)
        assert _explicit_lac(c, 3) == 1          # fenced: the old writer's word no longer counts
    log = sb.bookies[0].log_path.read_text()
    assert "malformed announced LAC" in log and "naming ledger 4" in log


@pytest.mark.parametrize("what", ["hello", "bookie id", "length", "garbage"])
def test_bad_input_closes_that_connection_and_the_bookie_goes_on(cluster_factory, what):
    sb = cluster_factory(1, entry_size_bytes_max=64 * 1024, grpc_message_bytes_max=1 << 20)
    bid = sb.bookies[0].bookie_id
    with BookieClient(bid) as c:
        assert add_all(c, 5, range(3))[-1].status == pb.EOK
    s, _ = _connect(bid)
    with s:
        hello = ADD_HELLO + frame(bid.encode())
        s.sendall({
            "hello": b"GET / HTTP/1.1\r\n\r\n",
            "bookie id": ADD_HELLO + frame(b"10.9.9.9:3181"),
            "length": hello + struct.pack(">I", 2 << 20) + b"x" * 100,
            "garbage": hello + frame(b"\xff\xff\xff\xff not a protobuf"),
        }[what])
        wait_closed_by_bookie(s)
    log = sb.bookies[0].log_path.read_text()
    assert "closing add connection" in log
    with BookieClient(bid) as c:  # nothing lost, and new connections work
        assert add_all(c, 5, range(3, 6))[-1].status == pb.EOK
        for e in range(6):
            check_entry(c, 5, e)


def _add_refused_in_the_call(c: BookieClient) -> errors.BookieUnavailableError:
    """Add to a dead bookie until an add raises from the call itself: the first may still go out
    on the old connection and fail in its future; once that connection is known broken, the known
    add port's refusal is known before the call returns (what lets a writer change its ensemble
    before any later entry completes on the live bookies alone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            fut = c.add(6, 99, KEY, body(6, 99))
        except errors.BookieUnavailableError as e:
            return e
        with pytest.raises(errors.BookieUnavailableError):
            fut.result(10)
    pytest.fail("no add to the dead bookie raised in the call within 10 s")


def test_a_restarted_bookie_on_a_new_add_port_is_found_again(cluster_factory):
    sb = cluster_factory(1)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        assert add_all(c, 6, range(5))[-1].status == pb.EOK
        b.kill()
        assert "add port" in str(_add_refused_in_the_call(c))
        sb.restart(b)  # add_port 0: the OS picks the port again, usually another one
        deadline = time.monotonic() + 30
        results = []
        while time.monotonic() < deadline:  # the first add after the restart may meet the dead connection
            try:
                results = add_all(c, 6, range(5, 8))
            except errors.BookieUnavailableError:
                time.sleep(0.2)
                continue
            break
        assert [r.status for r in results] == [pb.EOK] * 3
        for e in range(8):
            check_entry(c, 6, e)


def test_grpc_add_transport_still_works(cluster_factory):
    sb = cluster_factory(3)
    cfg = ClientConfig(bookie_add_transport="grpc")
    with LedgerClient(sb.connect_string, config=cfg) as client:
        w = client.create_ledger(3, 3, 2, DigestType.CRC32C, b"pw")
        for i in range(200):
            w.append_async(b"entry %d" % i)
        w.close()
        r = client.open_ledger(w.ledger_id, b"pw")
        assert [e.data for e in r.read(0, 199)] == [b"entry %d" % i for i in range(200)]
    with pytest.raises(errors.IncorrectParameterError, match="bookie_add_transport"):
        ClientConfig(bookie_add_transport="udp")
    assert StreamLimits().add_transport == "tcp"


def test_one_thread_reads_all_of_a_clients_add_connections_and_ends_with_it(cluster_factory):
    sb = cluster_factory(3)

    def readers() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("add-read")]

    before = readers()
    with LedgerClient(sb.connect_string) as client:
        ledgers = [client.create_ledger(3, 3, 2, DigestType.CRC32C, b"pw") for _ in range(2)]
        for w in ledgers:
            for i in range(100):
                w.append_async(b"entry %d" % i)
        for w in ledgers:
            w.close()  # every entry acknowledged: their answers were read
            assert w.last_add_confirmed == 99
        assert Counter(readers()) - Counter(before) == Counter(["add-readers"])  # three bookies, one reader
    deadline = time.monotonic() + 10
    while readers().count("add-readers") > before.count("add-readers") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert readers().count("add-readers") == before.count("add-readers"), "the reader outlived its client"


def test_an_add_port_in_use_refuses_to_start(cluster_factory, tmp_path: Path):
    sb = cluster_factory(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        conf = tmp_path / "b.toml"
        conf.write_text(f"[bookie]\nadd_port = {busy.getsockname()[1]}\n")
        r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "bookie", "--zk", sb.connect_string,
                            "--port", str(free_port()), "--journal-dir", str(tmp_path / "j"),
                            "--ledger-dir", str(tmp_path / "l"), "--conf", str(conf)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "already in use" in r.stderr, r.stderr


def test_stopping_an_in_process_bookie_ends_its_add_connections_at_once(zk_connect, tmp_path: Path):
    """Bookie is an importable object (hosted in Spark executors): stop() must close the add
    connections too, or a client would wait out its add timeout on a socket nobody serves."""
    from metadata import connect
    from spark_bookie.server.bookie import Bookie
    from spark_bookie.server.config import BookieConfig

    store = connect(zk_connect)
    store.cluster.init_cluster()
    store.close()
    cfg = BookieConfig(zk_connect=zk_connect, port=free_port(), journal_dirs=(str(tmp_path / "j"),),
                       ledger_dirs=(str(tmp_path / "l"),)).validate()
    bookie = Bookie(cfg)
    bookie.start()
    try:
        with BookieClient(bookie.bookie_id) as c:
            assert add_all(c, 9, range(3))[-1].status == pb.EOK
            stream = c._stream
            assert stream is not None and stream.broken is None
            t0 = time.monotonic()
            bookie.stop(grace_s=0.5)
            while stream.broken is None and time.monotonic() - t0 < 30:
                time.sleep(0.05)
            assert stream.broken is not None, "the add connection outlived the bookie"
            assert time.monotonic() - t0 < 5
    finally:
        bookie.stop()
