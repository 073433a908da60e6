"""Hostile input, bounded and seeded (DESIGN §4.8): the TCP port's framing, hello and request
decoding, and token verification, driven by hypothesis with arbitrary bytes and mangled valid
messages. Whatever arrives, the bookie's code either serves whole valid frames or drops the
connection with a typed error; it never raises anything else and never reads past a frame.
Replay a failure with SPARK_BOOKIE_SEED=<seed printed>."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.tcp_framing import (
    ADD_HELLO,
    ADD_HELLO_AUTH,
    READ_HELLO,
    READ_HELLO_AUTH,
    FrameError,
    add_batch_frame,
    frame,
    next_frame,
)
from spark_bookie.server.add_connection import AddConnection
from spark_bookie.server.auth import AuthError, ConnectionAccess, TokenVerifier, mint_token
from spark_bookie.server.read_connection import ReadConnection
from spark_bookie.server.tcp_listener import HelloError, _hello

pytestmark = pytest.mark.unit

SEED = int(os.environ.get("SPARK_BOOKIE_SEED", random.SystemRandom().randrange(1 << 32)))
FUZZ = settings(max_examples=int(os.environ.get("SPARK_BOOKIE_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BYTES_MAX = 4096
BOOKIE = "127.0.0.1:3181"


@pytest.fixture(autouse=True)
def _print_seed() -> None:
    print(f"\nfuzz seed = {SEED} (SPARK_BOOKIE_SEED={SEED} replays it)")


ids = st.integers(min_value=0, max_value=(1 << 63) - 1)
groups = st.lists(st.tuples(ids, st.sampled_from([0, 1]), st.binary(max_size=20),
                            st.lists(ids, max_size=4), st.lists(ids, max_size=4),
                            st.lists(st.binary(max_size=64), max_size=4)), max_size=3)


def _valid_add_frame(g: list) -> bytes:
    n = [min(len(e), len(r), len(b)) for _, _, _, e, r, b in g]
    return add_batch_frame([(lid, f, k, e[:m], r[:m], b[:m]) for (lid, f, k, e, r, b), m in zip(g, n, strict=True)])


chunks = st.one_of(
    groups.map(_valid_add_frame),
    st.binary(max_size=200).map(frame),                                   # a frame of anything
    st.binary(max_size=64),                                               # raw garbage
    st.integers(min_value=BYTES_MAX + 1, max_value=(1 << 32) - 1).map(lambda n: n.to_bytes(4, "big")),
    st.builds(lambda f, cut: f[:cut], groups.map(_valid_add_frame), st.integers(0, 40)),  # truncated
)
streams = st.lists(chunks, max_size=8).map(b"".join)


@hypothesis_seed(SEED)
@FUZZ
@given(streams)
def test_next_frame_splits_or_refuses_and_never_reads_past_a_frame(data):
    buf, pos = bytearray(data), 0
    while True:
        try:
            got = next_frame(buf, pos, BYTES_MAX)
        except FrameError:
            assert int.from_bytes(buf[pos:pos + 4], "big") > BYTES_MAX
            return
        if got is None:
            assert len(buf) - pos < 4 or int.from_bytes(buf[pos:pos + 4], "big") > len(buf) - pos - 4
            return
        body, end = got
        assert end == pos + 4 + len(body) <= len(buf) and body == bytes(buf[pos + 4:end])
        pos = end


class _Processor:
    """Stands in for the RequestProcessor: records what would be applied, answers nothing."""

    def __init__(self) -> None:
        self.batches: list[pb.AddBatch] = []

    def admit(self, groups: list[Any]) -> tuple[Any, list[Any]]:
        from spark_bookie.server.admission import Piece

        return None, [Piece(groups, 0.0)]   # no namespace is rate-limited here: the batch in one piece

    def wait_for_room(self, flow: Any, timeout_s: float | None = None) -> bool:
        return True

    def process_adds(self, batch: pb.AddBatch, reply: Any, flush: Any = None, caller: Any = None,
                     flow: Any = None, groups: Any = None) -> None:
        self.batches.append(batch)

    async def read_range(self, req: pb.ReadRangeRequest, caller: Any = None) -> pb.ReadRangeResponse:
        return pb.ReadRangeResponse(status=pb.ENOLEDGER, ledger_id=req.ledger_id)


@hypothesis_seed(SEED)
@FUZZ
@given(streams)
def test_add_connection_applies_whole_batches_or_drops_the_connection(data):
    a, b = socket.socketpair()
    try:
        p = _Processor()
        conn = AddConnection(a, "fuzz", p, in_flight_adds_max=1 << 40, message_bytes_max=BYTES_MAX)  # type: ignore[arg-type]
        pos = conn._parse(bytearray(data))
        expected, at = [], 0
        while True:
            try:
                got = next_frame(bytearray(data), at, BYTES_MAX)
            except FrameError:
                assert pos == -1
                break
            if got is None:
                assert pos == at
                break
            body, at = got
            try:
                expected.append(pb.AddBatch.FromString(body))
            except Exception:
                assert pos == -1
                break
        assert p.batches == expected
    finally:
        a.close()
        b.close()


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


read_chunks = st.one_of(
    st.builds(lambda lid, first, last, n: frame(pb.ReadRangeRequest(
        ledger_id=lid, first_entry_id=first, last_entry_id=last, max_bytes=n).SerializeToString()),
        ids, ids, ids, st.integers(0, 1 << 30)),
    st.binary(max_size=100).map(frame), st.binary(max_size=40),
    st.integers(min_value=BYTES_MAX + 1, max_value=(1 << 32) - 1).map(lambda n: n.to_bytes(4, "big")))


@hypothesis_seed(SEED)
@FUZZ
@given(st.lists(read_chunks, max_size=6).map(b"".join), st.booleans(), st.integers(1, 64))
def test_read_connection_answers_each_request_or_drops_the_connection(data, refused, split):
    """Delivered in pieces of `split` bytes, as TCP may; refused (a bad token): EUA, nothing read."""
    async def run() -> tuple[_Transport, int]:
        t = _Transport()
        rc = ReadConnection(_Processor(), BYTES_MAX, "fuzz", lambda _c: None,  # type: ignore[arg-type]
                            ConnectionAccess(_verifier, None) if refused else None)
        rc.connection_made(t)  # type: ignore[arg-type]
        for i in range(0, len(data), split):
            if t.closed:
                break
            rc.data_received(data[i:i + split])
        while rc._tasks:
            await asyncio.gather(*list(rc._tasks))
        return t, len(rc._buf)

    t, left = asyncio.run(run())
    answers, pos = [], 0
    while (got := next_frame(t.out, pos, 1 << 20)) is not None:
        body, pos = got
        answers.append(pb.ReadRangeResponse.FromString(body))
    assert all(a.status == (pb.EUA if refused else pb.ENOLEDGER) for a in answers)
    assert left < 4 + BYTES_MAX or t.closed


hello_chunks = st.one_of(
    st.sampled_from([ADD_HELLO, READ_HELLO, ADD_HELLO_AUTH, READ_HELLO_AUTH]), st.just(frame(BOOKIE.encode())),
    st.binary(max_size=30).map(frame), st.binary(max_size=12),
    st.integers(min_value=1 << 14, max_value=(1 << 32) - 1).map(lambda n: n.to_bytes(4, "big")))


@hypothesis_seed(SEED)
@FUZZ
@given(st.lists(hello_chunks, max_size=5).map(b"".join))
def test_hello_accepts_only_a_well_formed_hello_for_this_bookie(data):
    a, b = socket.socketpair()
    try:
        b.sendall(data)
        b.shutdown(socket.SHUT_WR)   # a truncated hello ends, it does not hang
        a.settimeout(5)
        try:
            reads, token = _hello(a, BOOKIE)
        except (HelloError, OSError):
            return
        head = data[:8]
        assert head in (ADD_HELLO, READ_HELLO, ADD_HELLO_AUTH, READ_HELLO_AUTH)
        assert data[8:12 + len(BOOKIE)] == frame(BOOKIE.encode())
        assert reads == (head in (READ_HELLO, READ_HELLO_AUTH))
        assert token is None or head in (ADD_HELLO_AUTH, READ_HELLO_AUTH)
    finally:
        a.close()
        b.close()


SECRET = b"fuzz-secret-0123456789abcdef0123456789"
_verifier = TokenVerifier(SECRET, "HS256")
_good = mint_token(SECRET, "someone", "client", ttl_s=3600)


@hypothesis_seed(SEED)
@FUZZ
@given(st.one_of(st.text(max_size=300), st.builds(lambda i, c: _good[:i] + c + _good[i + 1:],
                                                   st.integers(0, len(_good) - 1), st.characters())))
def test_token_verification_refuses_anything_but_a_signed_token(token):
    try:
        principal = _verifier.verify(token)
    except AuthError:
        return
    assert token == _good or principal.subject == "someone"   # a change the base64 decoding ignores
