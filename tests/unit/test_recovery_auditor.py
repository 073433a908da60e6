"""The auditor and the AutoRecovery facade on the in-memory metadata twin (no bookie processes:
registrations are made directly, so these run in seconds; the same behaviour against real
ZooKeeper and real bookies is in tests/integration/test_autorecovery*.py)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from ledger_client.bookies import BookiePool
from metadata import DigestType, InMemoryMetadataStore, InMemoryZooKeeper, LedgerMetadata, LedgerState
from recovery import Auditor, AutoRecovery, AutoRecoveryConfig

pytestmark = pytest.mark.unit

A, B, C, D, E = (f"127.0.0.1:{p}" for p in (3181, 3182, 3183, 3184, 3185))
QUIET = dict(check_all_ledgers_interval_ms=0, placement_check_interval_ms=0, audit_interval_ms=3_600_000)


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def closed_ledger(lid: int, ensemble: list[str]) -> LedgerMetadata:
    md = LedgerMetadata.new_open(lid, ensemble, write_quorum_size=2, ack_quorum_size=2,
                                 digest_type=DigestType.CRC32C, password=b"")
    return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=9, length=100)


@pytest.fixture
def cluster() -> Iterator[tuple[InMemoryMetadataStore, InMemoryMetadataStore]]:
    """(bookies' store, auditor's store) on one in-memory ensemble; A..E registered; 3 ledgers."""
    zk = InMemoryZooKeeper()
    bookies, auditor = InMemoryMetadataStore(zk), InMemoryMetadataStore(zk)
    bookies.cluster.init_cluster()
    for b in (A, B, C, D, E):
        bookies.cluster.register_bookie(b, readonly=False, wait_ms_max=0)
    for lid, ens in ((1, [A, B, C]), (2, [B, C, D]), (3, [C, D, E])):
        bookies.ledgers.create_ledger_metadata(closed_ledger(lid, ens))
    yield bookies, auditor
    auditor.close()
    bookies.close()


def start_auditor(store: InMemoryMetadataStore, **cfg: object) -> Auditor:
    a = Auditor(store, AutoRecoveryConfig(**{**QUIET, **cfg}), BookiePool(1000, 16))  # type: ignore[arg-type]
    a.start()
    wait_until(lambda: a.stats.audits >= 1, 10, "the first audit")
    return a


def test_lost_bookie_is_marked_only_after_the_delay(cluster):
    bookies, store = cluster
    bookies.underreplication.set_lost_bookie_recovery_delay_s(2)
    a = start_auditor(store)
    try:
        lost_at = time.monotonic()
        bookies.cluster.unregister_bookie(C, readonly=False)
        wait_until(lambda: store.underreplication.list_underreplicated(), 10, "marks")
        assert time.monotonic() - lost_at >= 1.9
        assert store.underreplication.list_underreplicated() == {1: [C], 2: [C], 3: [C]}
        assert a.stats.lost_bookies_audited == [C]
    finally:
        a.stop()


def test_bookie_back_within_the_delay_and_read_only_bookies_are_not_lost(cluster):
    bookies, store = cluster
    bookies.underreplication.set_lost_bookie_recovery_delay_s(2)
    a = start_auditor(store)
    try:
        bookies.cluster.unregister_bookie(A, readonly=False)
        bookies.cluster.register_bookie(A, readonly=True, wait_ms_max=0)     # turned read-only
        bookies.cluster.unregister_bookie(B, readonly=False)
        time.sleep(0.5)
        bookies.cluster.register_bookie(B, readonly=False, wait_ms_max=0)    # a quick restart
        time.sleep(3)   # a second past the delay
        assert store.underreplication.list_underreplicated() == {}
        assert a.tracker.pending == {}
    finally:
        a.stop()


def test_second_lost_bookie_cuts_the_delay_short(cluster):
    bookies, store = cluster
    bookies.underreplication.set_lost_bookie_recovery_delay_s(600)
    a = start_auditor(store)
    try:
        bookies.cluster.unregister_bookie(A, readonly=False)
        time.sleep(1.5)
        assert store.underreplication.list_underreplicated() == {}   # one bookie: the delay holds
        bookies.cluster.unregister_bookie(E, readonly=False)
        wait_until(lambda: len(store.underreplication.list_underreplicated()) == 2, 10, "marks of both bookies")
        assert store.underreplication.list_underreplicated() == {1: [A], 3: [E]}
    finally:
        a.stop()


def test_delay_set_to_zero_at_run_time_audits_now(cluster):
    bookies, store = cluster
    bookies.underreplication.set_lost_bookie_recovery_delay_s(600)
    a = start_auditor(store)
    try:
        bookies.cluster.unregister_bookie(D, readonly=False)
        time.sleep(1.5)
        assert store.underreplication.list_underreplicated() == {}
        bookies.underreplication.set_lost_bookie_recovery_delay_s(0)
        wait_until(lambda: len(store.underreplication.list_underreplicated()) == 2, 10, "marks after the delay changed")
        assert store.underreplication.list_underreplicated() == {2: [D], 3: [D]}
    finally:
        a.stop()


def test_nothing_is_marked_while_replication_is_disabled(cluster):
    bookies, store = cluster
    bookies.underreplication.set_lost_bookie_recovery_delay_s(0)
    bookies.underreplication.set_replication_enabled(False)
    auditor = Auditor(store, AutoRecoveryConfig(**QUIET), BookiePool(1000, 16))  # type: ignore[arg-type]
    auditor.start()
    try:
        bookies.cluster.unregister_bookie(B, readonly=False)
        time.sleep(1.5)
        assert store.underreplication.list_underreplicated() == {} and auditor.stats.audits == 0
        bookies.underreplication.set_replication_enabled(True)
        wait_until(lambda: len(store.underreplication.list_underreplicated()) == 2, 10, "marks once enabled")
    finally:
        auditor.stop()


def test_facade_elects_exactly_one_auditor_and_moves_it(cluster):
    name = f"ar-{uuid.uuid4().hex[:8]}"
    seed_store = InMemoryMetadataStore(InMemoryZooKeeper.named(name))
    seed_store.cluster.init_cluster()
    cfg = AutoRecoveryConfig(**QUIET, acquire_poll_ms=100)  # type: ignore[arg-type]
    first = AutoRecovery(f"memory://{name}", cfg, candidate_id="first")
    second = AutoRecovery(f"memory://{name}", cfg, candidate_id="second", run_worker=False)
    try:
        first.start()
        assert first.wait_ready(10)
        wait_until(lambda: first.is_auditor, 10, "the first candidate to win")
        second.start()
        assert second.wait_ready(10)
        time.sleep(0.5)
        assert not second.is_auditor and seed_store.underreplication.current_auditor() == "first"
        first.stop()
        first.stop()   # idempotent
        wait_until(lambda: second.is_auditor, 10, "the second candidate to take over")
        assert seed_store.underreplication.current_auditor() == "second"
        second.stop()
        wait_until(lambda: seed_store.underreplication.current_auditor() is None, 10, "the last vote to be withdrawn")
    finally:
        first.stop()
        second.stop()
        seed_store.close()


def test_placement_check_counts_fragments_that_break_the_policy():
    import json

    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as bookies, InMemoryMetadataStore(zk) as store:
        bookies.cluster.init_cluster()
        racks = {A: "/r1", B: "/r1", C: "/r2", D: "/r2", E: "/r3"}
        for b, rack in racks.items():
            bookies.cluster.register_bookie(b, readonly=False, wait_ms_max=0,
                                            data=json.dumps({"id": b, "network_location": rack}).encode())
        bookies.ledgers.create_ledger_metadata(closed_ledger(1, [A, B, C]))   # write set {A, B}: one rack
        bookies.ledgers.create_ledger_metadata(closed_ledger(2, [A, C, E]))   # three racks: fine
        a = start_auditor(store, placement_check_interval_ms=300)
        try:
            wait_until(lambda: a.stats.placement_checks >= 1, 10, "a placement check")
            assert a.stats.placement_violations == 1
            assert store.underreplication.list_underreplicated() == {}   # reported, not moved (BookKeeper's default)
        finally:
            a.stop()


class _RecordingStore(InMemoryMetadataStore):
    """The twin, noting the order of the auditor's batch marks and batch reads."""

    def __init__(self, zk: InMemoryZooKeeper) -> None:
        super().__init__(zk)
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        mark_many, read_many = self.underreplication.mark_underreplicated_many, self.ledgers.read_ledger_metadata_many

        def mark(marks):  # type: ignore[no-untyped-def]
            if marks:
                self.calls.append(("mark", tuple(sorted(marks))))
            mark_many(marks)

        def read(ledger_ids):  # type: ignore[no-untyped-def]
            self.calls.append(("read", tuple(ledger_ids)))
            return read_many(ledger_ids)

        self.underreplication.mark_underreplicated_many = mark  # type: ignore[method-assign]
        self.ledgers.read_ledger_metadata_many = read  # type: ignore[method-assign]


def test_indexed_ledgers_are_marked_before_the_scan_and_new_ones_by_it(cluster):
    """The last scan's index lets the audit mark a lost bookie's known ledgers before reading any
    metadata; a ledger created since (unknown to the index) is still found by the scan."""
    bookies, _ = cluster
    store = _RecordingStore(bookies.zk)
    a = start_auditor(store)
    try:
        bookies.ledgers.create_ledger_metadata(closed_ledger(4, [C, D, E]))   # after the first audit's scan
        store.calls.clear()
        bookies.cluster.unregister_bookie(C, readonly=False)
        wait_until(lambda: a.stats.lost_bookies_audited == [C], 10, "the audit of C")
        assert store.calls[0] == ("mark", (1, 2, 3))          # from the index, before any read
        assert ("mark", (4,)) in store.calls[1:]               # the scan found the new ledger
        assert store.underreplication.list_underreplicated() == {1: [C], 2: [C], 3: [C], 4: [C]}
    finally:
        a.stop()
        store.close()
