"""The TCP add connection's framing on real sockets: frames survive any split into reads."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from ledger_client.protocol.add_framing import FrameError, frame, read_frames

pytestmark = pytest.mark.unit


def _send_in_pieces(sock: socket.socket, data: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 7000)
        sock.sendall(data[pos:pos + n])
        pos += n
    sock.shutdown(socket.SHUT_WR)


def test_frames_come_back_whole_however_the_bytes_are_split(seed):
    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.choice([0, 1, 3, 4, 5, 100, 65_536, 200_000])) for _ in range(60)]
    a, b = socket.socketpair()
    with a, b:
        t = threading.Thread(target=_send_in_pieces, args=(a, b"".join(frame(x) for x in bodies), rng))
        t.start()
        got = list(read_frames(b, 1 << 20, chunk_bytes=rng.randint(1, 9000)))
        t.join()
    assert got == bodies


def test_a_length_over_the_limit_is_refused():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame(b"x" * 100) + frame(b"y" * 2000))
        it = read_frames(b, 1000)
        assert next(it) == b"x" * 100
        with pytest.raises(FrameError, match="over the limit"):
            next(it)


def test_eof_inside_a_frame_is_an_error_and_eof_between_frames_is_the_end():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame(b"whole") + frame(b"cut short")[:-3])
        a.shutdown(socket.SHUT_WR)
        it = read_frames(b, 1000)
        assert next(it) == b"whole"
        with pytest.raises(FrameError, match="inside a frame"):
            next(it)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame(b"one") + frame(b""))
        a.shutdown(socket.SHUT_WR)
        assert list(read_frames(b, 1000)) == [b"one", b""]
