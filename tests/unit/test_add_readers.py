"""The client's one thread reading all add connections (transport.add_readers), on real socket
pairs: frames come out whole and in order per connection however the bytes are cut, every way a
connection ends is reported exactly once and only then is it safe to close, and one thread
serves every connection of a client."""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from ledger_client.protocol.tcp_framing import frame
from ledger_client.transport.add_readers import AddReaders

pytestmark = pytest.mark.unit
WAIT_S = 10.0


class Conn:
    """One registered connection: what its handlers saw."""

    def __init__(self, readers: AddReaders, bytes_max: int = 1 << 20, fail_on: bytes | None = None) -> None:
        self.ours, self.peer = socket.socketpair()
        self.bodies: list[bytes] = []
        self.ends: list[str | None] = []
        self.fail_on = fail_on
        self.done = readers.register(self.ours, self._frame, self.ends.append, bytes_max)

    def _frame(self, body: bytes) -> None:
        if body == self.fail_on:
            raise ValueError("cannot take this body")
        self.bodies.append(body)

    def ended(self) -> str | None:
        assert self.done.wait(WAIT_S), "the connection's end was never reported"
        assert len(self.ends) == 1, self.ends
        return self.ends[0]

    def close(self) -> None:
        self.peer.close()
        self.ours.close()


@pytest.fixture()
def readers() -> Iterator[AddReaders]:
    r = AddReaders("add-readers-test")
    yield r
    r.close()


def test_frames_arrive_whole_and_in_order_however_the_bytes_are_cut(readers: AddReaders) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    conns = [Conn(readers) for _ in range(3)]
    sent: list[list[bytes]] = [[] for _ in conns]
    streams = []
    for k in range(len(conns)):
        bodies = [rng.randbytes(rng.choice([0, 1, 7, 300, 70_000])) for _ in range(40)]
        sent[k] = bodies
        streams.append(b"".join(frame(b) for b in bodies))
    pos = [0] * len(conns)
    while any(p < len(s) for p, s in zip(pos, streams, strict=True)):  # interleaved pieces of 1 byte to 100 KB
        k = rng.randrange(len(conns))
        n = rng.choice([1, 3, 4, 5, 1000, 100_000])
        conns[k].peer.sendall(streams[k][pos[k]:pos[k] + n])
        pos[k] += n
    for c in conns:
        c.peer.shutdown(socket.SHUT_WR)
    for c, bodies in zip(conns, sent, strict=True):
        assert c.ended() is None  # a clean close between frames
        assert c.bodies == bodies
        c.close()


def test_a_close_inside_a_frame_is_a_broken_connection(readers: AddReaders) -> None:
    c = Conn(readers)
    c.peer.sendall(frame(b"whole") + frame(b"cut short")[:6])
    c.peer.shutdown(socket.SHUT_WR)
    detail = c.ended()
    assert detail is not None and "inside a frame" in detail
    assert c.bodies == [b"whole"]
    c.close()


def test_an_oversized_frame_ends_the_connection_and_nothing_after_it_is_delivered(readers: AddReaders) -> None:
    c = Conn(readers, bytes_max=100)
    c.peer.sendall(frame(b"ok") + frame(b"x" * 101) + frame(b"after"))
    detail = c.ended()
    assert detail is not None and "FrameError" in detail and "101" in detail
    assert c.bodies == [b"ok"]
    c.close()


def test_a_handler_that_raises_ends_only_its_own_connection(readers: AddReaders) -> None:
    bad, good = Conn(readers, fail_on=b"poison"), Conn(readers)
    bad.peer.sendall(frame(b"one") + frame(b"poison") + frame(b"two"))
    detail = bad.ended()
    assert detail is not None and "cannot take this body" in detail
    assert bad.bodies == [b"one"]
    good.peer.sendall(frame(b"still read"))
    good.peer.shutdown(socket.SHUT_WR)
    assert good.ended() is None and good.bodies == [b"still read"]
    bad.close()
    good.close()


def test_a_reset_is_reported_with_its_error(readers: AddReaders) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    bodies: list[bytes] = []
    ends: list[str | None] = []
    done = readers.register(ours, bodies.append, ends.append, 1 << 20)
    peer.sendall(frame(b"before the reset"))
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # linger 0: a reset, as from a bookie host that dropped the connection
    assert done.wait(WAIT_S)
    assert bodies in ([b"before the reset"], [])  # the reset may discard what was unread
    assert len(ends) == 1 and ends[0] is not None and "ConnectionResetError" in ends[0]
    ours.close()


def test_one_thread_reads_every_connection(readers: AddReaders) -> None:
    conns = [Conn(readers) for _ in range(20)]
    for i, c in enumerate(conns):
        c.peer.sendall(frame(str(i).encode()))
    for i, c in enumerate(conns):
        c.peer.shutdown(socket.SHUT_WR)
        assert c.ended() is None and c.bodies == [str(i).encode()]
        c.close()
    assert [t.name for t in threading.enumerate()].count("add-readers-test") == 1


def test_close_ends_what_is_registered_and_refuses_more() -> None:
    r = AddReaders("add-readers-closing")
    conns = [Conn(r) for _ in range(3)]
    r.close()
    for c in conns:
        detail = c.ended()
        assert detail is not None and "closed" in detail
        c.close()
    ours, peer = socket.socketpair()
    with pytest.raises(OSError, match="closed"):
        r.register(ours, lambda b: None, lambda d: None, 100)
    ours.close()
    peer.close()
    for t in threading.enumerate():
        if t.name == "add-readers-closing":
            t.join(WAIT_S)
            assert not t.is_alive()


def test_a_failed_reading_thread_ends_its_connections_and_the_next_register_starts_anew(
        readers: AddReaders, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Conn(readers)

    def broken_read(*args: object) -> None:
        raise RuntimeError("a bug in the reading thread")
    monkeypatch.setattr(readers, "_read", broken_read)
    first.peer.sendall(frame(b"x"))
    detail = first.ended()
    assert detail is not None and "a bug in the reading thread" in detail
    first.close()
    monkeypatch.undo()
    second = Conn(readers)
    second.peer.sendall(frame(b"read by a new thread"))
    second.peer.shutdown(socket.SHUT_WR)
    assert second.ended() is None and second.bodies == [b"read by a new thread"]
    second.close()
