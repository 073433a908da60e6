"""The bookie's add connection answers from the journal thread: straight to the socket while it
takes them, through the event loop (after what waits there) once it is full. Real sockets and a
real loop; no processor is needed to send answers."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.add_framing import read_frames
from spark_bookie.add_listener import AddConnection

pytestmark = pytest.mark.unit


async def _buffered(conn: AddConnection) -> int:
    transport = conn._transport
    return transport.get_write_buffer_size() if transport is not None else -1


def test_answers_from_another_thread_arrive_whole_and_in_order_when_the_socket_fills() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    server, client = socket.socketpair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn = AddConnection(None, "bookie", 1 << 20, 1 << 20, set())  # type: ignore[arg-type]
    try:
        asyncio.run_coroutine_threadsafe(loop.connect_accepted_socket(lambda: conn, server), loop).result(5)
        answers = 40_000  # one frame each: the first half alone is far more than both socket buffers hold

        def journal(first: int, end: int) -> None:
            for i in range(first, end):
                conn._reply([i], [], counted=False)
                conn._send_answers()

        half = answers // 2
        sender = threading.Thread(target=journal, args=(0, half))
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "answering blocked on a client that does not read"
        waiting = asyncio.run_coroutine_threadsafe(_buffered(conn), loop).result(5)
        assert waiting > 0, "the socket never filled: the test did not reach the loop's path"
        # the rest is answered while the client drains: no answer may overtake those waiting
        sender = threading.Thread(target=journal, args=(half, answers))
        sender.start()
        got: list[int] = []
        client.settimeout(10)
        for raw in read_frames(client, 1 << 20):
            got.extend(pb.AddBatchResponse.FromString(raw).ok_request_ids)
            if len(got) >= answers:
                break
        sender.join(10)
        assert got == list(range(answers))
    finally:
        client.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
