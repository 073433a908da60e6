"""The auditor's full checks at scale, on the in-memory metadata twin and a bookie-pool twin: the
data check's probe reads overlap across ledgers (a scan waits about ceil(probes / window) times,
not once per ledger) with the same verdicts, and a check finding nothing changed decodes and
evaluates no ledger again (issue 33: a full check of 100,000 ledgers in < 60 s)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester
from metadata import DigestType, InMemoryMetadataStore, InMemoryZooKeeper, LedgerMetadata, LedgerState
from recovery import Auditor, AutoRecoveryConfig
from recovery.ledger_views import LedgerViews

pytestmark = pytest.mark.unit

BOOKIES = [f"127.0.0.1:{3181 + i}" for i in range(6)]
RACK = {b: f"/r{i % 3}" for i, b in enumerate(BOOKIES)}
WINDOW = 16
LEDGERS, WITH_ENTRIES = 200, 40
CRC = Digester(DigestType.CRC32C, b"")


class PoolTwin:
    """Bookies that answer probes from a table. Sent reads stay unanswered until the auditor waits
    for one of them; then every read in flight is answered at once: one round trip."""

    def __init__(self) -> None:
        self.lacking: set[tuple[str, int, int]] = set()    # (bookie, ledger, entry): ENOENTRY
        self.corrupt: set[tuple[str, int, int]] = set()    # a copy failing its digest
        self.silent: set[tuple[str, int, int]] = set()     # times out: proves nothing
        self.pending: list[_Future] = []
        self.sent = self.round_trips = self.in_flight_max = 0

    def get(self, bookie: str) -> _ClientTwin:
        return _ClientTwin(self, bookie)

    def send(self, bookie: str, ledger_id: int, entry_id: int, listed: bool) -> _Future:
        fut = _Future(self, (bookie, ledger_id, entry_id), listed)
        self.pending.append(fut)
        self.sent += 1
        self.in_flight_max = max(self.in_flight_max, len(self.pending))
        return fut

    def round_trip(self) -> None:
        self.round_trips += 1
        for f in self.pending:
            f.answered = True
        self.pending = []


class _ClientTwin:
    def __init__(self, pool: PoolTwin, bookie: str) -> None:
        self.pool, self.bookie = pool, bookie

    def read_future(self, ledger_id: int, entry_id: int) -> _Future:
        return self.pool.send(self.bookie, ledger_id, entry_id, listed=False)

    def read_entries_future(self, ledger_id: int, entry_ids: list[int], max_bytes: int = 0) -> _Future:
        assert len(entry_ids) == 1
        return self.pool.send(self.bookie, ledger_id, entry_ids[0], listed=True)


class _Future:
    def __init__(self, pool: PoolTwin, key: tuple[str, int, int], listed: bool) -> None:
        self.pool, self.key, self.listed, self.answered = pool, key, listed, False

    def done(self) -> bool:
        return self.answered

    def result(self, timeout: float | None = None) -> Any:
        if not self.answered:
            self.pool.round_trip()
        _bookie, lid, e = self.key
        if self.key in self.pool.silent:
            raise grpc.FutureTimeoutError()
        if self.key in self.pool.lacking:
            status, body = pb.ENOENTRY, b""
        else:
            body = CRC.frame(lid, e, e - 1, 10 * (e + 1), b"0123456789")
            if self.key in self.pool.corrupt:
                body = body[:-1] + bytes([body[-1] ^ 0xFF])
            status = pb.EOK
        if self.listed:
            return pb.ReadRangeResponse(status=status, ledger_id=lid, first_entry_id=e,
                                        entry_ids=[e] if status == pb.EOK else [], bodies=[body] if body else [])
        return pb.ReadResponse(status=status, ledger_id=lid, entry_id=e, body=body)


def closed_ledger(lid: int, ensemble: list[str], last_entry_id: int) -> LedgerMetadata:
    md = LedgerMetadata.new_open(lid, ensemble, write_quorum_size=2, ack_quorum_size=2,
                                 digest_type=DigestType.CRC32C, password=b"")
    return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=last_entry_id,
                               length=10 * (last_entry_id + 1))


@pytest.fixture
def store() -> Iterator[InMemoryMetadataStore]:
    """A cluster of 6 bookies on 3 racks; LEDGERS closed ledgers, the first WITH_ENTRIES of them
    with 1-3 entries, the others empty (as most of a busy cluster's are)."""
    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as s:
        s.cluster.init_cluster()
        for b in BOOKIES:
            s.cluster.register_bookie(b, readonly=False, wait_ms_max=0,
                                      data=json.dumps({"id": b, "network_location": RACK[b]}).encode())
        for lid in range(1, LEDGERS + 1):
            ensemble = [BOOKIES[(lid + k) % len(BOOKIES)] for k in range(3)]
            last = (lid % 3) if lid <= WITH_ENTRIES else -1
            s.ledgers.create_ledger_metadata(closed_ledger(lid, ensemble, last))
        yield s


def auditor(store: InMemoryMetadataStore, pool: PoolTwin) -> Auditor:
    cfg = AutoRecoveryConfig(check_all_ledgers_interval_ms=0, placement_check_interval_ms=0,
                             copy_reads_in_flight_max=WINDOW)
    return Auditor(store, cfg, pool)  # type: ignore[arg-type]   # not started: checks are called directly


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts LedgerMetadata objects made (every decode of a metadata node makes one)."""
    made = [0]
    post_init = LedgerMetadata.__post_init__

    def counting(self: LedgerMetadata) -> None:
        made[0] += 1
        post_init(self)

    monkeypatch.setattr(LedgerMetadata, "__post_init__", counting)
    return made


def test_full_check_keeps_a_window_of_probes_in_flight_across_ledgers(store):
    pool = PoolTwin()
    a = auditor(store, pool)
    a._check_all()
    assert pool.sent > 3 * WINDOW
    # before: one ledger's probes launched, then waited for: a round trip per ledger with entries
    assert pool.round_trips <= math.ceil(pool.sent / WINDOW) + 1, (pool.round_trips, pool.sent)
    assert pool.in_flight_max == WINDOW
    assert store.underreplication.list_underreplicated() == {}


def test_full_check_finds_the_same_losses_and_ignores_reads_that_prove_nothing(store):
    pool = PoolTwin()
    md3 = store.ledgers.read_ledger_metadata(3)[0]          # entries 0..0: every write set holds entry 0
    md5 = store.ledgers.read_ledger_metadata(5)[0]          # entries 0..2
    b3, b5 = md3.ensembles[0][0], md5.ensembles[0][1]
    pool.lacking.add((b3, 3, 0))
    pool.corrupt.add((b5, 5, 1))                              # position 1's last entry
    pool.silent.add((md3.ensembles[0][1], 3, 0))             # no answer: not a loss
    a = auditor(store, pool)
    a._check_all()
    assert store.underreplication.list_underreplicated() == {3: [b3], 5: [b5]}
    assert a.stats.fragments_missing_entries == 2
    # the one-ledger path (the worker's) says the same
    assert a._checker.check(md3, set(BOOKIES)) == {b3: [0]}
    assert a._checker.check(md5, set(BOOKIES)) == {b5: [0]}


def test_second_full_check_reads_every_probe_again_but_decodes_nothing(store, decodes):
    pool = PoolTwin()
    a = auditor(store, pool)
    a._check_all()
    first_probes, first_decodes = pool.sent, decodes[0]
    assert first_decodes >= LEDGERS
    a._check_all()
    assert pool.sent == 2 * first_probes          # every sampled entry is read on every check
    assert decodes[0] == first_decodes            # ... but no unchanged ledger is decoded again


def test_second_placement_check_with_nothing_changed_evaluates_no_ledger(store, decodes):
    bad = closed_ledger(LEDGERS + 1, [BOOKIES[0], BOOKIES[3], BOOKIES[1]], 5)   # write set {0, 3}: one rack
    store.ledgers.create_ledger_metadata(bad)
    a = auditor(store, PoolTwin())
    a._check_placement()
    assert a.stats.placement_violations == 1
    before = decodes[0]
    a._check_placement()
    assert decodes[0] == before                   # nothing changed: nothing decoded or evaluated
    assert a.stats.placement_violations == 1      # the verdicts are still counted (and logged)
    # one ledger changes: that one is decoded again
    md, version = store.ledgers.read_ledger_metadata(bad.ledger_id)
    fixed = dataclasses.replace(md, ensembles={0: [BOOKIES[0], BOOKIES[4], BOOKIES[2]]})   # three racks
    store.ledgers.write_ledger_metadata(fixed, version)
    before = decodes[0]
    a._check_placement()
    assert decodes[0] == before + 1 and a.stats.placement_violations == 0
    # a bookie moves to another rack: every verdict assumed its old one, so all are evaluated again
    store.cluster.unregister_bookie(BOOKIES[4], readonly=False)
    store.cluster.register_bookie(BOOKIES[4], readonly=False, wait_ms_max=0,
                                  data=json.dumps({"id": BOOKIES[4], "network_location": RACK[BOOKIES[0]]}).encode())
    before = decodes[0]
    a._check_placement()
    assert decodes[0] == before + LEDGERS + 1
    broken = [lid for lid in range(1, LEDGERS + 2) if _breaks(store.ledgers.read_ledger_metadata(lid)[0], BOOKIES[4])]
    assert LEDGERS + 1 in broken and a.stats.placement_violations == len(broken)


def _breaks(md: LedgerMetadata, moved: str) -> bool:
    """Does a ledger have a write set on one rack once ``moved`` sits on /r0?"""
    rack = {**RACK, moved: "/r0"}
    ens = md.ensembles[0]
    return any(rack[ens[i]] == rack[ens[(i + 1) % 3]] for i in range(3))


def test_ledger_views_hold_the_last_scans_ledgers_and_no_more(store):
    views = LedgerViews(capacity=50)
    for _batch in views.scan(store, 32):
        pass
    assert len(views) == 50 and views.decoded == LEDGERS
    unbounded = LedgerViews(capacity=10_000)
    list(unbounded.scan(store, 32))
    store.ledgers.delete_ledger_metadata(7)
    scanned = [v for batch in unbounded.scan(store, 32) for v, _data, _md in batch]
    assert len(unbounded) == LEDGERS - 1 and 7 not in {v.ledger_id for v in scanned}
    assert unbounded.decoded == LEDGERS            # the second scan decoded nothing
