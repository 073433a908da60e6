"""Placement groups (DESIGN §4.10) in the pure placement policy: ensembles only from the primary
groups, the secondary ones only for what the primary cannot fill, rack and host spreading within
them, errors that name the groups, and the auditor's view of which copies are misplaced."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.errors import NotEnoughBookiesError
from ledger_client.placement import (
    NO_GROUPS,
    BookieNode,
    EnsemblePlacement,
    PlacementGroups,
    group_problems,
    misplaced,
)

pytestmark = pytest.mark.unit

GOLD = PlacementGroups.of(["gold"])
GOLD_THEN_SILVER = PlacementGroups.of(["gold"], ["silver"])


def cluster(gold: int, silver: int, bronze: int) -> list[BookieNode]:
    """Bookies on hosts of their own, each group over two racks."""
    out = []
    for group, n in (("gold", gold), ("silver", silver), ("bronze", bronze)):
        out += [BookieNode(f"{group}{i}:3181", f"/rack-{i % 2}", group) for i in range(n)]
    return out


def group_of(nodes: list[BookieNode]) -> dict[str, str]:
    return {n.bookie_id: n.group for n in nodes}


def test_new_ensembles_only_from_the_primary_groups_spread_over_racks(seed):
    nodes = cluster(4, 3, 3)
    placement = EnsemblePlacement(random.Random(seed))
    for _ in range(30):
        ens = placement.new_ensemble(3, nodes, groups=GOLD)
        assert {group_of(nodes)[b] for b in ens} == {"gold"}
        assert len({b.split(":")[0] for b in ens}) == 3
    # two racks among the gold bookies: a write set of 2 spans both
    by_id = {n.bookie_id: n for n in nodes}
    for _ in range(30):
        ens = placement.new_ensemble(2, nodes, groups=GOLD)
        assert len({by_id[b].network_location for b in ens}) == 2


def test_secondary_groups_only_fill_what_the_primary_cannot(seed):
    nodes = cluster(2, 3, 3)
    placement = EnsemblePlacement(random.Random(seed))
    for _ in range(30):
        ens = placement.new_ensemble(3, nodes, groups=GOLD_THEN_SILVER)
        groups = sorted(group_of(nodes)[b] for b in ens)
        assert groups == ["gold", "gold", "silver"]
    with pytest.raises(NotEnoughBookiesError, match="gold.*secondary silver"):
        placement.new_ensemble(6, nodes, groups=GOLD_THEN_SILVER)


def test_not_enough_bookies_names_the_groups_when_they_are_short():
    nodes = cluster(1, 3, 3)
    with pytest.raises(NotEnoughBookiesError, match=r"groups gold.*only 1 available there"):
        EnsemblePlacement(random.Random(0)).new_ensemble(3, nodes, groups=GOLD)
    with pytest.raises(NotEnoughBookiesError) as e:
        EnsemblePlacement(random.Random(0)).new_ensemble(30, nodes)
    assert "group" not in str(e.value)


def test_replacements_stay_in_the_groups(seed):
    nodes = cluster(4, 3, 0)
    placement = EnsemblePlacement(random.Random(seed))
    ens = ["gold0:3181", "gold1:3181", "gold2:3181"]
    for _ in range(20):
        new = placement.replace(ens, [1], nodes, exclude={"gold1:3181"}, groups=GOLD)
        assert new == ["gold0:3181", "gold3:3181", "gold2:3181"]
    with pytest.raises(NotEnoughBookiesError, match="gold"):
        placement.replace(ens, [0, 1], nodes, groups=GOLD)
    new, left = placement.replace_available(ens, [0, 1], nodes, groups=GOLD)
    assert left == [1] and new[0] == "gold3:3181"
    new = placement.replace(ens, [0, 1], nodes, groups=GOLD_THEN_SILVER)
    assert sorted(group_of(nodes)[b] for b in new) == ["gold", "gold", "silver"]


def test_better_than_narrows_a_secondary_move_to_the_primary():
    assert GOLD_THEN_SILVER.better_than(None) == GOLD_THEN_SILVER
    assert GOLD_THEN_SILVER.better_than(1) == GOLD
    assert NO_GROUPS.tier("whatever") == 0 and not NO_GROUPS


def test_misplaced_counts_outside_and_needless_secondary_copies():
    nodes = cluster(4, 3, 2)
    g = group_of(nodes)
    w = list(g)
    # bronze is outside gold/silver: misplaced; the silver copy too, since gold3 is spare
    frag = ["gold0:3181", "silver0:3181", "bronze0:3181"]
    assert misplaced([frag], g, w, GOLD_THEN_SILVER) == {"bronze0:3181", "silver0:3181"}
    # with no gold spare beyond the one bronze needs (gold1), silver stays (a fallback is legitimate)
    w2 = [b for b in w if b not in ("gold2:3181", "gold3:3181")]
    assert misplaced([frag], g, w2, GOLD_THEN_SILVER) == {"bronze0:3181"}
    assert misplaced([frag], g, w, NO_GROUPS) == set()
    # unknown (lost) bookies are not this check's business
    assert misplaced([["gone:1", "gold0:3181"]], g, w, GOLD) == set()


def test_group_problems_reports_empty_and_short_groups():
    nodes = cluster(2, 2, 0)
    assert group_problems(GOLD, nodes, 2) == []
    assert any("'gold' has no writable" in p for p in group_problems(GOLD, cluster(0, 3, 0), 3))
    assert any("fall back" in p for p in group_problems(GOLD_THEN_SILVER, nodes, 3))
    assert any("an ensemble needs 5" in p for p in group_problems(GOLD_THEN_SILVER, nodes, 5))
    assert group_problems(NO_GROUPS, [], 3) == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(gold=st.integers(0, 5), silver=st.integers(0, 5), bronze=st.integers(0, 5), size=st.integers(1, 5),
       rng_seed=st.integers(0, 2**32 - 1), with_secondary=st.booleans())
def test_ensembles_hold_the_groups_or_fail(gold, silver, bronze, size, rng_seed, with_secondary):
    """For any cluster: an ensemble has only allowed bookies, as many primary ones as there are
    (up to its size), distinct bookies, and NotEnoughBookiesError exactly when too few are allowed."""
    nodes = cluster(gold, silver, bronze)
    groups = GOLD_THEN_SILVER if with_secondary else GOLD
    allowed = gold + (silver if with_secondary else 0)
    try:
        ens = EnsemblePlacement(random.Random(rng_seed)).new_ensemble(size, nodes, groups=groups)
    except NotEnoughBookiesError:
        assert allowed < size
        return
    assert allowed >= size and len(set(ens)) == size
    tiers = [groups.tier(group_of(nodes)[b]) for b in ens]
    assert None not in tiers
    assert tiers.count(0) == min(gold, size)
    # what is placed by the policy is never seen as misplaced by the auditor's check
    assert misplaced([ens], group_of(nodes), group_of(nodes), groups) == set()


def test_ledger_metadata_keeps_its_groups_through_encoding():
    from metadata.model import DigestType as MdDigest
    from metadata.model import LedgerMetadata, LedgerState, decode, encode

    md = LedgerMetadata(ledger_id=7, state=LedgerState.OPEN, ensemble_size=1, write_quorum_size=1,
                        ack_quorum_size=1, last_entry_id=-1, length=0, ensembles={0: ["a:1"]},
                        digest_type=MdDigest.CRC32C, password_hash=b"x" * 20, ctime=1,
                        bookie_groups=("gold",), bookie_groups_secondary=("silver",))
    assert PlacementGroups.of_ledger(decode(encode(md), 7)) == GOLD_THEN_SILVER
    plain = dataclasses.replace(md, bookie_groups=(), bookie_groups_secondary=())
    assert PlacementGroups.of_ledger(decode(encode(plain), 7)) == NO_GROUPS


def test_spark_hosting_maps_executor_hosts_to_groups(tmp_path):
    from spark_bookie.errors import ConfigError
    from spark_bookie.hosting.config import _read_rack_map
    from spark_bookie.hosting.slots import HostingConfig

    cfg = HostingConfig(zk_connect="h:1", bookies=2, data_root="/d", group_map=(("h1", "gold"),),
                        bookie_group_template="g-{slot}").validate()
    assert cfg.bookie_group("h1", 0) == "gold" and cfg.bookie_group("h2", 1) == "g-1"
    assert HostingConfig(zk_connect="h:1", bookies=1, data_root="/d").bookie_group("h", 0) == ""
    (tmp_path / "groups").write_text("h1 gold  # the fast disks\nh2 silver\n")
    assert _read_rack_map(str(tmp_path / "groups"), "bookie group map", "group") == (("h1", "gold"), ("h2", "silver"))
    (tmp_path / "bad").write_text("h1 /rack-1\n")
    with pytest.raises(ConfigError, match="bookie group map"):
        _read_rack_map(str(tmp_path / "bad"), "bookie group map", "group")
    with pytest.raises(ConfigError, match="bookie group template"):
        HostingConfig(zk_connect="h:1", bookies=1, data_root="/d", bookie_group_template="{rack}").validate()


def test_bookie_config_takes_a_valid_group_only(tmp_path):
    from spark_bookie.errors import ConfigError
    from spark_bookie.server.config import load_config

    dirs = {"journal_dirs": ["/j"], "ledger_dirs": ["/l"]}
    (tmp_path / "b.toml").write_text('[bookie]\nbookie_group = "gold"\n')
    assert load_config(tmp_path / "b.toml", **dirs).bookie_group == "gold"
    assert load_config(tmp_path / "b.toml", bookie_group="silver", **dirs).bookie_group == "silver"
    with pytest.raises(ConfigError, match="bookie_group"):
        load_config(None, bookie_group="no spaces", **dirs)
