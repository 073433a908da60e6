"""The ledger source's pure rules: options, pushdown, partition planning, stream offsets."""

from __future__ import annotations

import pickle
import random

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from jobs.ledger_planning import (
    IdRange,
    LedgerExtent,
    Pushdown,
    Span,
    advance_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_spans,
    push_filters,
    stream_spans,
)
from jobs.options import SourceOptions
from ledger_client.errors import IncorrectParameterError

pytestmark = pytest.mark.unit


def _entries(parts: list[tuple[Span, ...]]) -> list[tuple[int, int]]:
    return [(s.ledger_id, e) for p in parts for s in p for e in range(s.first, s.last + 1)]


def test_options_parse_and_reject_bad_input():
    o = SourceOptions.parse({"zk": "h:1/l", "ledgers": "3, 1,3", "password": "pw", "metadata.app": "x",
                             "metadata": '{"Team": "a"}', "decode": "JSON", "schema": "a INT",
                             "entries_per_partition": "10"}, env={})
    assert (o.zk, o.ledgers, o.password, o.decode, o.entries_per_partition) == ("h:1/l", (3, 1), b"pw", "json", 10)
    assert o.schema_ddl() == "ledger_id BIGINT, entry_id BIGINT, payload STRUCT<a INT>"
    assert o.admits_metadata({"App": b"x", "Team": b"a"})
    assert not o.admits_metadata({"app": b"x", "team": b"a"})   # JSON keys are exact
    assert not o.admits_metadata({"App": b"y", "Team": b"a"})
    assert SourceOptions.parse({}, env={"SPARK_BOOKIE_ZK": "z:2"}).zk == "z:2"
    assert SourceOptions.parse({"zk": "z", "decode": "utf8"}, env={}).payload_ddl() == "STRING"
    for bad in ({}, {"zk": "z", "ledgers": "1,x"}, {"zk": "z", "ledgers": " , "}, {"zk": "z", "decode": "csv"},
                {"zk": "z", "decode": "json"}, {"zk": "z", "entries_per_partition": "0"},
                {"zk": "z", "metadata": "[1]"}, {"zk": "z", "startingOffsets": "never"}):
        with pytest.raises(IncorrectParameterError):
            SourceOptions.parse(bad, env={})


def test_push_filters_keeps_what_it_cannot_apply_exactly():
    fs = [EqualTo(("ledger_id",), 3), GreaterThanOrEqual(("entry_id",), 10), LessThan(("entry_id",), 20),
          In(("entry_id",), (12, 13, 50)), Not(EqualTo(("entry_id",), 5)), GreaterThan(("payload",), 1),
          LessThanOrEqual(("entry_id",), 2.5), StringStartsWith(("ledger_id",), "1"), EqualTo(("ledger_id",), True)]
    pd, rest = push_filters(fs)
    assert rest == fs[4:]
    assert pd.ledger.admits(3) and not pd.ledger.admits(4)
    assert pd.entry.intervals(0, 100) == [(12, 13)]


def test_id_range_intervals_merge_consecutive_values():
    r = IdRange(values=frozenset({1, 2, 3, 7, 9, 10}))
    assert r.intervals(0, 100) == [(1, 3), (7, 7), (9, 10)]
    assert r.intervals(2, 9) == [(2, 3), (7, 7), (9, 9)]
    assert IdRange(lo=5, hi=4).intervals(0, 10) == []


def test_plan_covers_exactly_the_wanted_entries(seed):
    rng = random.Random(seed)
    for _ in range(200):
        extents = []
        for lid in rng.sample(range(1, 30), rng.randrange(0, 6)):
            last = rng.randrange(-1, 60)
            starts = (0, *sorted(rng.sample(range(1, 70), rng.randrange(0, 3))))
            extents.append(LedgerExtent(lid, last, starts, rng.random() < 0.8))
        pd = Pushdown()
        if rng.random() < 0.5:
            pd = Pushdown(entry=IdRange(lo=rng.randrange(0, 20), hi=rng.randrange(10, 70)))
        if rng.random() < 0.3:
            pd = Pushdown(ledger=IdRange(values=frozenset(rng.sample(range(1, 30), 5))), entry=pd.entry)
        size, minp = rng.randrange(1, 50), rng.randrange(1, 5)
        parts = plan_spans(extents, pd, size, minp)
        want = [(x.ledger_id, e) for x in sorted(extents, key=lambda x: x.ledger_id)
                if pd.ledger.admits(x.ledger_id) for e in range(x.last_entry_id + 1) if pd.entry.admits(e)]
        assert _entries(parts) == want
        for p in parts:
            assert 0 < sum(s.entries for s in p) <= size
            for s in p:   # a span never crosses a fragment boundary
                x = next(x for x in extents if x.ledger_id == s.ledger_id)
                assert not any(s.first < k <= s.last for k in x.fragment_starts)
                assert s.closed == x.closed


def test_plan_sizes_partitions_for_parallelism_and_packs_small_ledgers():
    one = [LedgerExtent(1, 999)]
    assert len(plan_spans(one, Pushdown(), 100)) == 10
    assert len(plan_spans(one, Pushdown(), 100_000, min_partitions=4)) == 4
    tiny = [LedgerExtent(i, 4) for i in range(1, 101)]          # 100 ledgers of 5 entries
    parts = plan_spans(tiny, Pushdown(), 100)
    assert len(parts) == 5 and all(len(p) == 20 for p in parts)
    assert plan_spans([LedgerExtent(1, -1)], Pushdown(), 10) == []


def test_stream_offsets_advance_never_back_and_respect_a_limit():
    assert offsets_from_json(offsets_to_json({3: 5, 12: 0})) == {3: 5, 12: 0}
    with pytest.raises(IncorrectParameterError):
        offsets_from_json({"x": 1})
    start = {1: 10, 2: 4}
    ends = {1: 15, 2: 3, 7: 6}              # ledger 2 reports less than already read: keep 4
    assert advance_offsets(start, ends) == {1: 15, 2: 4, 7: 6}
    assert advance_offsets(start, ends, limit_entries=8) == {1: 15, 2: 4, 7: 3}
    parts = stream_spans({1: 10, 2: 4}, {1: 15, 2: 4, 7: 6}, entries_per_partition=4)
    assert [(s.ledger_id, s.first, s.last) for p in parts for s in p] == [(1, 10, 13), (1, 14, 14), (7, 0, 3),
                                                                          (7, 4, 5)]


def test_partitions_survive_pickling_to_executors():
    from jobs.ledger_read import LedgerPartition

    parts = plan_spans([LedgerExtent(4, 99, (0, 50), False), LedgerExtent(9, 9)], Pushdown(), 40)
    for p in parts:
        back = pickle.loads(pickle.dumps(LedgerPartition(p)))
        assert isinstance(back, LedgerPartition) and back.spans == p
    assert [(s.ledger_id, s.first, s.last, s.closed) for p in parts for s in p] == [
        (4, 0, 39, False), (4, 40, 49, False), (4, 50, 89, False), (4, 90, 99, False), (9, 0, 9, True)]
    assert len(parts) == 4   # the last two spans share a task
