"""Hostile input against a live bookie (DESIGN §4.8): seeded garbage, oversized length prefixes,
malformed protobuf, truncated and half-open connections on its TCP port and its gRPC port. The
bookie drops each offending connection, keeps serving a normal client meanwhile and afterwards,
and its memory stays within a bound."""

from __future__ import annotations

import random
import socket
import time

import pytest

from ledger_client import ClientConfig, DigestType, LedgerClient
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import ADD_HELLO, READ_HELLO, frame
from ledger_client.transport import BookieClient

pytestmark = pytest.mark.integration

ATTACKS = 300
HALF_OPEN = 50
RSS_GROWTH_BYTES_MAX = 64 << 20


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _attack(rng: random.Random, bookie_id: str) -> bytes:
    """One connection's bytes: a mix of what a confused or hostile peer sends."""
    hello = rng.choice([ADD_HELLO, READ_HELLO]) + frame(bookie_id.encode())
    kind = rng.randrange(7)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 4096))                       # garbage instead of a hello
    if kind == 1:
        return hello + rng.randrange(64 << 20, 1 << 32).to_bytes(4, "big") + rng.randbytes(100)   # huge length
    if kind == 2:
        return hello + frame(rng.randbytes(rng.randrange(1, 2048)))        # a frame that is not protobuf
    if kind == 3:
        body = pb.AddBatch(ledger_adds=[pb.LedgerAdds(ledger_id=1, entry_ids=[0], request_ids=[1],
                                                      bodies=[b"x" * 100])]).SerializeToString()
        return hello + frame(body)[:rng.randrange(1, len(body))]            # truncated mid-frame
    if kind == 4:
        return hello[:rng.randrange(1, len(hello))]                         # truncated hello
    if kind == 5:
        return rng.choice([ADD_HELLO, READ_HELLO]) + (1 << 31).to_bytes(4, "big")   # huge bookie id
    return hello + frame(pb.ReadRangeRequest(ledger_id=rng.randrange(1 << 62), first_entry_id=0,
                                             last_entry_id=1 << 40, max_bytes=1 << 30).SerializeToString())


def _send(host: str, port: int, data: bytes) -> None:
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            while s.recv(1 << 16):   # until the bookie closes (or answers and the read ends)
                pass
    except OSError:
        pass   # a reset is one of the bookie's fair answers to garbage


def _round_trip(zk: str, tag: bytes) -> None:
    with LedgerClient(zk, config=ClientConfig(operation_timeout_ms=30_000)) as c:
        w = c.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                            digest_type=DigestType.CRC32C, password=b"pw")
        for i in range(50):
            w.append(tag + b"-%d" % i)
        w.close()
        r = c.open_ledger(w.ledger_id, password=b"pw")
        assert [e.data for e in r.read(0, 49)] == [tag + b"-%d" % i for i in range(50)]


def _http_attack(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 4096))
    if kind == 1:   # a body announced far over the limit
        return b"PUT /api/v1/bookie/gc HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n" + rng.randbytes(100)
    if kind == 2:   # a header section that never ends
        return b"GET /heartbeat HTTP/1.1\r\n" + b"X: " + b"a" * rng.randrange(1, 100_000)
    return b"GET /api/v1/ledger/read?ledger_id=" + rng.randbytes(50).hex().encode() + b" HTTP/1.1\r\n\r\n"


def test_live_bookie_survives_garbage_on_every_port(cluster_factory, seed):
    from http_helpers import call

    from spark_bookie.local.zookeeper import free_port

    http_port = free_port()
    sb = cluster_factory(1, grpc_message_bytes_max=64 << 20, http_port=http_port)
    b = sb.bookies[0]
    host, grpc_port = b.bookie_id.rsplit(":", 1)
    with BookieClient(b.bookie_id) as c:
        add_port = c.info().add_port
    _round_trip(sb.connect_string, b"before")
    assert b.proc is not None
    rss_before = _rss_bytes(b.proc.pid)
    rng = random.Random(seed)
    half_open = []
    try:
        for _ in range(HALF_OPEN):   # connections that say nothing, or half a hello, and stay
            s = socket.create_connection((host, add_port), timeout=10)
            s.sendall(ADD_HELLO[:rng.randrange(0, len(ADD_HELLO))])
            half_open.append(s)
        _round_trip(sb.connect_string, b"beside-half-open")
        for i in range(ATTACKS):
            _send(host, add_port, _attack(rng, b.bookie_id))
            if i % 10 == 0:   # the gRPC port: HTTP/2 garbage, and a preface followed by garbage
                _send(host, int(grpc_port), rng.choice([b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"])
                      + rng.randbytes(rng.randrange(1, 2048)))
            if i % 10 == 5:   # the admin HTTP port
                _send(host, http_port, _http_attack(rng))
        _round_trip(sb.connect_string, b"after")
        assert call(f"http://{host}:{http_port}/heartbeat")[0] == 200
        deadline = time.monotonic() + 60   # the bookie closes hello-less connections (HELLO_TIMEOUT_S)
        half_open[0].settimeout(60)
        try:
            assert half_open[0].recv(1) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() < deadline
    finally:
        for s in half_open:
            s.close()
    assert b.alive
    growth = _rss_bytes(b.proc.pid) - rss_before
    print(f"\nbookie RSS grew {growth / 1e6:.1f} MB over {ATTACKS} hostile connections")
    assert growth < RSS_GROWTH_BYTES_MAX
    assert "Traceback" not in b.log_path.read_text(errors="replace")
