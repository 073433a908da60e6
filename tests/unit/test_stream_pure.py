"""The stream layer's pure parts: DLSN, the record-set codec, namespace settings, metadata
encoding and transitions (no I/O)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client import DLSN, NamespaceSettings, errors
from ledger_client.stream import records
from metadata import InvalidMetadataError
from metadata.streams import SegmentEnd, SegmentMeta, SegmentState, StreamMeta, StreamView
from metadata.streams import model as m
from metadata.streams import transitions as tr

pytestmark = pytest.mark.unit


def test_dlsn_orders_prints_and_parses():
    assert DLSN.INITIAL == DLSN(1, 0, 0)
    assert DLSN(1, 2, 3) < DLSN(1, 3, 0) < DLSN(2, 0, 0)
    assert str(DLSN(3, 14, 15)) == "3/14/15" and DLSN.parse("3/14/15") == DLSN(3, 14, 15)
    for bad in ("", "1/2", "a/b/c", "1/2/3/4", "0/0/0", "1/-1/0", None):
        with pytest.raises(errors.IncorrectParameterError):
            DLSN.parse(bad)  # type: ignore[arg-type]
    assert isinstance(DLSN.parse(" 1/0/0 "), DLSN)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.binary(max_size=300)), max_size=50),
       st.integers(0, 2**63 - 1))
def test_record_set_round_trip(recs, before):
    data = records.encode([t for t, _ in recs], [p for _, p in recs], before)
    rs = records.RecordSet(data)
    assert rs.count == len(recs) and rs.records_before == before and not rs.is_control
    assert rs.txids.tolist() == [t for t, _ in recs] and rs.payloads == [p for _, p in recs]


def test_malformed_record_sets_are_refused(seed):
    rng = random.Random(seed)
    good = records.encode([1, 2, 3], [b"a", b"bb", b"ccc"], 7)
    bad = [b"", good[:10], good[:-1], good + b"x", bytes([0xD0]) + good[1:], good[:1] + b"\x02" + good[2:],
           good[:2] + b"\x80" + good[3:], good[:4] + (10 ** 6).to_bytes(4, "little") + good[8:]]
    for _ in range(200):
        b = bytearray(good)
        b[rng.randrange(len(b))] = rng.randrange(256)
        bad.append(bytes(b))
    for data in bad:
        try:
            rs = records.RecordSet(data)
        except errors.CorruptRecordSetError:
            continue
        # A flipped byte inside a payload or a txid still parses: the entry's digest is what catches those.
        assert len(data) == len(good) and rs.count == 3


def test_namespace_settings_are_validated():
    s = NamespaceSettings.build(ensemble_size=5, write_quorum_size=3, ack_quorum_size=2, retention_ms=None)
    assert NamespaceSettings.from_json(s.to_json()) == s
    for bad in ({"ensemble_size": 2, "write_quorum_size": 3}, {"ack_quorum_size": 0}, {"digest_type": "MD5"},
                {"segment_rolling_bytes": -1}, {"retention_ms": "1d"}, {"output_buffer_bytes": 1 << 30},
                {"record_size_bytes_max": True}, {"nope": 1}):
        with pytest.raises(errors.IncorrectParameterError):
            NamespaceSettings.build(**bad)
    assert s.updated(retention_bytes=10).retention_bytes == 10


def test_metadata_encoding_round_trips_and_refuses_newer_formats():
    seg = SegmentMeta(3, 42, SegmentState.SEALED, 10, 19, 4, 2, 10, 500, 1, 2)
    assert m.decode_segment(m.encode_segment(seg)) == seg
    meta = StreamMeta(5, 4, 19, (2, 0, 0), False, {"q": 3})
    assert m.decode_stream(m.encode_stream(meta)) == meta
    for data in (b"not json", b"[]", b'{"v": 99, "ctime_ms": 1}', b'{"ctime_ms": 1}'):
        with pytest.raises(InvalidMetadataError):
            m.decode_stream(data)


def _view(*segs: SegmentMeta, **meta: object) -> StreamView:
    return StreamView(StreamMeta(**meta), 7, {s.sequence: (s, 0) for s in segs})  # type: ignore[arg-type]


def _sealed(seq: int, first_txid: int, n: int, sealed_ms: int = 0, nbytes: int = 100) -> SegmentMeta:
    return SegmentMeta(seq, 100 + seq, SegmentState.SEALED, first_txid, first_txid + n - 1, n - 1, 0, n, nbytes,
                       0, sealed_ms)


def test_transitions_keep_the_rules():
    v = _view(next_sequence=1)
    start = tr.start_segment(v, 11, 0, 5)
    assert start.create[0].sequence == 1 and start.meta.next_sequence == 2
    v = _view(start.create[0], next_sequence=2)
    with pytest.raises(InvalidMetadataError, match="in progress"):
        tr.start_segment(v, 12, 0, 5)
    rolled = tr.roll(v, 1, SegmentEnd(4, 0, 5, 50, 4), 12, 5, 6)
    assert rolled.update[0][0].state is SegmentState.SEALED and rolled.create[0].sequence == 2
    assert rolled.meta.max_txid == 4
    with pytest.raises(InvalidMetadataError):
        tr.seal_segment(_view(_sealed(1, 0, 5), next_sequence=2), 1, SegmentEnd(4, 0, 5, 50, 4), 6)
    with pytest.raises(InvalidMetadataError, match="below"):
        tr.start_segment(_view(_sealed(1, 0, 5), next_sequence=2, max_txid=4), 13, 3, 7)
    with pytest.raises(InvalidMetadataError, match="ended"):
        tr.start_segment(_view(next_sequence=1, end_of_stream=True), 13, 0, 7)


def test_truncation_and_retention_delete_only_whole_older_segments():
    segs = [_sealed(1, 0, 10, 100), _sealed(2, 10, 10, 200), _sealed(4, 20, 10, 300),
            SegmentMeta(5, 105, SegmentState.IN_PROGRESS, 30)]
    v = _view(*segs, next_sequence=6)
    cut = tr.truncate(v, (2, 5, 0))
    assert [s for s, _ in cut.delete] == [1] and cut.meta.truncated_before == (2, 5, 0)
    assert cut.released_ledgers == (101,)
    assert tr.truncate(_view(*segs, next_sequence=6, truncated_before=(4, 0, 0)), (1, 0, 0)).meta.truncated_before \
        == (4, 0, 0)
    old = tr.retention(v, now_ms=1_000, retention_ms=750, retention_bytes=None)
    assert old is not None and [s for s, _ in old.delete] == [1, 2] and old.meta.truncated_before == (4, 0, 0)
    assert tr.retention(v, now_ms=1_000, retention_ms=10_000, retention_bytes=None) is None
    big = tr.retention(v, now_ms=0, retention_ms=None, retention_bytes=150)
    assert big is not None and [s for s, _ in big.delete] == [1, 2]   # never the newest segment
    assert tr.retention(_view(segs[0], next_sequence=2), 10**9, 1, 1) is None


def test_records_are_built_with_the_collector_paused_and_it_comes_back_as_it_was():
    import gc

    from ledger_client.stream.chunks import Chunk, arrow_to_records, gc_paused, records_to_arrow

    data = records.encode([100, 101, 102], [b"p0", b"p1", b"p2"], 0)
    chunk = Chunk(2, 100, [(0, data)], DLSN(2, 0, 1), "test")
    got = chunk.records()
    assert [(r.dlsn, r.txid, r.payload) for r in got] == [(DLSN(2, 0, 1), 101, b"p1"), (DLSN(2, 0, 2), 102, b"p2")]
    assert arrow_to_records(records_to_arrow(got)) == got and gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failure while building")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()   # the caller's choice stands
    finally:
        gc.enable()


def test_records_built_in_a_pause_are_not_walked_by_the_collector_after_it(monkeypatch):
    """What a big build made goes to the collector's oldest generation unexamined (a walk of every
    record at once was a third of read_batch's cost); the caller's own garbage from before it is
    still collected young; a small build (a tailing reader's) and a process that froze objects of
    its own keep the collector as it was."""
    import gc
    import weakref

    from ledger_client.stream.chunks import AGE_MIN_RECORDS, gc_paused

    class Node:
        pass

    cycle = Node()
    cycle.me = cycle   # type: ignore[attr-defined]
    gone = weakref.ref(cycle)
    del cycle
    with gc_paused(AGE_MIN_RECORDS):
        built = [DLSN(1, i, 0) for i in range(AGE_MIN_RECORDS)]   # tuple subclasses: never untracked
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert gone() is None, "the caller's cyclic garbage went unexamined to the oldest generation"
    assert gc.is_tracked(built[-1]) and id(built[-1]) in oldest and id(built[0]) in oldest
    freezes: list[int] = []   # a small build (a tailing reader's) moves nothing: no freeze at all
    # (observed by a spy: its records could also reach the oldest generation by a full collection)
    with monkeypatch.context() as m:
        m.setattr(gc, "freeze", lambda: freezes.append(1))
        with gc_paused(AGE_MIN_RECORDS - 1):
            pass
    assert freezes == []
    kept: list[object] = []   # the process's own frozen object (the freeze count is no witness:
    gc.freeze()                # frozen objects that other tests left may be freed meanwhile)
    try:
        with monkeypatch.context() as m:
            m.setattr(gc, "freeze", lambda: freezes.append(1))
            with gc_paused(AGE_MIN_RECORDS):
                pass
        tracked = {id(o) for o in gc.get_objects()}   # every generation, not the frozen
        assert freezes == [] and id(kept) not in tracked, "the pause let the process's frozen objects go"
    finally:
        gc.unfreeze()
