"""Fair share and write rates on the bookie (DESIGN §4.10), as pure logic and on a real journal.

- FlowQueue: a quiet flow's submit goes into the next group however much a flood queued; a
  ledger's submits keep their order even when its flow changes (replay depends on it).
- Journal with turns, on real files: a flooding flow waits for room while a quiet one does not,
  and every ledger's records replay in the order they were submitted (hypothesis, seeded).
- Rates: a writer trying twice the rate for 10 s (simulated clock) gets 0.9x-1.1x of it; records
  are counted from real stream record sets, bytes without the framing, E/Qw weighed.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.protocol.framing import Digester, DigestType
from ledger_client.stream.records import encode
from spark_bookie.server.adds import AddGroup
from spark_bookie.server.admission import Admission, written
from spark_bookie.server.namespace_view import LedgerFacts
from spark_bookie.server.rates import BURST_S, HOLD_S_MAX, NamespaceRates, RateLimits
from spark_bookie.storage.flow_queue import FlowQueue
from spark_bookie.storage.journal import Journal, JournalRecord, RecordType

pytestmark = pytest.mark.unit


@dataclass
class Item:
    data: bytes
    enqueued: float
    ledger_id: int | None


def test_a_quiet_flow_goes_into_the_next_group_past_a_flood() -> None:
    q: FlowQueue[Item] = FlowQueue(fair=True)
    for i in range(1000):
        q.put("a", Item(b"x" * 1000, i, 1))
    q.put("b", Item(b"y" * 10, 1000.0, 2))
    group = q.take(64 * 1024, False)
    assert any(item.ledger_id == 2 for item in group), "the quiet flow's submit waited behind the flood"
    assert sum(len(item.data) for item in group) <= 64 * 1024
    assert q.queued_bytes("b") == 0 and q.queued_bytes("a") == (1000 - len(group) + 1) * 1000


def test_without_turns_the_queue_is_first_come_first_served() -> None:
    q: FlowQueue[Item] = FlowQueue(fair=False)
    for i in range(100):
        q.put("a", Item(b"x" * 1000, i, 1))
    q.put("b", Item(b"y", 100.0, 2))
    group = q.take(10_000, False)
    assert [item.ledger_id for item in group] == [1] * 10
    assert q.queued_bytes("b") == q.queued_bytes("a")   # one queue


def test_a_ledger_keeps_its_flow_while_it_has_submits_queued() -> None:
    q: FlowQueue[Item] = FlowQueue(fair=True)
    assert q.put(("ledger", 7), Item(b"k", 0.0, 7)) == ("ledger", 7)
    # its namespace is known now, but its first submit is still queued: it stays in its flow
    assert q.put("ns", Item(b"e", 1.0, 7)) == ("ledger", 7)
    q.take(1 << 20, False)
    assert q.put("ns", Item(b"f", 2.0, 7)) == "ns"   # nothing of it queued: the new flow


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_fair_journal_replays_every_ledger_in_submission_order(tmp_path_factory: pytest.TempPathFactory,
                                                               seed: int) -> None:
    """Submits of 5 ledgers whose flows change at random (as a bookie learns namespaces), from
    4 threads, into a journal with turns and small groups: each ledger's records replay in the
    order its submits were made, and every callback ran."""
    print(f"seed={seed}")
    rnd = random.Random(seed)
    d = tmp_path_factory.mktemp("fair-journal")
    j = Journal(d, group_commit_bytes_max=4096, fair=True, flow_bytes_max=8192)
    j.start()
    done = threading.Semaphore(0)
    plans = {t: [(rnd.randrange(5), rnd.choice(["a", "b", "c"]), rnd.randrange(1, 4)) for _ in range(60)]
             for t in range(4)}
    lock = threading.Lock()
    submitted: dict[int, list[int]] = {lid: [] for lid in range(5)}
    seq = iter(range(10**9))

    def run(plan: list[tuple[int, str, int]]) -> None:
        for lid, flow, n in plan:
            j.wait_for_room(flow)
            with lock:   # the bookie submits under its apply lock: the order submits are made in
                recs = [JournalRecord(RecordType.ADD, lid, next(seq), rnd.randbytes(200)) for _ in range(n)]
                submitted[lid].extend(r.entry_id for r in recs)
                j.submit(recs, lambda _e: done.release(), flow=flow)

    threads = [threading.Thread(target=run, args=(plans[t],)) for t in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for _ in range(sum(len(p) for p in plans.values())):
        assert done.acquire(timeout=10), "a submit's callback never ran"
    j.stop()
    replayed: dict[int, list[int]] = {lid: [] for lid in range(5)}
    Journal(d).replay(None, lambda r: replayed[r.ledger_id].append(r.entry_id))
    assert replayed == submitted


def test_a_flooding_flow_waits_for_room_and_a_quiet_one_does_not(tmp_path: Path) -> None:
    j = Journal(tmp_path, fair=True, flow_bytes_max=4096)
    # not started: nothing is taken, so the flood's queue stays full
    j._state = "running"   # what start() sets, without the thread that would drain the queue
    j.submit([JournalRecord(RecordType.ADD, 1, 0, b"x" * 5000)], lambda _e: None, flow="flood")
    started = time.monotonic()
    assert not j.wait_for_room("flood", 0.2), "a flow over its share was let through"
    assert time.monotonic() - started >= 0.2
    assert j.wait_for_room("quiet", 0.0), "a flow with nothing queued had to wait"
    unfair = Journal(tmp_path / "fifo", fair=False, flow_bytes_max=4096)
    assert unfair.wait_for_room("flood", 0.0)   # without turns nothing waits here (submit bounds it)


def test_twice_the_rate_for_ten_seconds_gets_the_rate() -> None:
    for limits, size, records in ((RateLimits(100_000, None), 1000, 1), (RateLimits(None, 1000), 4000, 40)):
        rates, now, got, hold_until = NamespaceRates(), 0.0, 0, 0.0
        rate = limits.bytes_per_s or limits.records_per_s
        per_batch = size if limits.bytes_per_s else records
        step = per_batch / (2 * rate)   # batches offered at twice the rate
        while now < 10.0:
            if now >= hold_until:   # one connection: the next batch is read once this one is released
                hold = rates.charge("ns", limits, size, records, now)
                hold_until = now + hold
                if hold_until <= 10.0:
                    got += per_batch
            now += step
        assert 0.9 * rate * 10 <= got <= 1.1 * rate * 10, (limits, got)
        assert got <= rate * (10 + BURST_S) + per_batch


def test_a_hold_is_bounded_and_the_debt_is_kept() -> None:
    rates = NamespaceRates()
    limits = RateLimits(1000, None)
    assert rates.charge("ns", limits, 100_000, 1, 0.0) == HOLD_S_MAX   # ~100 s of debt, held 5 s
    assert rates.charge("ns", limits, 1, 1, 5.0) == HOLD_S_MAX          # the rest is still owed
    assert rates.charge("other", limits, 10, 1, 5.0) == 0.0              # another namespace owes nothing
    assert rates.charge("ns", RateLimits(None, None), 10**9, 10**6, 5.0) == 0.0


class View:
    """The NamespaceView calls Admission makes, answered from dicts."""

    def __init__(self, ledgers: dict[int, LedgerFacts], limits: dict[str, RateLimits]) -> None:
        self.ledgers, self.limits = ledgers, limits
        self.on_namespace_change: list = []

    def peek_ledger(self, lid: int) -> LedgerFacts | None:
        return self.ledgers.get(lid)

    def peek_limits(self, ns: str) -> RateLimits:
        return self.limits.get(ns, RateLimits(None, None))


def _entry(lid: int, eid: int, payload: bytes) -> bytes:
    return Digester(DigestType.CRC32C).frame(lid, eid, -1, len(payload), payload)


def test_admission_counts_records_and_payload_bytes_and_weighs_striping() -> None:
    sets = [encode(list(range(i * 50, i * 50 + 50)), [b"r" * 100] * 50, i * 50) for i in range(4)]
    bodies = [_entry(3, i, s) for i, s in enumerate(sets)]
    digest = DigestType.CRC32C.digest_bytes
    assert [written(b, digest) for b in bodies] == [(5000, 50)] * 4
    assert written(_entry(3, 0, b"plain entry"), digest) == (11, 1)
    fake = bytes([0xD1, 1, 0, 0]) + (10**6).to_bytes(4, "little") + bytes(8)   # a count no body could hold
    assert written(_entry(3, 0, fake), digest) == (16, 1)
    charged: list[tuple[float, float]] = []

    class Rates(NamespaceRates):
        def charge(self, namespace: str, limits: RateLimits, nbytes: float, records: float, now: float) -> float:
            charged.append((nbytes, records))
            return 0.25 * len(charged)   # the debt grows with each entry charged

    view = View({3: LedgerFacts("ns", "", 5, 2, digest), 4: LedgerFacts("", "", 3, 3, digest)},
                {"ns": RateLimits(10, 10)})
    adm = Admission(view, Rates())   # type: ignore[arg-type]
    limited = AddGroup(3, 0, b"k" * 20, [0, 1, 2, 3], [10, 11, 12, 13], bodies)
    free = AddGroup(4, 0, b"k" * 20, [0], [20], [bodies[0]])
    flow, pieces = adm.assess([limited, free])
    assert flow == "ns"
    assert charged == [(5000 * 2.5, 50 * 2.5)] * 4   # E/Qw = 5/2
    # the unlimited ledger's add at once; the limited one's entry by entry, each after its own hold
    assert [(p.groups[0].ledger_id, p.groups[0].request_ids, p.hold_s) for p in pieces] == [
        (4, [20], 0.0), (3, [10], 0.25), (3, [11], 0.5), (3, [12], 0.75), (3, [13], 1.0)]
    flow, pieces = adm.assess([AddGroup(9, 0, b"k" * 20, [0], [0], [bodies[0]])])   # not known yet: own flow
    assert flow == ("ledger", 9) and [p.hold_s for p in pieces] == [0.0]
