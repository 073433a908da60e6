"""Re-replication's pure decisions: which fragments need what, copy plans, the CAS transition,
the auditor's index, sampling, placement checks, the lost-bookie delay, and the configuration."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ledger_client.errors import NotEnoughBookiesError
from ledger_client.machines import write_set
from ledger_client.placement import BookieNode, EnsemblePlacement
from metadata import DigestType, InvalidMetadataError, LedgerMetadata, LedgerState
from recovery import AutoRecoveryConfig, LostBookieTracker, RecoveryConfigError, load_autorecovery_config
from recovery.errors import FragmentUnrecoverableError, OpenFragmentError
from recovery.plan import (
    RepairKind,
    build_index,
    checkable_fragments,
    choose_replacements,
    copy_entry_count,
    copy_runs,
    names_any,
    placement_violations,
    plan_repair,
    positions_entries,
    replace_in_fragment,
    sample_entries,
)

pytestmark = pytest.mark.unit

A, B, C, D, E, F = (f"10.0.0.{i}:3181" for i in range(1, 7))


def ledger(ensembles: dict[int, list[str]], *, e: int = 3, qw: int = 2, qa: int = 2, closed_at: int | None = None,
           lid: int = 7) -> LedgerMetadata:
    md = LedgerMetadata.new_open(lid, ensembles[0], write_quorum_size=qw, ack_quorum_size=qa,
                                 digest_type=DigestType.CRC32C, password=b"")
    md = dataclasses.replace(md, ensemble_size=e, ensembles=ensembles)
    if closed_at is not None:
        md = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=closed_at, length=10 * (closed_at + 1))
    return md


# ---------------------------------------------------------------------- plan_repair


def test_closed_ledger_fragments_naming_the_bookie_are_copied():
    md = ledger({0: [A, B, C], 10: [A, D, C], 20: [E, D, F]}, closed_at=25)
    plan = plan_repair(md, {C})
    assert [(r.first_entry_id, r.last_entry_id, r.positions, r.kind) for r in plan] == [
        (0, 9, (2,), RepairKind.COPY), (10, 19, (2,), RepairKind.COPY)]
    assert plan[0].replaced == (C,)
    assert plan_repair(md, {B}) == plan_repair(md, {B, "nobody:1"})
    assert plan_repair(md, {"nobody:1"}) == []


def test_open_ledger_last_fragment_waits_for_fencing_but_earlier_ones_are_copied():
    md = ledger({0: [A, B, C], 10: [A, B, D]})
    plan = plan_repair(md, {A})
    assert [(r.first_entry_id, r.last_entry_id, r.kind) for r in plan] == [
        (0, 9, RepairKind.COPY), (10, -1, RepairKind.OPEN_LAST)]
    in_recovery = dataclasses.replace(md, state=LedgerState.IN_RECOVERY)
    assert plan_repair(in_recovery, {D})[0].kind is RepairKind.OPEN_LAST


def test_empty_trailing_fragment_of_a_closed_ledger_needs_metadata_only():
    md = ledger({0: [A, B, C], 10: [A, B, D]}, closed_at=9)   # closed before entry 10 was written
    kinds = {r.first_entry_id: r.kind for r in plan_repair(md, {A})}
    assert kinds == {0: RepairKind.COPY, 10: RepairKind.METADATA_ONLY}
    empty = ledger({0: [A, B, C]}, closed_at=-1)
    assert [r.kind for r in plan_repair(empty, {A})] == [RepairKind.METADATA_ONLY]


def test_names_any_and_index():
    one = ledger({0: [A, B, C], 5: [A, B, D]}, lid=1, closed_at=8)
    two = ledger({0: [B, C, E]}, lid=2, closed_at=3)
    assert names_any(one, {D}) and not names_any(two, {D, A})
    assert build_index([one, two]) == {A: {1}, B: {1, 2}, C: {1, 2}, D: {1}, E: {2}}


# ---------------------------------------------------------------------- replacements and copy runs


def test_replacement_avoids_missing_and_current_bookies_and_spreads_locations(seed):
    md = ledger({0: [A, B, C]}, closed_at=9)
    repair = plan_repair(md, {C})[0]
    nodes = [BookieNode(A, "/r1"), BookieNode(B, "/r2"), BookieNode(D, "/r1"), BookieNode(E, "/r3")]
    for _ in range(20):
        new = choose_replacements(EnsemblePlacement(random.Random(seed)), repair, nodes, {C})
        assert new == {2: E}   # D shares A's rack; E is a fresh location
        seed += 1
    with pytest.raises(NotEnoughBookiesError):
        choose_replacements(EnsemblePlacement(), repair, nodes[:2], {C})


def test_copy_runs_e_equals_qw_are_ranges_rotating_over_sources():
    md = ledger({0: [A, B, C]}, qw=3, closed_at=9)
    repair = plan_repair(md, {B})[0]
    runs = copy_runs(md, repair, {1: D}, reachable={A, C}, max_entries=4)
    assert [(r.first, r.last, r.targets) for r in runs] == [(0, 3, (D,)), (4, 7, (D,)), (8, 9, (D,))]
    assert [r.sources[0] for r in runs] == [A, C, A]        # read load spread over both survivors
    assert all(set(r.sources) == {A, C} for r in runs)


def test_copy_runs_e3_qw2_copy_exactly_the_entries_the_lost_bookie_stored_one_read_per_source():
    md = ledger({0: [A, B, C]}, closed_at=11)
    repair = plan_repair(md, {B})[0]
    runs = copy_runs(md, repair, {1: D}, reachable={A, C}, max_entries=100)
    copied = [e for r in runs for e in r.entry_ids]
    assert sorted(copied) == [e for e in range(12) if 1 in write_set(e, 3, 2)]
    assert len(runs) == 2                 # striped entries, not consecutive: one listed read per survivor
    for r in runs:   # the source is the other bookie of each entry's write set
        assert list(r.entry_ids) == sorted(r.entry_ids)
        for e in r.entry_ids:
            assert r.sources == tuple({[A, B, C][p] for p in write_set(e, 3, 2)} - {B}) and r.targets == (D,)
    assert copy_entry_count(md, B) == len(copied) == 8
    small = copy_runs(md, repair, {1: D}, reachable={A, C}, max_entries=3)
    assert max(r.entries for r in small) == 3 and sorted(e for r in small for e in r.entry_ids) == sorted(copied)


def test_copy_runs_fill_in_place_copies_only_the_entries_a_position_lacks():
    """`only`: a bookie filled in place gets what it lacks (a gap in the middle included); a
    position not named in it gets its whole share."""
    md = ledger({0: [A, B, C]}, qw=3, closed_at=99)
    repair = dataclasses.replace(plan_repair(md, {B, C})[0], positions=(1, 2))
    runs = copy_runs(md, repair, {1: B, 2: C}, reachable={A}, max_entries=1000, only={1: set(range(40, 60))})
    to_b = sorted(e for r in runs for e in r.entry_ids if B in r.targets)
    to_c = sorted(e for r in runs for e in r.entry_ids if C in r.targets)
    assert to_b == list(range(40, 60)) and to_c == list(range(100))
    assert copy_runs(md, repair, {1: B, 2: C}, reachable={A}, max_entries=1000, only={1: set(), 2: set()}) == []
    # every bookie of the write sets lacks a different entry: each entry is read from those holding it
    every = dataclasses.replace(plan_repair(md, {A, B, C})[0], positions=(0, 1, 2))
    runs = copy_runs(md, every, {0: A, 1: B, 2: C}, reachable=set(), max_entries=1000, only={0: {5}, 1: {7}, 2: {9}})
    assert sorted((e, r.targets, set(r.sources)) for r in runs for e in r.entry_ids) == [
        (5, (A,), {B, C}), (7, (B,), {A, C}), (9, (C,), {A, B})]


def test_copy_runs_prefer_reachable_sources_and_fail_without_any():
    md = ledger({0: [A, B, C]}, qw=3, closed_at=1)
    runs = copy_runs(md, plan_repair(md, {B})[0], {1: D}, reachable={C}, max_entries=10)
    assert runs[0].sources == (C, A)   # A is not reachable: asked last
    md2 = ledger({0: [A, B, C]}, closed_at=5)
    with pytest.raises(FragmentUnrecoverableError, match="no copy survives"):
        copy_runs(md2, plan_repair(md2, {A, B})[0], {0: D, 1: E}, reachable={C}, max_entries=10)


def test_a_live_bookie_being_replaced_is_the_last_resort_source():
    md = ledger({0: [A, B, C]}, closed_at=5)      # C is dead; B is being decommissioned but still up
    runs = copy_runs(md, plan_repair(md, {B, C})[0], {1: D, 2: E}, reachable={A, B}, max_entries=10)
    by_entry = {e: r for r in runs for e in r.entry_ids}
    assert by_entry[1].sources == (B,)          # entry 1 lives on B and C only: B is all there is
    assert by_entry[0].sources == (A, B)        # entry 0 on A and B: A first, B as a fallback


def test_two_replaced_bookies_of_one_fragment_each_get_their_entries():
    md = ledger({0: [A, B, C, D]}, e=4, qw=3, closed_at=7)
    repair = plan_repair(md, {A, C})[0]
    runs = copy_runs(md, repair, {0: E, 2: F}, reachable={B, D}, max_entries=10)
    want = {}
    for e in range(8):
        ws = write_set(e, 4, 3)
        targets = tuple(x for p, x in ((0, E), (2, F)) if p in ws)
        want[e] = tuple(sorted(t for t in targets))
    got = {e: tuple(sorted(r.targets)) for r in runs for e in r.entry_ids}
    assert got == want


# ---------------------------------------------------------------------- the transition


def test_replace_in_fragment_is_idempotent_and_leaves_other_fragments_alone():
    md = ledger({0: [A, B, C], 10: [A, D, C]}, closed_at=15)
    new = replace_in_fragment(md, 0, {C: E})
    assert new.ensembles == {0: [A, B, E], 10: [A, D, C]}
    assert replace_in_fragment(new, 0, {C: E}) == new
    with pytest.raises(InvalidMetadataError):
        replace_in_fragment(new, 0, {C: F})   # someone else put E there: not ours to decide


def test_replace_in_fragment_refuses_the_last_fragment_of_an_unclosed_ledger():
    md = ledger({0: [A, B, C], 10: [A, D, C]})
    assert replace_in_fragment(md, 0, {B: E}).ensembles[0] == [A, E, C]
    with pytest.raises(OpenFragmentError):
        replace_in_fragment(md, 10, {D: E})
    closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=12, length=130)
    assert replace_in_fragment(closed, 10, {D: E}).ensembles[10] == [A, E, C]


# ---------------------------------------------------------------------- checker views


def test_positions_entries_and_sampling(seed):
    md = ledger({0: [A, B, C]}, closed_at=99)
    assert list(positions_entries(md, 0, 8, 0)) == [e for e in range(9) if 0 in write_set(e, 3, 2)]
    rng = random.Random(seed)
    assert sample_entries(md, 0, 99, 1, 0.0, rng) == [0, 99]   # first and last stored by position 1
    everything = sample_entries(md, 0, 99, 1, 1.0, rng)
    assert everything == list(positions_entries(md, 0, 99, 1))
    some = sample_entries(md, 0, 99, 1, 0.3, rng)
    assert some[0] == 0 and some[-1] == 99 and set(some) <= set(everything)
    assert sample_entries(md, 3, 3, 2, 0.0, rng) == []    # entry 3 lives on positions 0 and 1
    assert sample_entries(md, 5, 5, 2, 0.0, rng) == [5]


def test_checkable_fragments_skip_open_and_empty_ones():
    md = ledger({0: [A, B, C], 10: [A, B, D]})
    assert [f[0] for f in checkable_fragments(md)] == [0]
    closed = ledger({0: [A, B, C], 10: [A, B, D]}, closed_at=9)
    assert [f[0] for f in checkable_fragments(closed)] == [0]


def test_placement_violations_follow_min_locations_per_write_quorum():
    md = ledger({0: [A, B, C], 10: [A, D, E]}, closed_at=20)
    racks = {A: "/r1", B: "/r1", C: "/r2", D: "/r2", E: "/r3"}
    bad = placement_violations(md, racks, 2)
    assert [k for k, _why in bad] == [0]          # write set {A, B} sits in one rack
    assert placement_violations(md, {b: "" for b in racks}, 2) == []   # no locations known: nothing to check
    assert placement_violations(md, {A: "/r1", B: "/r1", C: "/r1", D: "/r1"}, 2) == []   # one location only


# ---------------------------------------------------------------------- the lost-bookie delay


def test_lost_bookie_waits_for_the_delay_and_coming_back_cancels_it():
    t = LostBookieTracker()
    t.observe({A, B, C}, now=0.0)
    t.observe({A, B}, now=10.0)
    assert t.due(30, now=39.0) == set() and t.next_due_at(30) == 40.0
    assert t.due(30, now=40.0) == {C}
    t.observe({A, B, C}, now=41.0)           # back before anyone marked it
    assert t.due(30, now=100.0) == set() and t.pending == {}


def test_second_lost_bookie_means_no_waiting_and_zero_delay_is_immediate():
    t = LostBookieTracker()
    t.observe({A, B, C, D}, now=0.0)
    t.observe({A, B, C}, now=1.0)
    assert t.due(60, now=2.0) == set()
    t.observe({A, B}, now=3.0)
    assert t.due(60, now=3.0) == {C, D}
    t2 = LostBookieTracker()
    t2.observe({A, B}, now=0.0)
    t2.observe({A}, now=1.0)
    assert t2.due(0, now=1.0) == {B}


def test_read_only_bookies_count_as_available_and_named_bookies_are_known():
    t = LostBookieTracker()
    t.observe({A, B}, now=0.0, named={A, B, C})   # C is named by ledgers but was never seen: lost from now
    assert t.pending == {C: 0.0}
    t.mark_audited({C})
    t.observe({A, B}, now=5.0, named={C})
    assert t.pending == {} and t.audited == {C}   # audited bookies are not delayed again
    t.observe({A, B, C}, now=6.0)
    assert t.audited == set()
    t.forget({C})
    assert C not in t.known


def test_delay_change_restarts_the_wait_and_resetting_it_audits_now():
    t = LostBookieTracker()
    t.observe({A, B}, now=0.0)
    t.observe({A}, now=1.0)
    assert t.delay_changed(100, 30, now=20.0) is False and t.pending == {B: 20.0}
    assert t.delay_changed(100, 100, now=21.0) is True     # BookKeeper's triggerAudit
    assert t.delay_changed(0, 100, now=21.0) is True


# ---------------------------------------------------------------------- configuration


def test_config_validates_and_loads(tmp_path):
    assert AutoRecoveryConfig().lost_bookie_recovery_delay_s is None
    with pytest.raises(RecoveryConfigError, match="must not be negative"):
        AutoRecoveryConfig(worker_backoff_ms=-1)
    with pytest.raises(RecoveryConfigError, match="sample_fraction"):
        AutoRecoveryConfig(check_entry_sample_fraction=1.5)
    with pytest.raises(RecoveryConfigError, match="at least 1"):
        AutoRecoveryConfig(worker_ledgers_in_flight_max=0)
    f = tmp_path / "ar.toml"
    f.write_text("[autorecovery]\nopen_ledger_rereplication_grace_ms = 500\nlost_bookie_recovery_delay_s = 2\n")
    cfg = load_autorecovery_config(f, worker_backoff_ms=50)
    assert (cfg.open_ledger_rereplication_grace_ms, cfg.lost_bookie_recovery_delay_s, cfg.worker_backoff_ms) == (
        500, 2, 50)
    f.write_text("[autorecovery]\nno_such_key = 1\n")
    with pytest.raises(RecoveryConfigError, match="no_such_key"):
        load_autorecovery_config(f)
    with pytest.raises(RecoveryConfigError, match="does not exist"):
        load_autorecovery_config(tmp_path / "missing.toml")


def test_every_config_key_is_documented_in_conf():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "conf" / "autorecovery.toml").read_text()
    for f in dataclasses.fields(AutoRecoveryConfig):
        assert f"\n{f.name} = " in doc or f"\n# {f.name} = " in doc, f"{f.name} is not documented"
