"""Ledger metadata: validation, striping, the stored form, and every transition's rules."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import (
    DigestType,
    InvalidMetadataError,
    LedgerAlreadyClosedError,
    LedgerClosedConflict,
    LedgerMetadata,
    LedgerState,
    MetadataError,
    begin_recovery,
    close,
    decode,
    encode,
    replace_bookie,
    set_fragment,
    unchanged,
)
from metadata.layout import MAX_LEDGER_ID
from metadata.model import CURRENT_FORMAT_VERSION, MAGIC, master_key

pytestmark = pytest.mark.unit

B = ["b1:3181", "b2:3181", "b3:3181"]


def make(**changes: object) -> LedgerMetadata:
    base = LedgerMetadata.new_open(
        7, B, write_quorum_size=2, ack_quorum_size=2, digest_type=DigestType.CRC32C, password=b"pw",
        ctime=1234,
    )
    return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]


# -- model ------------------------------------------------------------------------------------
def test_digest_type_members_and_sizes() -> None:
    assert [(d.name, d.value, d.digest_bytes) for d in DigestType] == [
        ("CRC32", "CRC32", 8),
        ("CRC32C", "CRC32C", 4),
        ("HMAC", "HMAC", 20),
        ("DUMMY", "DUMMY", 0),
    ]


def test_new_open_and_queries() -> None:
    md = make()
    assert md.state is LedgerState.OPEN and not md.is_closed
    assert md.last_entry_id == -1 and md.length == 0
    assert md.ensembles == {0: B} and md.ensemble_size == 3
    assert md.password_hash == hashlib.sha1(b"ledgerpw").digest() == master_key(b"pw")
    assert md.password_matches(b"pw") and not md.password_matches(b"wrong")
    assert md.bookies() == set(B)
    assert md.format_version == CURRENT_FORMAT_VERSION == 1


def test_equality_and_defensive_copies() -> None:
    ensemble = list(B)
    custom = {"k": b"v"}
    md = LedgerMetadata(
        ledger_id=1, state=LedgerState.OPEN, ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
        last_entry_id=-1, length=0, ensembles={0: ensemble}, digest_type=DigestType.CRC32,
        password_hash=master_key(b""), ctime=0, custom_metadata=custom,
    )
    ensemble.append("b4:1")
    custom["x"] = b"y"
    assert md.ensembles == {0: B} and md.custom_metadata == {"k": b"v"}
    assert md == dataclasses.replace(md)
    assert md != dataclasses.replace(md, ctime=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        md.length = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ensemble_size": 3, "write_quorum_size": 4}, "ensemble >= write quorum"),
        ({"write_quorum_size": 2, "ack_quorum_size": 3}, "write quorum >= ack quorum"),
        ({"write_quorum_size": 1, "ack_quorum_size": 0}, ">= 1"),
        ({"ensembles": {0: ["b1:1", "b2:1"]}}, "exactly 3 distinct"),
        ({"ensembles": {0: ["b1:1", "b1:1", "b2:1"]}}, "exactly 3 distinct"),
        ({"ensembles": {0: B, 5: ["b1:1", "b2:1", ""]}}, "empty or non-string"),
        ({"ensembles": {1: B}}, "start at entry 0"),
        ({"ensembles": {0: "b1:1"}}, "list of bookie ids"),
        ({"ensembles": {0: B, 10: B, 5: B}}, "strictly increasing"),
        ({"ensembles": {0: B, -3: B}}, "strictly increasing|>= 0"),
        ({"last_entry_id": 4}, "last entry id -1"),
        ({"state": LedgerState.IN_RECOVERY, "last_entry_id": 4}, "last entry id -1"),
        ({"state": LedgerState.CLOSED, "last_entry_id": -2}, ">= -1"),
        ({"state": LedgerState.CLOSED, "last_entry_id": 3, "length": -1}, "length"),
        ({"password_hash": b"short"}, "20 bytes"),
        ({"ledger_id": -1}, "ledger id"),
        ({"ledger_id": MAX_LEDGER_ID + 1}, "ledger id"),
        ({"state": "OPEN"}, "LedgerState"),
        ({"digest_type": "CRC32"}, "DigestType"),
        ({"custom_metadata": {"k": "not bytes"}}, "str to bytes"),
    ],
)
def test_validation(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidMetadataError, match=message) as info:
        make(**changes)
    assert isinstance(info.value, MetadataError) and isinstance(info.value, ValueError)


def test_closed_empty_ledger_is_valid() -> None:
    md = make(state=LedgerState.CLOSED, last_entry_id=-1, length=0)
    assert md.is_closed and md.fragments() == [(0, -1, B)]


def test_write_set_is_round_robin() -> None:
    md = make()  # E=3, Qw=2
    assert [md.write_set(e) for e in range(4)] == [[0, 1], [1, 2], [2, 0], [0, 1]]
    five = LedgerMetadata.new_open(
        1, [f"b{i}:1" for i in range(5)], write_quorum_size=3, ack_quorum_size=2,
        digest_type=DigestType.DUMMY, password=b"",
    )
    assert five.write_set(3) == [3, 4, 0]
    with pytest.raises(ValueError):
        md.write_set(-1)


def test_ensemble_at_and_fragments() -> None:
    c = ["b4:1", "b5:1", "b6:1"]
    d = ["b7:1", "b8:1", "b9:1"]
    md = make(ensembles={0: B, 10: c, 25: d})
    assert md.ensemble_at(0) == B and md.ensemble_at(9) == B
    assert md.ensemble_at(10) == c and md.ensemble_at(24) == c and md.ensemble_at(10**12) == d
    assert md.fragments() == [(0, 9, B), (10, 24, c), (25, -1, d)]  # open-ended last fragment
    closed = close(md, 30, 999)
    assert closed.fragments() == [(0, 9, B), (10, 24, c), (25, 30, d)]
    early = close(md, 12, 100)  # the last fragment was never written: empty (last < first)
    assert early.fragments() == [(0, 9, B), (10, 12, c), (25, 12, d)]
    assert md.bookies() == set(B) | set(c) | set(d)
    with pytest.raises(ValueError):
        md.ensemble_at(-1)
    with pytest.raises(InvalidMetadataError, match="no ensemble"):
        make(ensembles={}).ensemble_at(0)


# -- stored form ------------------------------------------------------------------------------
def test_encode_decode_round_trip() -> None:
    md = make(ensembles={0: B, 7: ["x:1", "y:1", "z:1"]}, custom_metadata={"k": b"\x00v", "": b""})
    data = encode(md)
    assert data[:4] == MAGIC and struct.unpack(">H", data[4:6]) == (1,)
    assert decode(data, 7) == md
    assert encode(md) == data  # deterministic: equal metadata, equal bytes
    closed = close(md, 41, 4096)
    assert decode(encode(closed), 7) == closed


def test_decode_errors() -> None:
    data = encode(make())
    with pytest.raises(InvalidMetadataError, match="does not start with"):
        decode(b"BookieMetadataFormatVersion\t2\n", 7)
    with pytest.raises(InvalidMetadataError, match="does not start with"):
        decode(b"SB", 7)
    with pytest.raises(InvalidMetadataError, match="format version 2 is newer.*upgrade"):
        decode(MAGIC + struct.pack(">H", 2) + data[6:], 7)
    with pytest.raises(InvalidMetadataError, match="version 0"):
        decode(MAGIC + struct.pack(">H", 0) + data[6:], 7)
    with pytest.raises(InvalidMetadataError, match="corrupt"):
        decode(data[:6] + b"\xff\xff\xff", 7)
    with pytest.raises(InvalidMetadataError, match="ledger 7's"):
        decode(data, 8)
    with pytest.raises(InvalidMetadataError, match="unknown state"):  # empty protobuf: all defaults
        decode(data[:6], 0)
    with pytest.raises(InvalidMetadataError, match="format version 2"):
        encode(make(format_version=2))


bookie_ids = st.text(alphabet="abcdefghij0123456789.:-", min_size=1, max_size=20)


@st.composite
def metadatas(draw: st.DrawFn) -> LedgerMetadata:
    e = draw(st.integers(1, 6))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    starts = sorted(draw(st.sets(st.integers(1, 2**40), max_size=4)))
    ensembles = {
        k: draw(st.lists(bookie_ids, min_size=e, max_size=e, unique=True)) for k in [0, *starts]
    }
    state = draw(st.sampled_from(LedgerState))
    closed = state is LedgerState.CLOSED
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, MAX_LEDGER_ID)),
        state=state,
        ensemble_size=e,
        write_quorum_size=qw,
        ack_quorum_size=qa,
        last_entry_id=draw(st.integers(-1, 2**62)) if closed else -1,
        length=draw(st.integers(0, 2**62)) if closed else 0,
        ensembles=ensembles,
        digest_type=draw(st.sampled_from(DigestType)),
        password_hash=draw(st.binary(min_size=20, max_size=20)),
        ctime=draw(st.integers(0, 2**62)),
        custom_metadata=draw(st.dictionaries(st.text(max_size=10), st.binary(max_size=30), max_size=4)),
    )


@settings(deadline=None)  # no per-example timing: a loaded CI machine must not fail it
@given(metadatas())
def test_round_trip_property(md: LedgerMetadata) -> None:
    assert decode(encode(md), md.ledger_id) == md


# -- transitions ------------------------------------------------------------------------------
def test_close_rules() -> None:
    md = make()
    closed = close(md, 9, 100)
    assert closed.state is LedgerState.CLOSED and (closed.last_entry_id, closed.length) == (9, 100)
    assert md.state is LedgerState.OPEN  # inputs are never modified
    assert close(closed, 9, 100) is closed and unchanged(closed, close(closed, 9, 100))  # idempotent
    with pytest.raises(LedgerClosedConflict, match="already closed at entry 9"):
        close(closed, 10, 110)
    with pytest.raises(LedgerClosedConflict):
        close(closed, 9, 99)  # same entry, different length
    recovering = begin_recovery(md)
    by_writer = close(recovering, 5, 50)  # the writer's close overrides IN_RECOVERY
    assert by_writer.state is LedgerState.CLOSED and by_writer.last_entry_id == 5
    assert close(md, -1, 0).fragments() == [(0, -1, B)]  # empty ledger
    with pytest.raises(InvalidMetadataError):
        close(md, -2, 0)


def test_begin_recovery() -> None:
    md = make()
    recovering = begin_recovery(md)
    assert recovering.state is LedgerState.IN_RECOVERY and recovering.last_entry_id == -1
    assert begin_recovery(recovering) is recovering
    closed = close(md, 3, 4)
    assert begin_recovery(closed) is closed


def test_set_fragment_replace_append_reject() -> None:
    c = ["b4:1", "b5:1", "b6:1"]
    d = ["b4:1", "b2:3181", "b7:1"]
    md = make()
    appended = set_fragment(md, 10, c)
    assert appended.ensembles == {0: B, 10: c}
    replaced = set_fragment(appended, 10, d)  # same key: nothing was written there, replace
    assert replaced.ensembles == {0: B, 10: d}
    assert set_fragment(replaced, 10, d) is replaced
    with pytest.raises(InvalidMetadataError, match="before the last fragment"):
        set_fragment(replaced, 9, c)  # invariant 5: never a key below an existing one
    assert set_fragment(md, 0, c).ensembles == {0: c}  # change before the first entry was written
    with pytest.raises(InvalidMetadataError, match="exactly 3 distinct"):
        set_fragment(md, 5, ["b4:1", "b4:1", "b5:1"])
    with pytest.raises(LedgerAlreadyClosedError):
        set_fragment(close(md, 3, 3), 4, c)
    assert set_fragment(begin_recovery(md), 4, c).ensembles == {0: B, 4: c}  # recovery may change
    assert set_fragment(make(ensembles={}), 0, c).ensembles == {0: c}
    with pytest.raises(InvalidMetadataError, match="start at entry 0"):
        set_fragment(make(ensembles={}), 3, c)


def test_replace_bookie() -> None:
    c = ["b4:1", "b5:1", "b6:1"]
    md = close(set_fragment(make(), 10, c), 20, 200)  # works on closed ledgers
    swapped = replace_bookie(md, 10, "b5:1", "new:1")
    assert swapped.ensembles == {0: B, 10: ["b4:1", "new:1", "b6:1"]}  # position kept (striping)
    assert swapped.is_closed and swapped.last_entry_id == 20
    assert replace_bookie(swapped, 10, "b5:1", "new:1") is swapped  # already done: unchanged
    with pytest.raises(InvalidMetadataError, match="no fragment starting at entry 5"):
        replace_bookie(md, 5, "b5:1", "new:1")
    with pytest.raises(InvalidMetadataError, match="not in fragment"):
        replace_bookie(md, 10, "b1:3181", "new:1")
    with pytest.raises(InvalidMetadataError, match="already in fragment"):
        replace_bookie(md, 10, "b5:1", "b6:1")
