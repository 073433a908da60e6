"""The add port's limits on its own (real sockets, no bookie needed): a connection that never says
hello is closed after HELLO_TIMEOUT_S, connections beyond CONNECTIONS_MAX are closed at once, and
close() ends every connection's thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ledger_client.protocol.tcp_framing import ADD_HELLO, frame
from spark_bookie.server import tcp_listener
from spark_bookie.server.tcp_listener import TcpListener

pytestmark = pytest.mark.unit
BOOKIE = "127.0.0.1:3181"


@pytest.fixture()
def listener() -> Iterator[TcpListener]:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    sock = socket.create_server(("127.0.0.1", 0))
    lst = TcpListener(sock, None, BOOKIE, 100, 1 << 20, loop)  # type: ignore[arg-type]
    yield lst
    lst.close()
    loop.call_soon_threadsafe(loop.stop)
    runner.join(5)
    loop.close()


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_silent_connection_is_closed_after_the_hello_timeout(listener: TcpListener,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp_listener, "HELLO_TIMEOUT_S", 0.3)
    with socket.create_connection(("127.0.0.1", listener.port)) as s:
        s.sendall(ADD_HELLO[:3])  # half a hello, then nothing
        t0 = time.monotonic()
        assert _closed_within(s, 5), "a connection that never finished its hello stayed open"
        assert time.monotonic() - t0 < 3


def test_connections_over_the_limit_are_closed_and_close_ends_the_rest(listener: TcpListener,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp_listener, "CONNECTIONS_MAX", 2)
    served = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(2)]
    for s in served:
        s.sendall(ADD_HELLO + frame(BOOKIE.encode()))
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", listener.port)) as extra:
        assert _closed_within(extra, 5), "a connection over CONNECTIONS_MAX was served"
    assert not any(_closed_within(s, 0.2) for s in served), "a connection within the limit was closed"
    t0 = time.monotonic()
    listener.close()
    assert all(_closed_within(s, 5) for s in served)
    assert time.monotonic() - t0 < 3
    for s in served:
        s.close()
