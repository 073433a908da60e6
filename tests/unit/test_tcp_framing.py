"""The TCP add connection's framing on real sockets: frames survive any split into reads."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import FrameError, add_batch_frame, frame, read_frames

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


def test_hand_encoded_add_batch_is_the_protobuf_encoding_byte_for_byte(seed):
    """add_batch_frame skips the protobuf object to copy each body once; what it sends must be
    exactly what the object would serialize to, or the bookie would misread adds."""
    rng = random.Random(seed)
    for _ in range(300):
        groups = []
        for _g in range(rng.randrange(1, 4)):
            n = rng.randrange(0, 12)
            groups.append((rng.randrange(0, 2**63), rng.choice([pb.ADD_NONE, pb.RECOVERY_ADD]),
                           rng.randbytes(rng.randrange(0, 30)), [rng.randrange(0, 2**62) for _ in range(n)],
                           [rng.randrange(0, 2**64) for _ in range(n)],
                           [rng.randbytes(rng.choice([0, 1, 127, 128, 1060, 16_384, 70_000])) for _ in range(n)]))
        want = pb.AddBatch(ledger_adds=[
            pb.LedgerAdds(ledger_id=lid, flag=flag, master_key=key, entry_ids=eids, request_ids=rids, bodies=bodies)
            for lid, flag, key, eids, rids, bodies in groups])
        token = rng.choice([None, "", "eyJ.a-token." + "x" * rng.randrange(0, 300)])
        if token:
            want.auth_token = token
        got = add_batch_frame(groups, token)
        assert got == frame(want.SerializeToString())
        assert pb.AddBatch.FromString(got[4:]) == want
