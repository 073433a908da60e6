"""One contract for the under-replication queue and the auditor election, against both backends.

The same tests run on a real ZooKeeper and on the in-memory twin, so the replication worker and the
auditor (recovery/) can be tested fast on the twin without it drifting from ZooKeeper. Each test
gets a fresh root, so tests never see each other's nodes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from contract_helpers import Backend, Events, wait_until

from metadata import (
    InMemoryMetadataStore,
    InMemoryZooKeeper,
    MetadataStore,
    MetadataUnavailableError,
    NoNodeError,
    SessionEvent,
    connect,
)
from metadata.layout import ZkLayout, ur_ledger_id
from metadata.underreplication.election import ordered_votes

FAILOVER_S = 10.0  # an expired or withdrawn auditor is replaced well within this


# -- layout -----------------------------------------------------------------------------------------
@pytest.mark.unit
def test_paths_follow_bookkeeper() -> None:
    """ZkLedgerUnderreplicationManager: 16-bit hex buckets, then urL%010d; locks flat."""
    p = ZkLayout("/ledgers")
    assert p.ur_ledger(1) == "/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000001"
    assert p.ur_ledger(2**63 - 1) == "/ledgers/underreplication/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775807"
    assert p.ur_lock(70000) == "/ledgers/underreplication/locks/urL0000070000"
    assert p.auditor_election == "/ledgers/underreplication/auditorelection"
    assert p.ur_disable == "/ledgers/underreplication/disable"
    assert p.ur_lost_bookie_recovery_delay == "/ledgers/underreplication/lostBookieRecoveryDelay"
    assert ur_ledger_id("urL0000070000") == 70000 and ur_ledger_id("L0001") is None
    with pytest.raises(ValueError):
        p.ur_ledger(-1)


@pytest.mark.unit
def test_queue_view_serves_listings_until_their_watch_fires(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache behind acquire: a listing is reused until its watch fires, then (stale) only as a
    hint for ``max_stale_s``; a watch firing while a fetch is in flight leaves that fetch stale;
    the leaf buckets' names spell the ledger ids, so leaves are never listed."""
    from metadata.underreplication import view as underreplication_view
    from metadata.underreplication.view import QueueView

    monkeypatch.setattr(underreplication_view, "EMPTY_FOR_S", 0.0)  # prune candidates at once
    tree = {"/q": ["0000"], "/q/0000": ["0001"], "/q/0000/0001": ["0002"],
            "/q/0000/0001/0002": ["002a", "ffff", "junk"], "/locks": ["urL0000000042", "other"]}
    calls: list[list[str]] = []
    racing: list[str] = []

    def fetch(paths: list[str]) -> list[list[str] | None]:
        calls.append(list(paths))
        for path in racing:
            view.invalidate(path)  # a watch event arriving while the answer is on its way
        racing.clear()
        return [list(tree[p]) if p in tree else None for p in paths]

    view = QueueView("/q", "/locks", fetch, max_age_s=60.0)
    base = (1 << 32) + (2 << 16)
    groups, empty = view.leaf_groups(0.0)
    assert [g.ids for g in groups] == [[base + 0x2A, base + 0xFFFF]] and empty == []
    assert view.locked(0.0) == {42}
    fetched = len(calls)
    view.leaf_groups(0.0)
    view.locked(0.0)
    assert len(calls) == fetched  # nothing changed: no request

    tree["/q/0000/0001/0002"] = ["ffff"]
    view.invalidate("/q/0000/0001/0002")
    assert [g.ids for g in view.leaf_groups(10.0)[0]] == [[base + 0x2A, base + 0xFFFF]]  # stale hint
    assert [g.ids for g in view.leaf_groups(0.0)[0]] == [[base + 0xFFFF]]  # fetched again
    assert calls[-1] == ["/q/0000/0001/0002"]  # only what changed

    tree["/q/0000/0001/0002"] = []
    view.invalidate("/q/0000/0001/0002")
    racing.append("/q/0000/0001/0002")
    assert view.leaf_groups(0.0)[0] == []
    fetched = len(calls)
    groups, empty = view.leaf_groups(0.0)  # the raced fetch was stored stale: fetched again
    assert len(calls) == fetched + 1 and groups == [] and empty == ["/q/0000/0001/0002"]

    del tree["/q/0000/0001/0002"]  # pruned: an absent node arms no watch, so it is never trusted
    view.invalidate("/q/0000/0001/0002")
    assert view.leaf_groups(0.0)[0] == []
    tree["/q/0000/0001/0002"] = ["0007"]  # re-created: no watch fires for it
    assert [g.ids for g in view.leaf_groups(0.0)[0]] == [[base + 7]]

    view.note_unlocked(42)
    assert view.locked(10.0) == set()
    view.invalidate(None)  # the connection went: every watch with it
    fetched = len(calls)
    view.leaf_groups(0.0)
    assert len(calls) == fetched + 4  # all four levels again


# -- the queue ----------------------------------------------------------------------------------------
def test_mark_merges_and_lists(backend: Backend, store: MetadataStore) -> None:
    assert store.underreplication.list_underreplicated() == {}
    store.underreplication.mark_underreplicated(1, ["b:2"])
    store.underreplication.mark_underreplicated(1, ["b:1", "b:2"])  # merged, no duplicate
    store.underreplication.mark_underreplicated(1, ["b:1"])  # idempotent
    store.underreplication.mark_underreplicated(2**40 + 3, ["b:3"])
    assert store.underreplication.list_underreplicated() == {1: ["b:1", "b:2"], 2**40 + 3: ["b:3"]}
    assert store.underreplication.missing_replicas(1) == ["b:1", "b:2"]
    assert store.underreplication.missing_replicas(7) is None
    others = [backend.make() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:  # concurrent marks from several sessions all land (CAS)
        list(pool.map(lambda i: others[i % 4].underreplication.mark_underreplicated(9, [f"x:{i}"]), range(16)))
    assert store.underreplication.missing_replicas(9) == sorted(f"x:{i}" for i in range(16))
    with pytest.raises(ValueError):
        store.underreplication.mark_underreplicated(-1, ["b:1"])
    with pytest.raises(ValueError):
        store.underreplication.mark_underreplicated(5, ["bad/id"])


def test_mark_many_creates_merges_and_makes_buckets(backend: Backend, store: MetadataStore) -> None:
    store.underreplication.mark_underreplicated(7, ["b:1"])
    many = {lid: ["b:2"] for lid in range(0, 600, 3)} | {2**40 + 5: ["b:2", "b:3"]}
    # new ledgers, new buckets at every level, and one already marked
    store.underreplication.mark_underreplicated_many(many)
    store.underreplication.mark_underreplicated_many({})
    want = {lid: list(m) for lid, m in many.items()}
    want[7] = ["b:1"]
    assert backend.make().underreplication.list_underreplicated() == want | {7: ["b:1"]}
    store.underreplication.mark_underreplicated_many({3: ["b:9"], 7: ["b:2"]})   # merges into existing marks
    assert store.underreplication.missing_replicas(3) == ["b:2", "b:9"]
    assert store.underreplication.missing_replicas(7) == ["b:1", "b:2"]
    with pytest.raises(ValueError):
        store.underreplication.mark_underreplicated_many({5: ["bad/id"]})


def test_queue_needs_an_initialised_cluster(backend: Backend) -> None:
    fresh = backend.make()
    with pytest.raises(NoNodeError, match="init"):
        fresh.underreplication.mark_underreplicated(1, ["b:1"])
    with pytest.raises(NoNodeError, match="init"):
        fresh.underreplication.elect_auditor("a", lambda _: None)
    assert fresh.underreplication.current_auditor() is None and fresh.underreplication.list_underreplicated() == {}


def test_workers_never_acquire_the_same_ledger(backend: Backend, store: MetadataStore) -> None:
    ids = set(range(1, 31)) | {2**33 + 5}
    for lid in ids:
        store.underreplication.mark_underreplicated(lid, ["b:1"])
    workers = [backend.make() for _ in range(3)]

    def drain(s: MetadataStore) -> list[int]:
        got = []
        while (lid := s.underreplication.acquire_underreplicated(0)) is not None:
            got.append(lid)
        return got

    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(drain, workers))
    taken = [lid for run in runs for lid in run]
    assert sorted(taken) == sorted(ids)  # each exactly once
    assert store.underreplication.acquire_underreplicated(200) is None  # all locked by the workers
    assert store.underreplication.list_underreplicated().keys() == ids  # locking does not dequeue


def test_acquire_honours_exclude_and_own_locks(store: MetadataStore) -> None:
    store.underreplication.mark_underreplicated(1, ["b:1"])
    store.underreplication.mark_underreplicated(2, ["b:1"])
    assert store.underreplication.acquire_underreplicated(100, exclude=[1]) == 2
    assert store.underreplication.acquire_underreplicated(100, exclude=[1]) is None  # 2 is ours already
    assert store.underreplication.acquire_underreplicated(100) == 1
    store.underreplication.release_underreplicated(1)
    store.underreplication.release_underreplicated(1)  # idempotent
    store.underreplication.release_underreplicated(99)  # never held: no-op
    assert store.underreplication.acquire_underreplicated(100, exclude=[2]) == 1


def test_acquire_wakes_when_a_ledger_is_marked(backend: Backend, store: MetadataStore) -> None:
    marker = backend.make()
    threading.Timer(0.5, marker.underreplication.mark_underreplicated, (42, ["b:1"])).start()
    started = time.monotonic()
    assert store.underreplication.acquire_underreplicated(20_000) == 42
    assert time.monotonic() - started < 3  # woken by a watch, not the belt-and-braces re-scan


def test_acquire_wakes_when_a_lock_is_released(backend: Backend, store: MetadataStore) -> None:
    holder = backend.make()
    store.underreplication.mark_underreplicated(7, ["b:1"])
    assert holder.underreplication.acquire_underreplicated(1000) == 7
    threading.Timer(0.5, holder.underreplication.release_underreplicated, (7,)).start()
    started = time.monotonic()
    assert store.underreplication.acquire_underreplicated(20_000) == 7
    assert time.monotonic() - started < 3


def test_lock_is_freed_when_its_session_expires(backend: Backend, store: MetadataStore) -> None:
    worker, other = backend.make(), backend.make()
    store.underreplication.mark_underreplicated(5, ["b:1"])
    assert worker.underreplication.acquire_underreplicated(1000) == 5
    assert other.underreplication.acquire_underreplicated(200) is None
    events = Events()
    worker.add_session_listener(events)
    backend.expire(worker)
    started = time.monotonic()
    assert other.underreplication.acquire_underreplicated(20_000) == 5
    assert time.monotonic() - started < 5
    events.wait_until(lambda calls: SessionEvent.LOST in calls)
    assert worker.underreplication.mark_replicated(5) is False  # the lock died with the session: forget it
    assert store.underreplication.list_underreplicated() == {5: ["b:1"]}
    worker.underreplication.release_underreplicated(5)  # no-op: must not touch other's lock
    assert store.underreplication.acquire_underreplicated(200) is None
    assert other.underreplication.mark_replicated(5) is True
    assert store.underreplication.list_underreplicated() == {}


def test_mark_replicated_is_a_cas_on_the_acquired_version(backend: Backend, store: MetadataStore) -> None:
    auditor = backend.make()
    store.underreplication.mark_underreplicated(3, ["b:1"])
    assert store.underreplication.acquire_underreplicated(1000) == 3
    auditor.underreplication.mark_underreplicated(3, ["b:2"])  # another bookie died while we replicated
    assert store.underreplication.mark_replicated(3) is False
    assert auditor.underreplication.list_underreplicated() == {3: ["b:1", "b:2"]}  # stays queued
    assert auditor.underreplication.acquire_underreplicated(1000) == 3  # and our lock was released
    assert auditor.underreplication.mark_replicated(3) is True
    assert store.underreplication.list_underreplicated() == {} and store.underreplication.missing_replicas(3) is None
    assert store.underreplication.mark_replicated(3) is True  # already gone
    store.underreplication.mark_underreplicated(3, ["b:3"])  # the pruned buckets come back
    assert store.underreplication.mark_replicated(3) is False  # not acquired: nothing deleted
    assert store.underreplication.list_underreplicated() == {3: ["b:3"]}


def test_cached_listings_never_hand_out_a_finished_ledger(backend: Backend, store: MetadataStore) -> None:
    """Acquire works from bucket listings cached between watch events: another session finishing
    ledgers (or marking new ones) must neither make it hand out a ledger whose node is gone nor
    hide a new one."""
    other = backend.make()
    for lid in range(1, 41):
        store.underreplication.mark_underreplicated(lid, ["b:1"])
    mine = store.underreplication.acquire_underreplicated(0)  # lists (and caches) the whole queue
    assert mine is not None and store.underreplication.acquired_missing_replicas(mine) == ["b:1"]
    finished = []
    while (lid := other.underreplication.acquire_underreplicated(0)) is not None:
        assert other.underreplication.mark_replicated(lid) is True
        finished.append(lid)
    assert sorted([*finished, mine]) == list(range(1, 41))
    assert store.underreplication.acquire_underreplicated(0) is None  # stale hints are tried, never returned
    # a hint, exact once tidy
    assert store.underreplication.underreplicated_ids() in ([mine], sorted([mine, *finished]))
    other.underreplication.mark_underreplicated(1000, ["b:2"])
    other.underreplication.mark_underreplicated(2**40 + 1, ["b:2", "b:3"])
    got = {store.underreplication.acquire_underreplicated(10_000) for _ in range(2)}
    assert got == {1000, 2**40 + 1}
    assert store.underreplication.acquired_missing_replicas(2**40 + 1) == ["b:2", "b:3"]
    assert store.underreplication.acquired_missing_replicas(finished[0]) is None  # not ours
    for lid in (mine, 1000, 2**40 + 1):
        assert store.underreplication.mark_replicated(lid) is True
    wait_until(lambda: store.underreplication.underreplicated_ids() == [], 10, "the buckets to be pruned")
    assert store.underreplication.list_underreplicated() == {}
    other.underreplication.mark_underreplicated(7, ["b:4"])  # its buckets come back: seen at once, not after a re-scan
    wait_until(lambda: store.underreplication.underreplicated_ids() == [7], 2,
               "another session's mark in pruned buckets")


def test_concurrent_workers_drain_a_changing_queue(backend: Backend, store: MetadataStore, seed: int) -> None:
    """Workers on several sessions take, finish or give back ledgers while another session keeps
    marking (some ledgers again while held): no ledger is ever held twice at once, re-marked
    ledgers stay queued, and the queue ends empty with no bucket left behind."""
    import random

    rng = random.Random(seed)
    ids = rng.sample(range(1, 3000), 60) + [2**33 + rng.randrange(1000) for _ in range(5)]
    workers = [backend.make() for _ in range(3)]
    holders: dict[int, int] = {}
    guard = threading.Lock()
    errors: list[str] = []

    def work(w: int) -> None:
        s, r = workers[w], random.Random(seed + w)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.5:
            lid = s.underreplication.acquire_underreplicated(100)
            if lid is None:
                continue
            idle_since = time.monotonic()
            with guard:
                if lid in holders:
                    errors.append(f"ledger {lid} held by workers {holders[lid]} and {w}")
                holders[lid] = w
            time.sleep(r.random() * 0.01)
            with guard:
                del holders[lid]
            if r.random() < 0.2:
                s.underreplication.release_underreplicated(lid)
            else:
                s.underreplication.mark_replicated(lid)  # False when re-marked meanwhile: it stays queued

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(work, w) for w in range(3)]
        for lid in ids:
            store.underreplication.mark_underreplicated(lid, [f"b:{rng.randrange(3)}"])
            if rng.random() < 0.3:
                store.underreplication.mark_underreplicated(rng.choice(ids), ["b:9"])  # a new failure, maybe while held
        for f in futures:
            f.result()
    assert errors == []
    wait_until(lambda: store.underreplication.list_underreplicated() == {}, 20, "the queue to drain")

    def tidy() -> bool:  # buckets a prune skipped go once a search has seen them empty for a while
        assert store.underreplication.acquire_underreplicated(0) is None
        return store.nodes.children(store.paths.ur_ledgers) == []

    wait_until(tidy, 10, "the emptied buckets to be pruned")


def test_disable_stops_acquire_and_enable_wakes_it(backend: Backend, store: MetadataStore) -> None:
    switch = backend.make()
    store.underreplication.mark_underreplicated(11, ["b:1"])
    assert store.underreplication.is_replication_enabled()
    switch.underreplication.set_replication_enabled(False)
    switch.underreplication.set_replication_enabled(False)  # idempotent
    assert not store.underreplication.is_replication_enabled()
    started = time.monotonic()
    assert store.underreplication.acquire_underreplicated(300) is None
    assert time.monotonic() - started >= 0.25
    threading.Timer(0.5, switch.underreplication.set_replication_enabled, (True,)).start()
    started = time.monotonic()
    assert store.underreplication.acquire_underreplicated(20_000) == 11
    assert time.monotonic() - started < 3
    switch.underreplication.set_replication_enabled(True)  # idempotent
    assert store.underreplication.is_replication_enabled()


def test_lost_bookie_recovery_delay(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    assert store.underreplication.lost_bookie_recovery_delay_s() == 0
    events = Events()
    cancel = store.underreplication.watch_lost_bookie_recovery_delay(events)
    events.wait_until(lambda calls: calls == [0])
    writer.underreplication.set_lost_bookie_recovery_delay_s(30)
    events.wait_until(lambda calls: calls == [0, 30])
    assert store.underreplication.lost_bookie_recovery_delay_s() == 30
    writer.underreplication.set_lost_bookie_recovery_delay_s(30)  # no change: no call
    writer.underreplication.set_lost_bookie_recovery_delay_s(0)
    events.wait_until(lambda calls: calls == [0, 30, 0])
    for bad in (-1, True, "5", 1.5):
        with pytest.raises(ValueError):
            writer.underreplication.set_lost_bookie_recovery_delay_s(bad)  # type: ignore[arg-type]
    cancel()
    writer.underreplication.set_lost_bookie_recovery_delay_s(7)
    time.sleep(0.3)
    assert events.calls == [0, 30, 0] and store.underreplication.lost_bookie_recovery_delay_s() == 7
    assert all("underreplication" in name for name in events.threads), events.threads


def test_delay_watch_survives_session_expiry(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    events = Events()
    store.underreplication.watch_lost_bookie_recovery_delay(events)
    events.wait_until(lambda calls: calls == [0])
    backend.expire(store)
    writer.underreplication.set_lost_bookie_recovery_delay_s(12)
    events.wait_until(lambda calls: calls[-1] == 12)


# -- auditor election ---------------------------------------------------------------------------------
class Candidate:
    def __init__(self, store: MetadataStore, name: str) -> None:
        self.store, self.name, self.events = store, name, Events()
        self.withdraw = store.underreplication.elect_auditor(name, self.events)

    @property
    def is_auditor(self) -> bool:
        with self.events.cond:
            return bool(self.events.calls) and self.events.calls[-1] is True


def _sole_auditor(candidates: list[Candidate]) -> Candidate:
    """Wait until exactly one candidate was last told True, and return it."""
    wait_until(lambda: sum(c.is_auditor for c in candidates) == 1, FAILOVER_S, "exactly one auditor")
    time.sleep(0.2)  # a second auditor would show up now
    leaders = [c for c in candidates if c.is_auditor]
    assert len(leaders) == 1, [c.events.calls for c in candidates]
    return leaders[0]


def test_election_has_exactly_one_auditor_and_fails_over(backend: Backend, store: MetadataStore) -> None:
    assert store.underreplication.current_auditor() is None
    candidates = [Candidate(backend.make(), f"auditor-{i}") for i in range(3)]
    first = _sole_auditor(candidates)
    assert first.name == "auditor-0"  # the lowest vote: the first to stand
    assert store.underreplication.current_auditor() == first.name

    first.withdraw()
    first.withdraw()  # idempotent
    first.events.wait_until(lambda calls: calls == [True, False])
    rest = [c for c in candidates if c is not first]
    started = time.monotonic()
    second = _sole_auditor(rest)
    print(f"failover after withdraw: {time.monotonic() - started:.2f} s")
    assert store.underreplication.current_auditor() == second.name

    backend.expire(second.store)  # the auditor's session expires: it is told False, stands again
    second.events.wait_until(lambda calls: calls[-2:] == [True, False], FAILOVER_S)
    third = _sole_auditor(rest)
    assert third is not second and store.underreplication.current_auditor() == third.name
    wait_until(lambda: len(_votes(store)) == 2, FAILOVER_S, "the expired candidate to stand again")
    third.withdraw()
    assert _sole_auditor(rest) is second  # its new vote on the new session is next
    assert store.underreplication.current_auditor() == second.name
    for c in candidates:
        assert all("underreplication" in name for name in c.events.threads), c.events.threads
        assert all(a != b for a, b in zip(c.events.calls, c.events.calls[1:], strict=False)), c.events.calls


def test_closing_the_auditor_store_hands_over(backend: Backend, store: MetadataStore) -> None:
    a, b = Candidate(backend.make(), "a"), Candidate(backend.make(), "b")
    assert _sole_auditor([a, b]) is a
    a.store.close()
    a.events.wait_until(lambda calls: calls == [True, False])
    assert _sole_auditor([a, b]) is b and store.underreplication.current_auditor() == "b"


def _votes(store: MetadataStore) -> list[str]:
    """The votes, lowest (the auditor's) first."""
    return ordered_votes(store.nodes.children(store.paths.auditor_election) or [])


# -- ZooKeeper down -------------------------------------------------------------------------------------
UR_CALLS: list[Callable[[MetadataStore], object]] = [
    lambda s: s.underreplication.mark_underreplicated(2, ["b:1"]),  # (a write may still land later: not ledger 1)
    lambda s: s.underreplication.list_underreplicated(),
    lambda s: s.underreplication.missing_replicas(1),
    lambda s: s.underreplication.acquire_underreplicated(100),
    lambda s: s.underreplication.mark_replicated(1),
    lambda s: s.underreplication.set_replication_enabled(False),
    lambda s: s.underreplication.is_replication_enabled(),
    lambda s: s.underreplication.lost_bookie_recovery_delay_s(),
    lambda s: s.underreplication.set_lost_bookie_recovery_delay_s(3),
    lambda s: s.underreplication.watch_lost_bookie_recovery_delay(lambda _: None),
    lambda s: s.underreplication.elect_auditor("x", lambda _: None),
    lambda s: s.underreplication.current_auditor(),
]


@pytest.mark.unit
def test_memory_outage_raises_and_recovers() -> None:
    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as s:
        s.cluster.init_cluster()
        s.underreplication.mark_underreplicated(1, ["b:0"])
        assert s.underreplication.acquire_underreplicated(0) == 1
        zk.set_available(False)
        for call in UR_CALLS:
            with pytest.raises(MetadataUnavailableError):
                call(s)
        zk.set_available(True)
        assert s.underreplication.mark_replicated(1) is True


@pytest.mark.integration
def test_zk_down_gives_deadline_errors(tmp_path: Path) -> None:
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk", max_session_timeout_ms=60_000)
    zk.start()
    try:
        s = connect(zk.connect_string, session_timeout_ms=30_000, op_timeout_ms=1000)
        s.cluster.init_cluster()
        s.underreplication.mark_underreplicated(1, ["b:0"])
        assert s.underreplication.acquire_underreplicated(0) == 1
        auditor = Events()
        s.underreplication.elect_auditor("me", auditor)
        auditor.wait_until(lambda calls: calls == [True])
        zk.stop()
        for call in UR_CALLS:
            started = time.monotonic()
            with pytest.raises(MetadataUnavailableError):
                call(s)
            assert time.monotonic() - started < 5
        zk.start()  # same data dir: the session (our lock and vote) outlived the outage
        wait_until(lambda: _answers(s.underreplication.current_auditor) == "me", 30, "ZooKeeper to come back")
        assert auditor.calls == [True]
        assert s.underreplication.mark_replicated(1) is True  # the lock outlived the outage too
        # a vote whose creation timed out may have landed after all: it must not linger
        wait_until(lambda: len(_votes(s)) == 1, 10, "an orphan vote to be removed")
        s.close()
    finally:
        zk.stop()


def _answers(call: Callable[[], object]) -> object:
    try:
        return call()
    except MetadataUnavailableError:
        return None


def test_record_format_is_versioned_json(store: MetadataStore) -> None:
    """Documented in metadata.underreplication.store: operators and other tools read these."""
    store.underreplication.mark_underreplicated(8, ["b:2", "b:1"])
    got = store.nodes.get(store.paths.ur_ledger(8))
    assert got is not None
    body = json.loads(got[0])
    assert body["v"] == 1 and body["missing"] == ["b:1", "b:2"] and body["ctime_ms"] > 0
    store.underreplication.set_lost_bookie_recovery_delay_s(45)
    assert store.nodes.get(store.paths.ur_lost_bookie_recovery_delay) == (b"45", 0, None)
