"""Range and listed reads on the bookie's TCP port: the wire format, bad input, the client's
answers matching gRPC's, a dead bookie, a bookie that never answers, and a restart."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from bookie_helpers import add_all, body, wait_closed_by_bookie

from ledger_client import ClientConfig, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import READ_HELLO, frame, read_frames
from ledger_client.transport import BookieClient
from ledger_client.transport.socket_reads import SocketReads

pytestmark = pytest.mark.integration


def _read_socket(bookie_id: str) -> socket.socket:
    with BookieClient(bookie_id) as c:
        port = c.info().add_port
    s = socket.create_connection((bookie_id.rsplit(":", 1)[0], port), timeout=10)
    s.sendall(READ_HELLO + frame(bookie_id.encode()))
    return s


def _answers(s: socket.socket, n: int) -> dict[int, pb.ReadRangeResponse]:
    """The next `n` answers on a read connection, by request id."""
    got: dict[int, pb.ReadRangeResponse] = {}
    for raw in read_frames(s, 1 << 24):
        r = pb.ReadRangeResponse.FromString(raw)
        got[r.request_id] = r
        if len(got) == n:
            break
    return got


def _bookie_holding(cluster_factory, ledger_id: int, count: int, size: int = 100):
    """One bookie, holding entries 0..count-1 of `ledger_id` (bodies as bookie_helpers.body)."""
    sb = cluster_factory(1)
    with BookieClient(sb.bookies[0].bookie_id) as c:
        add_all(c, ledger_id, range(count), size=size)
    return sb, sb.bookies[0].bookie_id


def test_wire_format_answers_carry_the_request_id(cluster_factory):
    _sb, bid = _bookie_holding(cluster_factory, 4, 6)
    with _read_socket(bid) as s:
        s.sendall(frame(pb.ReadRangeRequest(ledger_id=4, entry_ids=[1, 3, 5], request_id=70).SerializeToString())
                  + frame(pb.ReadRangeRequest(ledger_id=4, first_entry_id=0, last_entry_id=2,
                                              request_id=71).SerializeToString())
                  + frame(pb.ReadRangeRequest(ledger_id=99, first_entry_id=0, last_entry_id=0,
                                              request_id=72).SerializeToString())
                  + frame(pb.ReadRangeRequest(ledger_id=4, entry_ids=[0, 2, 6, 9], ids_only=True,
                                              request_id=73).SerializeToString()))
        got = _answers(s, 4)
    assert list(got[70].entry_ids) == [1, 3, 5] and list(got[70].bodies) == [body(4, e) for e in (1, 3, 5)]
    assert list(got[71].bodies) == [body(4, e) for e in range(3)]
    assert got[72].status == pb.ENOLEDGER  # a refusal is an answer, the connection goes on
    assert got[73].status == pb.EOK and list(got[73].entry_ids) == [0, 2] and not got[73].bodies


def test_ids_only_names_the_held_entries_on_both_transports(cluster_factory):
    """What a repair asks (ReadRangeRequest.ids_only): the held ids among those listed, none read;
    EOK with none held, ENOLEDGER for a ledger the bookie does not have, EBADREQ for bad ids."""
    sb = cluster_factory(1)
    bid = sb.bookies[0].bookie_id
    with BookieClient(bid) as c:
        add_all(c, 6, [*range(0, 4), *range(7, 10)])   # 4..6 missing: a gap in the middle
    for transport in ("tcp", "grpc"):
        with BookieClient(bid, read_transport=transport) as c:
            r = c.held_entries_future(6, list(range(0, 12))).result(timeout=10)
            assert (r.status, list(r.entry_ids), list(r.bodies)) == (pb.EOK, [0, 1, 2, 3, 7, 8, 9], []), transport
            r = c.held_entries_future(6, [4, 5, 6, 10]).result(timeout=10)
            assert (r.status, list(r.entry_ids)) == (pb.EOK, []), transport
            assert c.held_entries_future(99, [0]).result(timeout=10).status == pb.ENOLEDGER, transport
            assert c.held_entries_future(6, [3, 2]).result(timeout=10).status == pb.EBADREQ, transport
            assert c.held_entries_future(6, []).result(timeout=10).status == pb.EBADREQ, transport   # no ids


def test_more_reads_at_once_than_a_connection_serves_all_get_answers(cluster_factory):
    """Past READS_PER_CONNECTION_MAX reads in flight the bookie stops reading the connection
    (answers of megabytes each must not pile up without bound) and goes on once reads finish."""
    from spark_bookie.server.read_connection import READS_PER_CONNECTION_MAX

    _sb, bid = _bookie_holding(cluster_factory, 8, 4, size=20_000)
    n = 3 * READS_PER_CONNECTION_MAX
    with _read_socket(bid) as s:
        s.sendall(b"".join(frame(pb.ReadRangeRequest(ledger_id=8, first_entry_id=i % 4, last_entry_id=3,
                                                     request_id=i + 1).SerializeToString()) for i in range(n)))
        got = _answers(s, n)
    assert sorted(got) == list(range(1, n + 1))
    for rid, r in got.items():
        assert list(r.bodies) == [body(8, e, 20_000) for e in range((rid - 1) % 4, 4)]


def test_garbage_closes_only_that_read_connection(cluster_factory):
    sb, bid = _bookie_holding(cluster_factory, 5, 3)
    with _read_socket(bid) as s:
        s.sendall(frame(b"\xff\xff\xff\xff not a protobuf"))
        wait_closed_by_bookie(s)
    assert "closing read connection" in sb.bookies[0].log_path.read_text()
    with BookieClient(bid) as c:
        assert list(c.read_range(5, 0, 2).bodies) == [body(5, e) for e in range(3)]


def test_tcp_reads_answer_as_grpc_reads_and_survive_a_restart(cluster_factory):
    sb = cluster_factory(1)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as tcp, BookieClient(b.bookie_id, read_transport="grpc") as grpc_:
        add_all(tcp, 6, range(40), size=3000)
        for c in (tcp, grpc_):
            assert c.read_range(6, 0, 39, max_bytes=20_000).bodies == tcp.read_range(6, 0, 39, 20_000).bodies
        listed = [tcp.read_entries_future(6, [0, 7, 39, 50], 0) for _ in range(20)]  # many in flight
        want = grpc_.read_entries_future(6, [0, 7, 39, 50], 0).result(10)
        assert list(want.entry_ids) == [0, 7, 39]
        for f in listed:
            got = f.result(10)
            assert got.request_id > 0 and (got.status, got.entry_ids, got.bodies) == (
                want.status, want.entry_ids, want.bodies)
        b.kill()
        with pytest.raises(errors.BookieUnavailableError):
            tcp.read_range(6, 0, 0)  # a clear error at once, not a hang
        sb.restart(b)  # add_port 0: the OS picks the port again, usually another one
        deadline = time.monotonic() + 30
        while True:
            try:
                assert list(tcp.read_range(6, 0, 1).bodies) == [body(6, e, 3000) for e in range(2)]
                break
            except errors.BookieUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def test_a_bookie_that_never_answers_times_out_and_is_forgotten():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        accepted: list[socket.socket] = []
        threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
        forgotten: list[bool] = []
        reads = SocketReads("127.0.0.1:1", lambda: ("127.0.0.1", server.getsockname()[1]),
                            lambda: forgotten.append(True), timeout_s=0.3, message_bytes_max=1 << 20)
        first = reads.submit(pb.ReadRangeRequest(ledger_id=1, first_entry_id=0, last_entry_id=0))
        time.sleep(0.4)
        second = reads.submit(pb.ReadRangeRequest(ledger_id=1, first_entry_id=0, last_entry_id=0))
        with pytest.raises(errors.LedgerTimeoutError):
            first.result(5)  # failed when the next read went out past its deadline
        reads.close()
        with pytest.raises(errors.BookieUnavailableError):
            second.result(5)  # closing fails what was pending
        assert forgotten  # no answer ever came: the port is asked for again next time
        for s in accepted:
            s.close()


def test_read_transport_is_validated():
    with pytest.raises(errors.IncorrectParameterError, match="bookie_read_transport"):
        ClientConfig(bookie_read_transport="udp")
    assert ClientConfig().bookie_read_transport == "tcp"


def test_waiting_long_polls_are_answered_by_the_add_that_moves_the_lac_or_by_their_timeout(cluster_factory):
    """Range long polls that have to wait (spark_bookie.server.read_connection): more of them
    than a connection serves at once, each answered once: with the entries the moment an add
    carrying a later LAC arrives, or with the LAC unchanged and nothing at its timeout; the
    connection reads the requests that waited in the meantime and goes on serving."""
    from spark_bookie.server.read_connection import READS_PER_CONNECTION_MAX

    _sb, bid = _bookie_holding(cluster_factory, 9, 3)   # entry 2 carries LAC 1
    n = READS_PER_CONNECTION_MAX + 8

    def poll(rid: int, timeout_ms: int, previous_lac: int = 1) -> bytes:
        return frame(pb.ReadRangeRequest(ledger_id=9, first_entry_id=previous_lac + 1, last_entry_id=9,
                                         wait_for_lac=True, previous_lac=previous_lac, timeout_ms=timeout_ms,
                                         request_id=rid).SerializeToString())

    with _read_socket(bid) as s, BookieClient(bid) as c:
        s.sendall(b"".join(poll(i + 1, 30_000) for i in range(n)))
        time.sleep(0.3)   # the polls are waiting (none may be answered before the LAC moves)
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(1)
        s.settimeout(10)
        t0 = time.monotonic()
        assert add_all(c, 9, range(3, 5))[-1].status == pb.EOK   # entry 4 carries LAC 3
        got = _answers(s, n)
        assert time.monotonic() - t0 < 5 and sorted(got) == list(range(1, n + 1))
        for r in got.values():
            assert r.status == pb.EOK and r.lac == 3 and list(r.bodies) == [body(9, 2), body(9, 3)]
        t0 = time.monotonic()
        s.sendall(poll(500, 300, previous_lac=3))   # nothing moves the LAC past 3 now: answered at its timeout
        [late] = _answers(s, 1).values()
        assert late.request_id == 500 and late.lac == 3 and not late.bodies and time.monotonic() - t0 >= 0.25
        s.sendall(frame(pb.ReadRangeRequest(ledger_id=9, first_entry_id=0, last_entry_id=4,
                                            request_id=501).SerializeToString()))
        assert list(_answers(s, 1)[501].bodies) == [body(9, e) for e in range(5)]
