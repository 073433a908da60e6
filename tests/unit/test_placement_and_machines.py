"""Pure protocol pieces: placement, write sets, quorum coverage, recovery read decisions, AddState."""

from __future__ import annotations

import random

import pytest

from ledger_client.errors import NotEnoughBookiesError
from ledger_client.machines import AddState, QuorumCoverage, ReadOutcome, RecoveryReadTally, write_set
from ledger_client.machines.recovery import fence_start_point
from ledger_client.placement import BookieNode, EnsemblePlacement

pytestmark = pytest.mark.unit


def test_placement_spreads_over_racks_then_hosts(seed):
    rng = random.Random(seed)
    nodes = [BookieNode(f"h{h}:{p}", f"/rack-{h % 3}") for h in range(6) for p in (3181, 3182)]
    placement = EnsemblePlacement(rng)
    for _ in range(50):
        ens = placement.new_ensemble(3, nodes)
        by_id = {n.bookie_id: n for n in nodes}
        assert len({by_id[b].network_location for b in ens}) == 3   # one per rack
        assert len({b.split(":")[0] for b in ens}) == 3              # never two on one host
    # Without locations, still never two replicas on one host while hosts suffice.
    flat = [BookieNode(f"h{h}:{p}") for h in range(3) for p in (1, 2, 3)]
    for _ in range(50):
        assert len({b.split(":")[0] for b in placement.new_ensemble(3, flat)}) == 3


def test_placement_replace_and_not_enough():
    placement = EnsemblePlacement(random.Random(1))
    nodes = [BookieNode(f"b{i}:1") for i in range(4)]
    ens = ["b0:1", "b1:1", "b2:1"]
    new = placement.replace(ens, [1], nodes, exclude={"b1:1"})
    assert new == ["b0:1", "b3:1", "b2:1"]
    with pytest.raises(NotEnoughBookiesError):
        placement.replace(new, [0], nodes, exclude={"b0:1", "b1:1"})
    with pytest.raises(NotEnoughBookiesError):
        placement.new_ensemble(5, nodes)


def test_write_sets_stripe_round_robin():
    assert write_set(0, 5, 3) == [0, 1, 2]
    assert write_set(4, 5, 3) == [4, 0, 1]
    counts = [0] * 5
    for e in range(100):
        for i in write_set(e, 5, 2):
            counts[i] += 1
    assert counts == [40] * 5


def test_quorum_coverage_needs_fewer_than_qa_unknown_in_every_write_set():
    cov = QuorumCoverage(3, 3, 2)        # one write set: all three bookies
    assert not cov.add(0)                # two unknown >= Qa
    assert cov.add(1)                    # one unknown < Qa
    cov = QuorumCoverage(5, 3, 2)
    for i in (0, 2, 4):
        cov.add(i)
    assert not cov.covered()             # window {1, 2, 3} still has two unknowns
    cov.add(3)
    assert cov.covered()                 # only bookie 1 unknown: one per window
    cov = QuorumCoverage(5, 3, 2)
    for i in (0, 1, 2):
        cov.add(i)
    assert not cov.covered()             # window {3, 4, 0} has two unknowns


def test_recovery_read_tally_rules():
    t = RecoveryReadTally(7, 3, 3, 2)    # absent needs Qw - Qa + 1 = 2 NO_ENTRY
    assert t.on_absent(1) is ReadOutcome.PENDING
    assert t.on_absent(2) is ReadOutcome.ABSENT
    t = RecoveryReadTally(7, 3, 3, 2)
    assert t.on_absent(1) is ReadOutcome.PENDING
    assert t.on_found(2) is ReadOutcome.FOUND        # generous on positive answers
    t = RecoveryReadTally(7, 3, 3, 2)
    t.on_error(0)
    t.on_error(1)
    assert t.on_absent(2) is ReadOutcome.UNKNOWN     # strict on negative: never guess
    assert fence_start_point(10, [3, 5]) == 9        # never below the last fragment - 1
    assert fence_start_point(0, [12]) == 12


def test_add_state_ensemble_change_resends_and_holds_completions():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    e0, _, bookies = s.append(10)
    assert set(bookies) == {"a", "b", "c"}
    assert [c.entry_id for c in s.on_ack(e0, "a") + s.on_ack(e0, "b")] == [0]
    e1, _, _ = s.append(10)
    s.on_ack(e1, "a")
    assert s.on_bookie_failure("b")
    assert s.on_ack(e1, "c") == []                   # no completion during the change
    key, idx = s.change_plan()
    assert (key, idx) == (1, [1])
    resends, done = s.apply_change(key, ["a", "d", "c"])
    assert [(r.entry_id, r.bookie) for r in resends] == [(1, "d")]
    assert [c.entry_id for c in done] == [1]          # a and c acked: complete once the change ends
    assert s.ensembles == {0: ["a", "b", "c"], 1: ["a", "d", "c"]} and s.lac == 1
    assert s.on_ack(1, "b") == []                     # a late ack from the replaced bookie is ignored


def test_add_state_replaces_an_empty_last_fragment():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    s.append(1)
    assert s.on_bookie_failure("a")
    key, _ = s.change_plan()
    assert key == 0
    resends, _ = s.apply_change(0, ["x", "b", "c"])
    assert s.ensembles == {0: ["x", "b", "c"]} and [r.bookie for r in resends] == ["x"]
