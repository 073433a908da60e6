"""StripedRead: the pure plan of reading a striped fragment with listed reads (machines/read_plan.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.machines import write_set
from ledger_client.machines.read_plan import Ask, Miss, StripedRead

pytestmark = pytest.mark.unit


def test_one_listed_read_per_bookie_and_chunk_spread_evenly():
    plan = StripedRead(0, 3999, 5, 2, chunk_entries=2_000)
    asks = plan.initial()
    # 4,000 entries on five bookies: 800 per bookie, one listed read each (a read holds up to 2,000).
    assert len(asks) == 5
    per_bookie = Counter()
    for a in asks:
        assert list(a.entry_ids) == sorted(a.entry_ids)
        for e in a.entry_ids:
            assert a.index in write_set(e, 5, 2)
        per_bookie[a.index] += len(a.entry_ids)
    assert sum(per_bookie.values()) == 4000
    assert set(per_bookie.values()) == {800}


def test_rotation_moves_the_first_replica():
    a = {e: ask.index for ask in StripedRead(0, 9, 3, 2, rotation=0).initial() for e in ask.entry_ids}
    b = {e: ask.index for ask in StripedRead(0, 9, 3, 2, rotation=1).initial() for e in ask.entry_ids}
    assert all(a[e] != b[e] for e in range(10))


def _answer_all(plan: StripedRead, asks: list[Ask]) -> None:
    todo = list(asks)
    while todo:
        ask = todo.pop(0)
        todo += plan.on_answer(ask, list(ask.entry_ids), [True] * len(ask.entry_ids))


def test_cut_answer_is_asked_again_of_the_same_bookie():
    plan = StripedRead(0, 19, 4, 2)
    ask = next(a for a in plan.initial() if a.index == 0)
    half = list(ask.entry_ids[:2])
    again = plan.on_answer(ask, half, [True, True])
    assert again == [Ask(0, ask.entry_ids[2:])]


def test_gap_goes_to_the_next_replica_and_corrupt_copy_too():
    plan = StripedRead(0, 23, 4, 3, chunk_entries=100)
    asks = plan.initial()
    ask = asks[0]
    ids = list(ask.entry_ids)
    # The bookie lacks ids[1] (left out below the last returned) and ids[2] is corrupt.
    returned = [ids[0], ids[2], ids[3]]
    nxt = plan.on_answer(ask, returned, [True, False, True])
    same = sorted(e for a in nxt if a.index == ask.index for e in a.entry_ids)
    assert same == ids[4:]             # cut after the last returned one: asked again, same bookie
    moved = sorted(e for a in nxt if a.index != ask.index for e in a.entry_ids)
    assert moved == [ids[1], ids[2]]
    for a in nxt:
        for e in a.entry_ids:
            if e in (ids[1], ids[2]):
                assert a.index != ask.index and a.index in write_set(e, 4, 3)


def test_entry_fails_after_every_replica_and_reports_why():
    plan = StripedRead(0, 0, 3, 2)
    (ask,) = plan.initial()
    (second,) = plan.on_failure(ask, Miss.ERROR)
    assert second.index != ask.index
    assert plan.on_answer(second, [], []) == []
    assert plan.finished and plan.failed == {0: [Miss.ERROR, Miss.ABSENT]}


def test_speculation_does_not_count_as_a_miss_and_first_answer_wins():
    plan = StripedRead(0, 3, 3, 3)
    asks = plan.initial()
    spec = [s for a in asks for s in plan.speculate(a)]
    assert sorted(e for s in spec for e in s.entry_ids) == [0, 1, 2, 3]
    _answer_all(plan, spec)
    assert plan.finished and not plan.failed
    # The slow originals answer late (or fail): nothing more is asked, nothing fails.
    for a in asks:
        assert plan.on_failure(a, Miss.ERROR) == []
    assert plan.finished and not plan.failed


def test_failed_entry_waits_for_a_speculated_read_in_flight():
    plan = StripedRead(0, 0, 2, 2)
    (ask,) = plan.initial()
    (spec,) = plan.speculate(ask)
    assert plan.on_failure(ask, Miss.ERROR) == []
    assert not plan.finished           # the speculated read may still bring it
    plan.on_answer(spec, [0], [True])
    assert plan.finished and not plan.failed


def test_bad_arguments():
    for args in ((5, 4, 3, 2), (-1, 3, 3, 2), (0, 3, 2, 3), (0, 3, 3, 0)):
        with pytest.raises(ValueError):
            StripedRead(*args)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 40), st.integers(1, 30), st.integers(1, 7),
       st.integers(0, 2**32))
def test_random_answers_end_with_each_entry_read_once_or_failed_for_a_reason(e_size, qw, n, first, chunk, seed):
    """Whatever each bookie holds, however answers are cut, fail or come late: the plan finishes,
    every entry held by some replica with a good copy is read, and an entry fails only when every
    replica of its write set was asked and none could give it."""
    qw = min(qw, e_size)
    rng = random.Random(seed)
    last = first + n
    holds = {(b, e): rng.random() < 0.8 for b in range(e_size) for e in range(first, last + 1)}
    good = {(b, e): rng.random() < 0.9 for b in range(e_size) for e in range(first, last + 1)}
    down = {b for b in range(e_size) if rng.random() < 0.2}
    plan = StripedRead(first, last, e_size, qw, rotation=rng.randrange(5), chunk_entries=chunk)
    todo = plan.initial()
    read: set[int] = set()
    steps = 0
    while todo:
        steps += 1
        assert steps < 10_000, "the plan does not converge"
        ask = todo.pop(rng.randrange(len(todo)))
        for e in ask.entry_ids:
            assert ask.index in write_set(e, e_size, qw)
        if rng.random() < 0.1 and not plan.finished:
            todo += plan.speculate(ask)
        if ask.index in down:
            todo += plan.on_failure(ask, Miss.ERROR)
            continue
        held = [e for e in ask.entry_ids if holds[(ask.index, e)]]
        cut = held[:rng.randrange(1, len(held) + 1)] if held else []
        flags = [good[(ask.index, e)] for e in cut]
        read |= {e for e, ok in zip(cut, flags, strict=True) if ok}
        todo += plan.on_answer(ask, cut, flags)
    assert plan.finished
    readable = {e for e in range(first, last + 1)
                if any(holds[(b, e)] and good[(b, e)] and b not in down for b in write_set(e, e_size, qw))}
    assert readable <= read
    assert set(plan.failed) == set(range(first, last + 1)) - read
    for e in plan.failed:
        assert sorted(plan.replicas_asked(e)) == sorted(write_set(e, e_size, qw))
