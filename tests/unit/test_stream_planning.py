"""The stream source's and tiering's pure rules: options, globs, pushdown, planning from segments,
streaming offsets and caps, and the tiering transitions (no I/O)."""

from __future__ import annotations

import pickle
import random

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith

from jobs.options import StreamSourceOptions, matches, parse_stream_patterns, reads_streams
from jobs.stream_planning import (
    SegmentExtent,
    StreamPushdown,
    cap_end,
    offsets_from_json,
    offsets_to_json,
    plan_stream_spans,
    push_stream_filters,
    stream_end,
)
from ledger_client import DLSN
from ledger_client.errors import IncorrectParameterError
from metadata import InvalidMetadataError
from metadata.streams import SegmentMeta, SegmentState, StreamMeta, StreamView, TierInfo
from metadata.streams import tiering as tt

pytestmark = pytest.mark.unit


def test_options_patterns_and_starting_offsets():
    o = StreamSourceOptions.parse({"zk": "z", "streams": "pay/orders, pay/*,pay/orders", "decode": "utf8",
                                   "startingOffsets": '{"pay/orders": "3/4/5"}', "max_records_per_trigger": "10"},
                                  env={})
    assert o.patterns == (("pay", "orders"), ("pay", "*")) and o.starting_offsets == "json"
    assert o.starting_dlsns == (("pay/orders", DLSN(3, 4, 5)),) and o.max_records_per_trigger == 10
    assert o.schema_ddl() == "stream STRING, segment BIGINT, entry_id BIGINT, slot INT, txid BIGINT, payload STRING"
    assert pickle.loads(pickle.dumps(o)) == o
    assert reads_streams({"Streams": "a/b"}) and not reads_streams({"ledgers": "1"})
    assert matches(o.patterns, "pay", "x") and not matches(o.patterns, "other", "orders")
    assert matches(parse_stream_patterns("*/ord?rs"), "a", "orders")
    for bad in ({"zk": "z"}, {"zk": "z", "streams": "noslash"}, {"zk": "z", "streams": " , "},
                {"zk": "z", "streams": "a/b/c"}, {"zk": "z", "streams": "a/b", "startingOffsets": "never"},
                {"zk": "z", "streams": "a/b", "startingOffsets": '{"a/b": "0/0/0"}'},
                {"zk": "z", "streams": "a/b", "startingOffsets": '{"a/*": "1/0/0"}'},
                {"zk": "z", "streams": "a/b", "startingOffsets": '{"a/b,c/d": "1/0/0"}'},
                {"zk": "z", "streams": "a/b", "decode": "json"}, {"streams": "a/b"}):
        with pytest.raises(IncorrectParameterError):
            StreamSourceOptions.parse(bad, env={})


def test_push_filters_on_stream_and_txid_leave_the_rest():
    pd, rest = push_stream_filters([EqualTo(("stream",), "a/b"), In(("stream",), ("a/b", "a/c")),
                                    GreaterThanOrEqual(("txid",), 10), LessThan(("txid",), 20),
                                    StringStartsWith(("stream",), "a"), EqualTo(("payload",), b"x")])
    assert pd.streams == frozenset({"a/b"}) and (pd.txid.lo, pd.txid.hi) == (10, 19) and len(rest) == 2
    assert pd.may_hold(15, 30) and pd.may_hold(0, None) and not pd.may_hold(20, 25) and not pd.may_hold(0, 9)
    assert StreamPushdown().may_hold(-5, -1)    # txids may be negative: no filter admits them all


def ext(stream: str, seq: int, last: int, first_txid: int = 0, records: int | None = 10, **kw) -> SegmentExtent:
    return SegmentExtent(stream, seq, 100 + seq, last, first_txid,
                         None if records is None else first_txid + records - 1, records, **kw)


def test_planning_covers_exactly_the_range_and_respects_the_size():
    rng = random.Random(7)
    xs = [ext("a/s", 1, 9, tier=("/t", 3)), ext("a/s", 2, 4), ext("a/s", 4, 20, records=None), ext("b/s", 1, 30)]
    ranges = {"a/s": ((1, 5, 2), (4, 11, 0)), "b/s": ((1, 0, 0), None)}
    for size in (1, 3, 7, 100):
        parts = plan_stream_spans(xs, ranges, StreamPushdown(), size, rng.randint(1, 4))
        assert all(sum(s.entries for s in p) <= size for p in parts)
        got = [(s.stream, s.sequence, e) for p in parts for s in p for e in range(s.first, s.last + 1)]
        want = ([("a/s", 1, e) for e in range(5, 10)] + [("a/s", 2, e) for e in range(5)]
                + [("a/s", 4, e) for e in range(11)] + [("b/s", 1, e) for e in range(31)])
        assert got == want
        assert all(s.tier == ("/t", 3) for p in parts for s in p if s.sequence == 1 and s.stream == "a/s")
    only_b = plan_stream_spans(xs, ranges, push_stream_filters([EqualTo(("stream",), "b/s")])[0], 100)
    assert {s.stream for p in only_b for s in p} == {"b/s"}
    late = plan_stream_spans(xs, ranges, push_stream_filters([GreaterThanOrEqual(("txid",), 10)])[0], 100)
    assert {s.sequence for p in late for s in p if s.stream == "a/s"} == {4}    # 1 and 2 end at txid 9


def test_a_small_plan_is_not_cut_up_to_reach_min_partitions_when_asked():
    sealed = [ext("a/s", 1, 99, records=1_000)]             # 10 records per entry
    ranges = {"a/s": ((1, 0, 0), None)}
    assert len(plan_stream_spans(sealed, ranges, StreamPushdown(), 1_000, 2)) == 2
    assert len(plan_stream_spans(sealed, ranges, StreamPushdown(), 1_000, 2, split_min_records=1_001)) == 1
    assert len(plan_stream_spans(sealed, ranges, StreamPushdown(), 1_000, 2, split_min_records=1_000)) == 2
    # half the entries: half the records, counted from the metadata
    half = {"a/s": ((1, 50, 0), None)}
    assert len(plan_stream_spans(sealed, half, StreamPushdown(), 1_000, 2, split_min_records=501)) == 1
    # a segment in progress counts a record per entry; entries_per_partition still cuts
    live = [ext("a/s", 1, 99, records=None)]
    assert len(plan_stream_spans(live, ranges, StreamPushdown(), 1_000, 2, split_min_records=101)) == 1
    assert len(plan_stream_spans(live, ranges, StreamPushdown(), 40, 2, split_min_records=10**6)) == 3


def test_stream_end_offsets_and_caps():
    xs = [ext("a/s", 1, 9, records=20), ext("a/s", 3, 4, records=None)]
    assert stream_end(xs, 4) == DLSN(3, 5, 0) and stream_end(xs[:1], 2) == DLSN(2, 0, 0)
    assert stream_end([], 1) == DLSN(1, 0, 0)
    j = offsets_to_json({"a/s": DLSN(3, 5, 0)})
    assert j == {"a/s": "3/5/0"} and offsets_from_json(j) == {"a/s": DLSN(3, 5, 0)}
    for bad in ({"a/s": 3}, {"as": "1/0/0"}, {"a/s": "x"}):
        with pytest.raises(IncorrectParameterError):
            offsets_from_json(bad)
    assert cap_end(xs, (1, 0, 0), (3, 5, 0), 1_000) == (DLSN(3, 5, 0), 25)
    assert cap_end(xs, (1, 0, 0), (3, 5, 0), 20) == (DLSN(2, 0, 0), 20)   # segment 1 whole
    end, used = cap_end(xs, (1, 0, 0), (3, 5, 0), 7)                      # 2 records per entry
    assert end == DLSN(1, 3, 0) and used == 6
    assert cap_end(xs, (1, 0, 0), (3, 5, 0), 1)[0] == DLSN(1, 1, 0)       # always one entry
    assert cap_end(xs, (3, 2, 0), (3, 5, 0), 2) == (DLSN(3, 4, 0), 2)


def view(*segs: SegmentMeta) -> StreamView:
    return StreamView(StreamMeta(next_sequence=len(segs) + 1), 7, {s.sequence: (s, 2) for s in segs})


def seg(seq: int, state: SegmentState, ledger: int | None = None, tier: TierInfo | None = None) -> SegmentMeta:
    return SegmentMeta(seq, ledger if ledger is not None else 10 + seq, state, 0, 5, 3, 0, 6, tier=tier)


def test_tiering_transitions_mark_then_forget():
    v = view(seg(1, SegmentState.SEALED), seg(2, SegmentState.SEALED), seg(3, SegmentState.IN_PROGRESS))
    assert [s.sequence for s in tt.tierable(v)] == [1, 2]
    t = TierInfo("/t", 4)
    ch = tt.mark_tiered(v, {1: (11, t), 2: (99, t), 3: (13, t), 8: (18, t)})   # 2: another ledger; 3: in progress
    assert ch is not None and [(s.sequence, s.state, s.tier, s.ledger_id, ver) for s, ver in ch.update] == \
        [(1, SegmentState.TIERED, t, 11, 2)]
    assert ch.meta == v.meta and not ch.delete and not ch.released_ledgers
    assert tt.mark_tiered(v, {}) is None
    with pytest.raises(InvalidMetadataError):
        tt.mark_tiered(v, {1: (11, TierInfo("/t", -1))})
    after = view(ch.update[0][0], seg(2, SegmentState.SEALED))
    assert tt.ledgers_to_release(after) == {1: 11} and tt.mark_tiered(after, {1: (11, t)}) is None
    done = tt.forget_ledgers(after, [11])
    assert done is not None and done.update[0][0].ledger_id is None and done.update[0][0].tier == t
    assert tt.forget_ledgers(after, [12]) is None
