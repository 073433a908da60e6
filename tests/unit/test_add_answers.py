"""The bookie's add connection answers from the journal thread: straight to the socket while it
takes them, through a writer thread (after what waits there) once it is full; and it answers
every add of a batch whatever fails. Real sockets, journal and storage."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER
from ledger_client.protocol.tcp_framing import frame, read_frames
from spark_bookie.errors import StorageIOError
from spark_bookie.server.add_connection import AddConnection
from spark_bookie.server.config import BookieConfig
from spark_bookie.server.processor import RequestProcessor
from spark_bookie.storage.journal import Journal
from spark_bookie.storage.ledger_storage import LedgerStorage

pytestmark = pytest.mark.unit


def _pair() -> tuple[socket.socket, socket.socket, AddConnection]:
    server, client = socket.socketpair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return server, client, AddConnection(server, "peer", None, 1 << 20, 1 << 20)  # type: ignore[arg-type]


def _answer(conn: AddConnection, first: int, end: int) -> None:
    for i in range(first, end):
        conn._reply([i], [], counted=False)
        conn._send_answers()


def test_answers_from_another_thread_arrive_whole_and_in_order_when_the_socket_fills() -> None:
    _, client, conn = _pair()
    try:
        answers = 40_000  # one frame each: the first half alone is far more than both socket buffers hold
        half = answers // 2
        sender = threading.Thread(target=_answer, args=(conn, 0, half))
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "answering blocked on a client that does not read"
        assert conn._out._writer is not None, "the socket never filled: the test did not reach the writer's path"
        # the rest is answered while the client drains: no answer may overtake those waiting
        sender = threading.Thread(target=_answer, args=(conn, half, answers))
        sender.start()
        got: list[int] = []
        client.settimeout(10)
        for raw in read_frames(client, 1 << 20):
            got.extend(pb.AddBatchResponse.FromString(raw).ok_request_ids)
            if len(got) >= answers:
                break
        sender.join(10)
        assert got == list(range(answers))
        deadline = time.monotonic() + 5
        while conn._out._writer is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert conn._out._writer is None, "the writer thread outlived what it had to send"
    finally:
        client.close()
        conn.close()


def test_a_connection_whose_client_takes_no_answers_stops_reading_and_closes_promptly() -> None:
    """Back-pressure on that client alone: with more than PENDING_BYTES_MAX of answers untaken the
    serving thread reads no more requests; close() still ends it (and its writer) at once."""
    _, client, conn = _pair()
    _answer(conn, 0, 200_000)  # ~2 MB of frames: over PENDING_BYTES_MAX once the socket is full
    serving = threading.Thread(target=conn.serve)
    serving.start()
    client.sendall(b"\xff" * 4)  # a length over the limit: a reading thread would drop the connection
    time.sleep(0.5)
    assert serving.is_alive(), "the connection read a request while its client took no answers"
    t0 = time.monotonic()
    conn.close()
    serving.join(10)
    assert not serving.is_alive() and time.monotonic() - t0 < 2, "close() waited on a client that does not read"
    client.close()


def test_every_add_of_a_batch_is_answered_when_applying_it_fails_midway(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage error while applying the second ledger's adds of a batch (an inline flush that
    failed): every add of the batch still gets an answer, none is left to the client's timeout."""
    storage = LedgerStorage(tmp_path / "l")
    journal = Journal(tmp_path / "j", group_commit_wait_ms=0.0)
    journal.start()
    cfg = BookieConfig(journal_dirs=(str(tmp_path / "j"),), ledger_dirs=(str(tmp_path / "l"),))
    processor = RequestProcessor(cfg, storage, journal, None, None, lambda: False)  # type: ignore[arg-type]
    real = storage.add_entries

    def failing(ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        if ledger_id == 2:
            raise StorageIOError("entry log write failed")
        real(ledger_id, entries)

    monkeypatch.setattr(storage, "add_entries", failing)
    server, client = socket.socketpair()
    conn = AddConnection(server, "peer", processor, 1000, 1 << 20)
    serving = threading.Thread(target=conn.serve)
    serving.start()
    try:
        batch = pb.AddBatch(ledger_adds=[
            pb.LedgerAdds(ledger_id=lid, master_key=b"k" * 20, entry_ids=[0, 1], request_ids=[lid * 10, lid * 10 + 1],
                          bodies=[HEADER.pack(lid, e, -1, 0) for e in (0, 1)]) for lid in (1, 2, 3)])
        client.sendall(frame(batch.SerializeToString()))
        answered: dict[int, int] = {}
        client.settimeout(10)
        for raw in read_frames(client, 1 << 20):
            resp = pb.AddBatchResponse.FromString(raw)
            answered.update({rid: pb.EOK for rid in resp.ok_request_ids})
            answered.update({r.request_id: r.status for r in resp.responses})
            if len(answered) == 6:
                break
        assert sorted(answered) == [10, 11, 20, 21, 30, 31]
        assert answered[20] == answered[21] == pb.EIO
    finally:
        client.close()
        serving.join(10)
        journal.stop()
        storage.close()
