"""The auditor's placement-group check (DESIGN §4.10) and the worker's choice for moves, on the
in-memory metadata twin: closed ledgers whose copies sit outside their namespace's current groups
(or, outside namespaces, their recorded ones) are counted and marked with those bookies; open
ledgers are their writers' business; a fallback copy on a secondary group is moved only while a
primary bookie could take it."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from ledger_client.bookies import BookiePool
from ledger_client.placement import BookieNode, PlacementGroups
from metadata import DigestType, InMemoryMetadataStore, InMemoryZooKeeper, LedgerMetadata, LedgerState
from metadata.streams import encode_settings
from recovery import Auditor, AutoRecoveryConfig
from recovery.plan import FragmentRepair, RepairKind, misplaced_copies, move_groups

pytestmark = pytest.mark.unit

A, B, C, D, E = (f"127.0.0.1:{p}" for p in (3181, 3182, 3183, 3184, 3185))
GROUP = {A: "gold", B: "gold", C: "silver", D: "silver", E: "bronze"}


def ledger(lid: int, ensemble: list[str], *, closed: bool = True, namespace: str = "",
           groups: tuple[str, ...] = ()) -> LedgerMetadata:
    md = LedgerMetadata.new_open(lid, ensemble, write_quorum_size=2, ack_quorum_size=2,
                                 digest_type=DigestType.CRC32C, password=b"")
    md = dataclasses.replace(md, namespace=namespace, bookie_groups=groups)
    return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=9, length=100) if closed else md


def wait_until(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_auditor_counts_and_marks_ledgers_outside_their_groups():
    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as bookies, InMemoryMetadataStore(zk) as store:
        bookies.cluster.init_cluster()
        for b, g in GROUP.items():
            bookies.cluster.register_bookie(b, readonly=False, wait_ms_max=0,
                                            data=json.dumps({"id": b, "bookie_group": g}).encode())
        settings = {"bookie_groups": ["gold"], "bookie_groups_secondary": ["silver"]}
        bookies.streams.create_namespace("ns", encode_settings(settings))
        bookies.ledgers.create_ledger_metadata(ledger(1, [A, B, E], namespace="ns"))     # bronze: out
        bookies.ledgers.create_ledger_metadata(ledger(2, [A, B, C], namespace="ns"))     # silver: no gold spare
        bookies.ledgers.create_ledger_metadata(ledger(3, [C, D, E], namespace="ns", closed=False))  # open
        bookies.ledgers.create_ledger_metadata(ledger(4, [C, D, A], groups=("silver",)))  # recorded: A out
        bookies.ledgers.create_ledger_metadata(ledger(5, [A, B, C], namespace="gone", groups=("gold",)))
        cfg = AutoRecoveryConfig(check_all_ledgers_interval_ms=0, audit_interval_ms=3_600_000,
                                 placement_check_interval_ms=200)
        a = Auditor(store, cfg, BookiePool(1000, 16))  # type: ignore[arg-type]
        a.start()
        try:
            wait_until(lambda: a.stats.placement_checks >= 1, 10, "a placement check")
            assert a.stats.ledgers_not_adhering == 3
            assert store.underreplication.list_underreplicated() == {1: [E], 4: [A], 5: [C]}
            # the namespace moves to bronze: its closed ledgers all break it now, the open one not
            store.streams.write_namespace("ns", encode_settings({"bookie_groups": ["bronze"]}), -1)
            checks = a.stats.placement_checks
            wait_until(lambda: a.stats.placement_checks > checks + 1, 10, "two more checks")
            assert a.stats.ledgers_not_adhering == 4
            assert store.underreplication.list_underreplicated()[2] == sorted([A, B, C])
        finally:
            a.stop()


def test_misplaced_copies_skip_open_ledgers_and_moves_improve_the_placement():
    groups = PlacementGroups.of(["gold"], ["silver"])
    assert misplaced_copies(ledger(1, [A, C, E], closed=False), groups, GROUP, list(GROUP)) == set()
    assert misplaced_copies(ledger(1, [A, C, E]), groups, GROUP, list(GROUP)) == {E}      # one gold spare: for E
    assert misplaced_copies(ledger(1, [C, D, E]), groups, GROUP, list(GROUP)) == {C, E}   # two: E and one silver
    alive = [BookieNode(b, "", g) for b, g in GROUP.items()]

    def repair(*replaced: str) -> FragmentRepair:
        ens = (A, C, E)
        return FragmentRepair(0, 9, ens, tuple(ens.index(b) for b in replaced), RepairKind.COPY)

    assert move_groups(groups, repair(E), alive) == groups                  # out: anywhere in the groups
    assert move_groups(groups, repair(C), alive) == PlacementGroups(("gold",))   # secondary: primary only
    assert move_groups(groups, repair(A), alive) is None                    # a plain repair
    assert move_groups(groups, repair(E), [n for n in alive if n.bookie_id != E]) is None   # lost, not moved
    assert move_groups(PlacementGroups(), repair(E), alive) is None
