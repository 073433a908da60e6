"""The contract of ``store.ledgers`` (ledger metadata nodes, typed metadata through the CAS loop,
ledger ids, ledger watches), against a real ZooKeeper and the in-memory twin."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from contract_helpers import ENSEMBLE, Backend, Calls, Recorder, new_md, wait_until

from metadata import (
    BadVersionError,
    InvalidMetadataError,
    LedgerState,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionEvent,
    begin_recovery,
    close,
    set_fragment,
    update_ledger,
)

# -- ledgers ------------------------------------------------------------------------------------
EDGE_IDS = [0, 1, 2, 9999, 10_000, 99_999_999, 100_000_000, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1]


def test_ledger_nodes(store: MetadataStore) -> None:
    for lid in EDGE_IDS:
        assert store.ledgers.create_ledger_node(lid, f"meta-{lid}".encode()) == 0
    assert store.ledgers.ledger_ids() == set(EDGE_IDS)
    assert store.ledgers.read_ledger_node(2**31) == (f"meta-{2**31}".encode(), 0)
    assert store.ledgers.read_ledger_node(3) is None
    with pytest.raises(NodeExistsError):
        store.ledgers.create_ledger_node(1, b"dup")
    store.ledgers.delete_ledger_node(1)
    with pytest.raises(NoNodeError):
        store.ledgers.delete_ledger_node(1)
    with pytest.raises(BadVersionError):
        store.ledgers.delete_ledger_node(2, version=5)
    store.ledgers.delete_ledger_node(2, version=0)
    assert store.ledgers.ledger_ids() == set(EDGE_IDS) - {1, 2}
    with pytest.raises(ValueError):
        store.ledgers.create_ledger_node(-1, b"")
    with pytest.raises(ValueError):
        store.ledgers.create_ledger_node(2**63, b"")


def test_ledger_ids_with_thousands_of_ledgers(store: MetadataStore) -> None:
    rng = random.Random(1234)
    ids = (
        set(range(2500))
        | {rng.randrange(2**63) for _ in range(500)}
        | {rng.randrange(10**9) for _ in range(500)}
    )
    with ThreadPoolExecutor(8) as pool:  # concurrent requests pipeline on the one session
        assert set(pool.map(lambda lid: store.ledgers.create_ledger_node(lid, b""), ids)) == {0}
    store.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)  # cluster nodes are not ledgers
    store.cluster.write_cookie("b:1", b"c", None)
    started = time.monotonic()
    assert store.ledgers.ledger_ids() == ids
    print(f"ledger_ids of {len(ids)} ledgers took {time.monotonic() - started:.2f} s")


# -- typed ledger metadata ----------------------------------------------------------------------
def test_ledger_metadata_crud(store: MetadataStore) -> None:
    lid = store.ledgers.generate_ledger_id()
    md = new_md(lid, app=b"x")
    assert store.ledgers.create_ledger_metadata(md) == 0
    with pytest.raises(NodeExistsError):
        store.ledgers.create_ledger_metadata(md)
    assert store.ledgers.read_ledger_metadata(lid) == (md, 0)
    closed = close(md, 4, 50)
    assert store.ledgers.write_ledger_metadata(closed, 0) == 1
    with pytest.raises(BadVersionError):
        store.ledgers.write_ledger_metadata(md, 0)
    with pytest.raises(ValueError, match="compare-and-set"):
        store.ledgers.write_ledger_metadata(md, -1)
    assert store.ledgers.read_ledger_metadata(lid) == (closed, 1)
    other = store.ledgers.generate_ledger_id()
    store.ledgers.create_ledger_metadata(new_md(other))
    store.ledgers.create_ledger_metadata(new_md(2**40))
    assert store.ledgers.list_ledgers() == sorted({lid, other, 2**40})
    with pytest.raises(BadVersionError):
        store.ledgers.delete_ledger_metadata(lid, version=0)
    store.ledgers.delete_ledger_metadata(lid, version=1)
    with pytest.raises(NoNodeError, match=f"ledger {lid}"):
        store.ledgers.read_ledger_metadata(lid)
    # the batched read (the auditor's scan): in order, None for a ledger that is not there
    got = store.ledgers.read_ledger_metadata_many([2**40, lid, other])
    assert got[1] is None and [(x[0].ledger_id, x[1]) for x in (got[0], got[2]) if x] == [(2**40, 0), (other, 0)]
    assert got[2] == store.ledgers.read_ledger_metadata(other)
    assert store.ledgers.read_ledger_metadata_many([]) == []
    with pytest.raises(NoNodeError):
        store.ledgers.delete_ledger_metadata(lid)
    with pytest.raises(NoNodeError):
        store.ledgers.write_ledger_metadata(closed, 1)
    store.ledgers.delete_ledger_metadata(other)
    assert store.ledgers.list_ledgers() == [2**40]
    store.ledgers.create_ledger_node(5, b"not metadata")
    with pytest.raises(InvalidMetadataError, match="ledger 5"):
        store.ledgers.read_ledger_metadata(5)


def test_update_loop_between_sessions(backend: Backend, store: MetadataStore) -> None:
    """Writers on different sessions race through the one CAS loop; every change lands once."""
    store.ledgers.create_ledger_metadata(new_md(1))
    others = [backend.make() for _ in range(4)]

    def append(s: MetadataStore, first: int) -> None:
        update_ledger(s.ledgers, 1, lambda md: set_fragment(md, first, ENSEMBLE) if first > max(md.ensembles) else md,
                      retries_max=200, backoff_ms=1)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(append, others, [10, 20, 30, 40]))
    md, version = store.ledgers.read_ledger_metadata(1)
    assert max(md.ensembles) == 40 and 1 <= version <= 4
    md, version = update_ledger(store.ledgers, 1, begin_recovery)
    md, version = update_ledger(others[0].ledgers, 1, partial(close, last_entry_id=44, length=440))
    assert md.state is LedgerState.CLOSED and store.ledgers.read_ledger_metadata(1) == (md, version)


def test_ledger_operations_need_an_initialised_cluster(backend: Backend) -> None:
    fresh = backend.make()
    with pytest.raises(NoNodeError, match="init"):
        fresh.ledgers.generate_ledger_id()
    with pytest.raises(NoNodeError, match="init"):
        fresh.ledgers.list_ledgers()


def test_generated_ledger_ids_are_unique_and_increasing(backend: Backend, store: MetadataStore) -> None:
    def many(s: MetadataStore) -> list[int]:
        return [s.ledgers.generate_ledger_id() for _ in range(50)]

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(many, [store, backend.make(), backend.make(), store]))
    ids = [i for run in runs for i in run]
    assert len(set(ids)) == len(ids) == 200 and min(ids) > 0
    assert all(run == sorted(run) for run in runs)


def test_ledger_ids_continue_above_the_sequential_scheme(backend: Backend, store: MetadataStore) -> None:
    """A cluster whose ids came from LongZkLedgerIdGenerator's sequential nodes (here: far into
    HOB 3) keeps them: the counter starts above every id that scheme handed out."""
    idgen = store.paths.idgen
    store.nodes.create(f"{idgen}/HOB-0000000003", makepath=True)
    old = [(3 << 32) | store.nodes.take_sequence(f"{idgen}/HOB-0000000003/ID-") for _ in range(5)]
    a, b = store, backend.make()
    ids = [s.ledgers.generate_ledger_id() for _ in range(10) for s in (a, b)]
    assert len(set(ids)) == len(ids) and min(ids) > max(old)
    assert ids[0::2] == sorted(ids[0::2]) and ids[1::2] == sorted(ids[1::2])   # each client's in order


def test_a_client_creating_many_ledgers_claims_ids_in_blocks(store: MetadataStore) -> None:
    """Ids cost ZooKeeper writes per block, not per ledger (issue 33: the sequential scheme's two
    writes per id were half of a ledger's creation); a second client's first id is one write."""
    writes = {"n": 0}
    nodes = store.nodes
    for name in ("create", "set", "delete", "take_sequence", "pipeline", "multi"):
        real = getattr(nodes, name)

        def counted(*args, _real=real, **kwargs):  # type: ignore[no-untyped-def]
            writes["n"] += 1
            return _real(*args, **kwargs)

        setattr(nodes, name, counted)
    ids = [store.ledgers.generate_ledger_id() for _ in range(2_000)]
    assert len(set(ids)) == 2_000 and ids == sorted(ids)
    assert writes["n"] <= 16, f"{writes['n']} metadata writes for 2,000 ids"


def test_concurrent_creates_and_writes_share_round_trips_and_keep_their_own_answers(backend: Backend,
                                                                                     store: MetadataStore) -> None:
    """Threads of one client creating and closing ledgers at once go as multi-ops (issue 33); a
    clash inside a batch is that request's answer alone (an existing id, a stale version), and a
    ledger whose bucket is missing is still created."""
    store.ledgers.create_ledger_node(5_000_007, b"taken")
    requests = {"n": 0}
    nodes = store.nodes
    for name in ("create", "set", "multi"):
        real = getattr(nodes, name)

        def counted(*args, _real=real, **kwargs):  # type: ignore[no-untyped-def]
            requests["n"] += 1
            return _real(*args, **kwargs)

        setattr(nodes, name, counted)
    ids = [5_000_000 + i for i in range(200)] + [9_000_000_000 + i for i in range(0, 400_000, 10_000)]

    def create(lid: int) -> str:
        try:
            return str(store.ledgers.create_ledger_node(lid, b"m"))
        except NodeExistsError:
            return "exists"

    with ThreadPoolExecutor(16) as pool:
        created = list(pool.map(create, ids))
    assert created.count("exists") == 1 and created[ids.index(5_000_007)] == "exists"
    assert all(store.ledgers.read_ledger_node(lid) is not None for lid in ids)
    creates = requests["n"]

    def write(lid: int) -> str:
        try:
            return str(store.ledgers.write_ledger_node(lid, b"closed", 1 if lid == 5_000_011 else 0))
        except BadVersionError:
            return "stale"

    with ThreadPoolExecutor(16) as pool:
        written = list(pool.map(write, [lid for lid in ids if lid != 5_000_007]))
    assert written.count("stale") == 1 and set(written) == {"1", "stale"}
    assert store.ledgers.read_ledger_node(5_000_011) == (b"m", 0)
    print(f"{len(ids)} creates in {creates} requests, {len(written)} writes in {requests['n'] - creates}")
    if backend.kind == "zk":   # the twin answers before a second thread asks: nothing queues to share
        assert requests["n"] < len(ids) + len(written) - 100, requests


def test_watch_ledger_metadata(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    md = new_md(3)
    writer.ledgers.create_ledger_metadata(md)
    calls = Calls()
    cancel = store.ledgers.watch_ledger_metadata(3, calls)
    assert calls.wait_for(1) == [(md, 0)]  # the current state first
    recovering, _ = update_ledger(writer.ledgers, 3, begin_recovery)
    assert calls.wait_for(2)[1] == (recovering, 1)
    closed, _ = update_ledger(writer.ledgers, 3, partial(close, last_entry_id=9, length=90))
    assert calls.wait_for(3)[2] == (closed, 2)
    update_ledger(writer.ledgers, 3, partial(close, last_entry_id=9, length=90))  # no change: no call
    writer.ledgers.delete_ledger_metadata(3)
    assert calls.wait_for(4)[3] == (None, -1)
    writer.ledgers.create_ledger_metadata(md)  # the watch ended with the deletion
    time.sleep(0.5)
    assert len(calls.calls) == 4
    cancel()
    cancel()  # idempotent
    assert all("watches" in name for name in calls.threads), calls.threads

    missing = Calls()
    store.ledgers.watch_ledger_metadata(12345, missing)
    assert missing.wait_for(1) == [(None, -1)]


def test_cancelled_ledger_watch_stays_quiet(backend: Backend, store: MetadataStore) -> None:
    store.ledgers.create_ledger_metadata(new_md(4))
    kept, dropped = Calls(), Calls()
    store.ledgers.watch_ledger_metadata(4, kept)
    cancel = store.ledgers.watch_ledger_metadata(4, dropped)
    dropped.wait_for(1)
    cancel()
    update_ledger(store.ledgers, 4, begin_recovery)
    assert kept.wait_for(2)[1][1] == 1
    time.sleep(0.3)
    assert len(dropped.calls) == 1


def test_watches_survive_session_expiry(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    writer.ledgers.create_ledger_metadata(new_md(6))
    events, ledger_calls, bookie_calls = Recorder(), Calls(), Calls()
    store.add_session_listener(events)
    store.ledgers.watch_ledger_metadata(6, ledger_calls)
    store.cluster.watch_bookies(bookie_calls)
    ledger_calls.wait_for(1)
    bookie_calls.wait_for(1)
    backend.expire(store)
    events.wait_for(SessionEvent.LOST, SessionEvent.CONNECTED)
    update_ledger(writer.ledgers, 6, begin_recovery)
    writer.cluster.register_bookie("b:9", readonly=False, wait_ms_max=0)
    assert ledger_calls.wait_for(2)[-1][1] == 1
    wait_until(lambda: bookie_calls.calls[-1] == (["b:9"], []), 30, "the bookie watch to see b:9")


