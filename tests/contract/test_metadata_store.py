"""One contract for every MetadataStore: the same tests against a real ZooKeeper and the in-memory twin.

The twin exists so higher layers can be tested fast; these tests are what keeps it honest. Each
test gets a fresh root (a chroot-like prefix) so tests never see each other's nodes.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from metadata import (
    BadVersionError,
    DigestType,
    InMemoryMetadataStore,
    InMemoryZooKeeper,
    InvalidMetadataError,
    LedgerMetadata,
    LedgerState,
    MetadataStore,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    SessionEvent,
    StoreClosedError,
    begin_recovery,
    close,
    connect,
    set_fragment,
    update_ledger,
)
from metadata.layout import LAYOUT_TEXT

SESSION_TIMEOUT_MS = 2000  # the smallest the embedded ZooKeeper allows (its min_session_timeout_ms)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Backend:
    """How a test makes stores of one cluster, and simulates failures, for one implementation."""

    kind: str
    make: Callable[[], MetadataStore]  # a new store (= a new session) on the test's root
    hold_registration: Callable[[str], Callable[[], None]]  # another live session registers an id;
    #                                                         returns "kill -9 that process"
    expire: Callable[[MetadataStore], None]  # expire a store's session on the server side


class Recorder:
    """A session listener that records events and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, event: str) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, *expected: str, timeout_s: float = 30.0) -> None:
        """Wait until ``expected`` occurred in this order (other events may come between)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not _is_subsequence(list(expected), self.events):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"expected {expected} in order, got {self.events}"
                self._cond.wait(remaining)


def _is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- backends -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zk_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real embedded ZooKeeper for this module (started only if a ZooKeeper test runs)."""
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    with EmbeddedZooKeeper(free_port(), tmp_path_factory.mktemp("zk-contract")) as zk:
        yield zk.connect_string


def _memory_backend(stores: list[MetadataStore]) -> Backend:
    zk = InMemoryZooKeeper(session_timeout_ms=SESSION_TIMEOUT_MS)
    root = f"/t-{uuid.uuid4().hex[:8]}/ledgers"

    def make() -> MetadataStore:
        store = InMemoryMetadataStore(zk, root=root)
        stores.append(store)
        return store

    def hold(bookie_id: str) -> Callable[[], None]:
        other = InMemoryMetadataStore(zk, root=root)
        other.register_bookie(bookie_id, readonly=False, wait_ms_max=0)
        return other.crash

    def expire(store: MetadataStore) -> None:
        assert isinstance(store, InMemoryMetadataStore)
        store.expire_session()

    return Backend("memory", make, hold, expire)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from metadata.zk.store import ZkMetadataStore
    store = ZkMetadataStore(sys.argv[1], session_timeout_ms=int(sys.argv[3]))
    store.register_bookie(sys.argv[2], readonly=False, wait_ms_max=0)
    print("registered", flush=True)
    time.sleep(600)
    """
)


def _zk_backend(hosts: str, stores: list[MetadataStore]) -> Backend:
    connect_string = f"{hosts}/t-{uuid.uuid4().hex[:8]}/ledgers"

    def make() -> MetadataStore:
        store = connect(connect_string, session_timeout_ms=SESSION_TIMEOUT_MS, op_timeout_ms=5000)
        stores.append(store)
        return store

    def hold(bookie_id: str) -> Callable[[], None]:
        """A real other process holds the registration; kill -9 leaves its session to time out."""
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, connect_string, bookie_id, str(SESSION_TIMEOUT_MS)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"

        def kill() -> None:
            proc.kill()
            proc.wait()

        return kill

    return Backend("zk", make, hold, _expire_zk_session)


def _expire_zk_session(store: MetadataStore) -> None:
    """Expire the store's session as a long partition would (kazoo stays under metadata/zk/)."""
    from metadata.zk.testing import expire_session

    expire_session(store, timeout_s=SESSION_TIMEOUT_MS / 1000)


@pytest.fixture(
    params=[pytest.param("memory", marks=pytest.mark.unit), pytest.param("zk", marks=pytest.mark.integration)]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    stores: list[MetadataStore] = []
    if request.param == "memory":
        yield _memory_backend(stores)
    else:
        yield _zk_backend(request.getfixturevalue("zk_module"), stores)
    for store in stores:
        store.close()


@pytest.fixture
def store(backend: Backend) -> MetadataStore:
    """An initialised cluster and one session on it."""
    s = backend.make()
    s.init_cluster()
    return s


# -- cluster ------------------------------------------------------------------------------------
def test_init_cluster_is_idempotent_and_race_safe(backend: Backend) -> None:
    first = backend.make()
    with pytest.raises(NoNodeError, match="init"):
        first.instance_id()
    others = [backend.make() for _ in range(3)]
    results: list[str] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.init_cluster())) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert uuid.UUID(results[0])
    assert first.init_cluster() == results[0] == first.instance_id()
    assert first.list_bookies() == [] and first.list_bookies(readonly=True) == []
    assert first.ledger_ids() == set()


def test_layout_text_matches_bookkeeper() -> None:
    assert LAYOUT_TEXT == "2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1"


# -- registration -------------------------------------------------------------------------------
def test_register_list_unregister(store: MetadataStore) -> None:
    store.register_bookie("10.0.0.1:3181", readonly=False, data=b"info", wait_ms_max=0)
    store.register_bookie("10.0.0.2:3181", readonly=False, wait_ms_max=0)
    store.register_bookie("10.0.0.3:3181", readonly=True, wait_ms_max=0)
    store.register_bookie("10.0.0.1:3181", readonly=False, data=b"again", wait_ms_max=0)  # idempotent
    assert store.list_bookies() == ["10.0.0.1:3181", "10.0.0.2:3181"]  # no "readonly" child
    assert store.list_bookies(readonly=True) == ["10.0.0.3:3181"]
    store.unregister_bookie("10.0.0.1:3181", readonly=False)
    store.unregister_bookie("10.0.0.1:3181", readonly=False)  # idempotent
    store.unregister_bookie("10.0.0.3:3181", readonly=True)
    assert store.list_bookies() == ["10.0.0.2:3181"]
    assert store.list_bookies(readonly=True) == []


def test_register_needs_initialised_cluster(backend: Backend) -> None:
    with pytest.raises(NoNodeError, match="spark-bookie init"):
        backend.make().register_bookie("b:1", readonly=False, wait_ms_max=0)


def test_registration_is_ephemeral(backend: Backend, store: MetadataStore) -> None:
    other = backend.make()
    other.register_bookie("b:1", readonly=False, wait_ms_max=0)
    assert store.list_bookies() == ["b:1"]
    other.close()
    wait_until(lambda: store.list_bookies() == [], 10, "the closed session's node to go")


def test_live_registration_of_another_session_is_respected(backend: Backend, store: MetadataStore) -> None:
    other = backend.make()
    other.register_bookie("b:1", readonly=False, wait_ms_max=0)
    started = time.monotonic()
    with pytest.raises(NodeExistsError, match="b:1"):
        store.register_bookie("b:1", readonly=False, wait_ms_max=600)
    assert time.monotonic() - started >= 0.5
    store.unregister_bookie("b:1", readonly=False)  # not ours: must not delete it
    assert store.list_bookies() == ["b:1"]


def test_stale_registration_of_a_dead_process_is_waited_for(backend: Backend, store: MetadataStore) -> None:
    kill = backend.hold_registration("b:1")
    try:
        assert store.list_bookies() == ["b:1"]
    finally:
        kill()
    with pytest.raises(NodeExistsError, match="already registered"):
        store.register_bookie("b:1", readonly=False, wait_ms_max=200)  # session still alive
    started = time.monotonic()
    store.register_bookie("b:1", readonly=False, wait_ms_max=20_000)
    assert time.monotonic() - started < 15
    assert store.list_bookies() == ["b:1"]


def test_registration_comes_back_after_session_expiry(backend: Backend, store: MetadataStore) -> None:
    events = Recorder()
    store.add_session_listener(events)
    store.register_bookie("b:1", readonly=False, data=b"d", wait_ms_max=0)
    store.register_bookie("b:2", readonly=True, wait_ms_max=0)
    store.unregister_bookie("b:2", readonly=True)
    store.write_cookie("b:1", b"cookie", None)
    backend.expire(store)
    events.wait_for(SessionEvent.LOST, SessionEvent.CONNECTED)
    assert store.read_cookie("b:1") == (b"cookie", 0)  # persistent nodes are untouched
    assert store.list_bookies() == ["b:1"]  # re-created before CONNECTED was reported
    assert store.list_bookies(readonly=True) == []  # unregistered ones stay gone
    observer = backend.make()
    assert observer.list_bookies() == ["b:1"]
    store.close()
    wait_until(lambda: observer.list_bookies() == [], 10, "registration to go with the closed store")


# -- application data ---------------------------------------------------------------------------
def test_app_data_put_get_list_delete(backend: Backend, store: MetadataStore) -> None:
    assert store.get_app_data("spark/stop") is None
    assert store.list_app_data("spark") == []
    store.put_app_data("spark/slots/0", b"a")
    store.put_app_data("spark/slots/1", b"b")
    store.put_app_data("spark/slots/0", b"a2")  # overwrite, last writer wins
    other = backend.make()  # another session sees it: persistent, not ephemeral
    assert other.get_app_data("spark/slots/0") == b"a2"
    assert other.list_app_data("spark/slots") == ["0", "1"]
    assert store.ledger_ids() == set()  # never mistaken for ledgers
    store.delete_app_data("spark")  # the whole subtree
    assert other.get_app_data("spark/slots/1") is None and other.list_app_data("spark") == []
    store.delete_app_data("spark")  # absent: no error


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "../x", "a/./b"])
def test_app_data_rejects_bad_keys(store: MetadataStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put_app_data(key, b"")


# -- cookies ------------------------------------------------------------------------------------
def test_cookie_cas(store: MetadataStore) -> None:
    assert store.read_cookie("b:1") is None
    assert store.write_cookie("b:1", b"v0", None) == 0
    with pytest.raises(NodeExistsError):
        store.write_cookie("b:1", b"again", None)
    assert store.read_cookie("b:1") == (b"v0", 0)
    assert store.write_cookie("b:1", b"v1", 0) == 1
    with pytest.raises(BadVersionError):
        store.write_cookie("b:1", b"lost", 0)
    assert store.read_cookie("b:1") == (b"v1", 1)
    with pytest.raises(BadVersionError):
        store.delete_cookie("b:1", 0)
    store.delete_cookie("b:1", 1)
    assert store.read_cookie("b:1") is None
    with pytest.raises(NoNodeError):
        store.delete_cookie("b:1", -1)
    with pytest.raises(NoNodeError):
        store.write_cookie("b:1", b"x", 3)


# -- ledgers ------------------------------------------------------------------------------------
EDGE_IDS = [0, 1, 2, 9999, 10_000, 99_999_999, 100_000_000, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1]


def test_ledger_nodes(store: MetadataStore) -> None:
    for lid in EDGE_IDS:
        assert store.create_ledger_node(lid, f"meta-{lid}".encode()) == 0
    assert store.ledger_ids() == set(EDGE_IDS)
    assert store.read_ledger_node(2**31) == (f"meta-{2**31}".encode(), 0)
    assert store.read_ledger_node(3) is None
    with pytest.raises(NodeExistsError):
        store.create_ledger_node(1, b"dup")
    store.delete_ledger_node(1)
    with pytest.raises(NoNodeError):
        store.delete_ledger_node(1)
    with pytest.raises(BadVersionError):
        store.delete_ledger_node(2, version=5)
    store.delete_ledger_node(2, version=0)
    assert store.ledger_ids() == set(EDGE_IDS) - {1, 2}
    with pytest.raises(ValueError):
        store.create_ledger_node(-1, b"")
    with pytest.raises(ValueError):
        store.create_ledger_node(2**63, b"")


def test_ledger_ids_with_thousands_of_ledgers(store: MetadataStore) -> None:
    rng = random.Random(1234)
    ids = (
        set(range(2500))
        | {rng.randrange(2**63) for _ in range(500)}
        | {rng.randrange(10**9) for _ in range(500)}
    )
    with ThreadPoolExecutor(8) as pool:  # concurrent requests pipeline on the one session
        assert set(pool.map(lambda lid: store.create_ledger_node(lid, b""), ids)) == {0}
    store.register_bookie("b:1", readonly=False, wait_ms_max=0)  # cluster nodes are not ledgers
    store.write_cookie("b:1", b"c", None)
    started = time.monotonic()
    assert store.ledger_ids() == ids
    print(f"ledger_ids of {len(ids)} ledgers took {time.monotonic() - started:.2f} s")


# -- typed ledger metadata ----------------------------------------------------------------------
ENSEMBLE = ["b1:3181", "b2:3181", "b3:3181"]


def new_md(ledger_id: int, **custom: bytes) -> LedgerMetadata:
    return LedgerMetadata.new_open(
        ledger_id, ENSEMBLE, write_quorum_size=3, ack_quorum_size=2, digest_type=DigestType.CRC32C,
        password=b"pw", custom_metadata=custom,
    )


class Calls:
    """A watch callback that records its calls (and the thread they came on) for a test to wait on."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.threads: set[str] = set()
        self._cond = threading.Condition()

    def __call__(self, *args: Any) -> None:
        with self._cond:
            self.calls.append(args)
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.calls) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"expected {count} calls, got {self.calls}"
                self._cond.wait(remaining)
            return list(self.calls)


def test_ledger_metadata_crud(store: MetadataStore) -> None:
    lid = store.generate_ledger_id()
    md = new_md(lid, app=b"x")
    assert store.create_ledger_metadata(md) == 0
    with pytest.raises(NodeExistsError):
        store.create_ledger_metadata(md)
    assert store.read_ledger_metadata(lid) == (md, 0)
    closed = close(md, 4, 50)
    assert store.write_ledger_metadata(closed, 0) == 1
    with pytest.raises(BadVersionError):
        store.write_ledger_metadata(md, 0)
    with pytest.raises(ValueError, match="compare-and-set"):
        store.write_ledger_metadata(md, -1)
    assert store.read_ledger_metadata(lid) == (closed, 1)
    other = store.generate_ledger_id()
    store.create_ledger_metadata(new_md(other))
    store.create_ledger_metadata(new_md(2**40))
    assert store.list_ledgers() == sorted({lid, other, 2**40})
    with pytest.raises(BadVersionError):
        store.delete_ledger_metadata(lid, version=0)
    store.delete_ledger_metadata(lid, version=1)
    with pytest.raises(NoNodeError, match=f"ledger {lid}"):
        store.read_ledger_metadata(lid)
    # the batched read (the auditor's scan): in order, None for a ledger that is not there
    got = store.read_ledger_metadata_many([2**40, lid, other])
    assert got[1] is None and [(x[0].ledger_id, x[1]) for x in (got[0], got[2]) if x] == [(2**40, 0), (other, 0)]
    assert got[2] == store.read_ledger_metadata(other)
    assert store.read_ledger_metadata_many([]) == []
    with pytest.raises(NoNodeError):
        store.delete_ledger_metadata(lid)
    with pytest.raises(NoNodeError):
        store.write_ledger_metadata(closed, 1)
    store.delete_ledger_metadata(other)
    assert store.list_ledgers() == [2**40]
    store.create_ledger_node(5, b"not metadata")
    with pytest.raises(InvalidMetadataError, match="ledger 5"):
        store.read_ledger_metadata(5)


def test_update_loop_between_sessions(backend: Backend, store: MetadataStore) -> None:
    """Writers on different sessions race through the one CAS loop; every change lands once."""
    store.create_ledger_metadata(new_md(1))
    others = [backend.make() for _ in range(4)]

    def append(s: MetadataStore, first: int) -> None:
        update_ledger(s, 1, lambda md: set_fragment(md, first, ENSEMBLE) if first > max(md.ensembles) else md,
                      retries_max=200, backoff_ms=1)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(append, others, [10, 20, 30, 40]))
    md, version = store.read_ledger_metadata(1)
    assert max(md.ensembles) == 40 and 1 <= version <= 4
    md, version = update_ledger(store, 1, begin_recovery)
    md, version = update_ledger(others[0], 1, partial(close, last_entry_id=44, length=440))
    assert md.state is LedgerState.CLOSED and store.read_ledger_metadata(1) == (md, version)


def test_ledger_operations_need_an_initialised_cluster(backend: Backend) -> None:
    fresh = backend.make()
    with pytest.raises(NoNodeError, match="init"):
        fresh.generate_ledger_id()
    with pytest.raises(NoNodeError, match="init"):
        fresh.watch_bookies(Calls())
    with pytest.raises(NoNodeError, match="init"):
        fresh.list_ledgers()


def test_generated_ledger_ids_are_unique_and_increasing(backend: Backend, store: MetadataStore) -> None:
    def many(s: MetadataStore) -> list[int]:
        return [s.generate_ledger_id() for _ in range(50)]

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(many, [store, backend.make(), backend.make(), store]))
    ids = [i for run in runs for i in run]
    assert len(set(ids)) == len(ids) == 200 and min(ids) > 0
    assert all(run == sorted(run) for run in runs)


@pytest.mark.integration
def test_zk_ledger_ids_move_past_the_31_bit_sequence(zk_module: str) -> None:
    """LongZkLedgerIdGenerator's scheme: when a HOB's sequence is used up, ids continue above 2**32."""
    from metadata.zk.store import ZkMetadataStore

    root = f"{zk_module}/t-{uuid.uuid4().hex[:8]}/ledgers"
    with ZkMetadataStore(root) as a, ZkMetadataStore(root) as b:
        a.init_cluster()
        a._idgen_low_limit = b._idgen_low_limit = 7  # a tiny "2**31" so the roll-over happens here
        ids = [s.generate_ledger_id() for _ in range(10) for s in (a, b)]
        assert len(set(ids)) == len(ids) and ids == sorted(ids)  # b's stale HOB cache moves on too
        assert any(i >= 2**32 for i in ids) and max(ids) < 2**40
        assert all(i & 0xFFFF_FFFF < 7 for i in ids)


def test_watch_ledger_metadata(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    md = new_md(3)
    writer.create_ledger_metadata(md)
    calls = Calls()
    cancel = store.watch_ledger_metadata(3, calls)
    assert calls.wait_for(1) == [(md, 0)]  # the current state first
    recovering, _ = update_ledger(writer, 3, begin_recovery)
    assert calls.wait_for(2)[1] == (recovering, 1)
    closed, _ = update_ledger(writer, 3, partial(close, last_entry_id=9, length=90))
    assert calls.wait_for(3)[2] == (closed, 2)
    update_ledger(writer, 3, partial(close, last_entry_id=9, length=90))  # no change: no call
    writer.delete_ledger_metadata(3)
    assert calls.wait_for(4)[3] == (None, -1)
    writer.create_ledger_metadata(md)  # the watch ended with the deletion
    time.sleep(0.5)
    assert len(calls.calls) == 4
    cancel()
    cancel()  # idempotent
    assert all("watches" in name for name in calls.threads), calls.threads

    missing = Calls()
    store.watch_ledger_metadata(12345, missing)
    assert missing.wait_for(1) == [(None, -1)]


def test_cancelled_ledger_watch_stays_quiet(backend: Backend, store: MetadataStore) -> None:
    store.create_ledger_metadata(new_md(4))
    kept, dropped = Calls(), Calls()
    store.watch_ledger_metadata(4, kept)
    cancel = store.watch_ledger_metadata(4, dropped)
    dropped.wait_for(1)
    cancel()
    update_ledger(store, 4, begin_recovery)
    assert kept.wait_for(2)[1][1] == 1
    time.sleep(0.3)
    assert len(dropped.calls) == 1


def test_watches_survive_session_expiry(backend: Backend, store: MetadataStore) -> None:
    writer = backend.make()
    writer.create_ledger_metadata(new_md(6))
    events, ledger_calls, bookie_calls = Recorder(), Calls(), Calls()
    store.add_session_listener(events)
    store.watch_ledger_metadata(6, ledger_calls)
    store.watch_bookies(bookie_calls)
    ledger_calls.wait_for(1)
    bookie_calls.wait_for(1)
    backend.expire(store)
    events.wait_for(SessionEvent.LOST, SessionEvent.CONNECTED)
    update_ledger(writer, 6, begin_recovery)
    writer.register_bookie("b:9", readonly=False, wait_ms_max=0)
    assert ledger_calls.wait_for(2)[-1][1] == 1
    wait_until(lambda: bookie_calls.calls[-1] == (["b:9"], []), 30, "the bookie watch to see b:9")


def test_watch_bookies(backend: Backend, store: MetadataStore) -> None:
    calls = Calls()
    cancel = store.watch_bookies(calls)
    assert calls.wait_for(1) == [([], [])]  # at once, both lists
    other = backend.make()
    other.register_bookie("b:2", readonly=False, wait_ms_max=0)
    other.register_bookie("b:1", readonly=False, wait_ms_max=0)
    other.register_bookie("b:3", readonly=True, wait_ms_max=0)
    wait_until(lambda: calls.calls[-1] == (["b:1", "b:2"], ["b:3"]), 30, "all three registrations")
    assert all(w == sorted(w) and "readonly" not in w for w, _ in calls.calls)
    other.close()
    wait_until(lambda: calls.calls[-1] == ([], []), 30, "the closed session's bookies to go")
    seen = len(calls.calls)
    cancel()
    store.register_bookie("b:4", readonly=False, wait_ms_max=0)
    time.sleep(0.3)
    assert len(calls.calls) == seen
    assert all("watches" in name for name in calls.threads), calls.threads


def test_bookie_info(store: MetadataStore) -> None:
    info = {"id": "h:1", "address": "10.0.0.1:3181", "network_location": "/rack1"}
    store.register_bookie("h:1", readonly=False, data=json.dumps(info).encode(), wait_ms_max=0)
    store.register_bookie("h:2", readonly=True, data=b'{"id": "h:2", "port": 3181}', wait_ms_max=0)
    store.register_bookie("h:3", readonly=False, data=b"not json", wait_ms_max=0)
    store.register_bookie("h:4", readonly=False, data=b"[1, 2]", wait_ms_max=0)
    assert store.bookie_info("h:1") == info
    assert store.bookie_info("h:2") == {"id": "h:2", "port": "3181"}
    assert store.bookie_info("h:3") == {} and store.bookie_info("h:4") == {}
    assert store.bookie_info("nobody:1") == {}


# -- session and lifecycle ----------------------------------------------------------------------
def test_closed_store_refuses_calls(backend: Backend) -> None:
    s = backend.make()
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.list_bookies()


def test_context_manager_closes(backend: Backend) -> None:
    with backend.make() as s:
        s.init_cluster()
    with pytest.raises(StoreClosedError):
        s.instance_id()


# -- outages (each backend has its own way to take "ZooKeeper" down) ----------------------------
@pytest.mark.unit
def test_memory_outage_raises_and_recovers() -> None:
    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as s:
        s.init_cluster()
        events = Recorder()
        s.add_session_listener(events)
        s.register_bookie("b:1", readonly=False, wait_ms_max=0)
        zk.set_available(False)
        for call in (
            s.list_bookies,
            lambda: s.write_cookie("b:1", b"", None),
            s.generate_ledger_id,
            lambda: s.read_ledger_metadata(1),
            lambda: s.watch_ledger_metadata(1, Calls()),
            lambda: s.watch_bookies(Calls()),
            lambda: s.bookie_info("b:1"),
        ):
            with pytest.raises(MetadataUnavailableError):
                call()
        zk.set_available(True)
        events.wait_for(SessionEvent.SUSPENDED, SessionEvent.CONNECTED)
        assert s.list_bookies() == ["b:1"]


@pytest.mark.unit
def test_memory_connect_factory() -> None:
    name = uuid.uuid4().hex
    with connect(f"memory://{name}/custom") as a, connect(f"memory://{name}/custom") as b:
        assert a.init_cluster() == b.instance_id()
        assert isinstance(a, InMemoryMetadataStore) and a.paths.root == "/custom"


@pytest.mark.integration
def test_zk_unreachable_fails_fast() -> None:
    from spark_bookie.local.zookeeper import free_port

    started = time.monotonic()
    with pytest.raises(MetadataUnavailableError, match="could not connect"):
        connect(f"127.0.0.1:{free_port()}", connect_timeout_ms=1000)
    assert time.monotonic() - started < 10


@pytest.mark.integration
def test_zk_down_gives_deadline_errors_and_session_survives_short_outage(tmp_path: Path) -> None:
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk", max_session_timeout_ms=60_000)
    zk.start()
    try:
        s = connect(zk.connect_string, session_timeout_ms=30_000, op_timeout_ms=1500)
        events = Recorder()
        s.add_session_listener(events)
        s.init_cluster()
        s.register_bookie("b:1", readonly=False, wait_ms_max=0)
        s.create_ledger_metadata(new_md(1))
        watched = Calls()
        s.watch_ledger_metadata(1, watched)
        watched.wait_for(1)
        zk.stop()
        events.wait_for(SessionEvent.SUSPENDED)
        for call in (
            s.list_bookies,
            s.ledger_ids,
            lambda: s.write_cookie("b:1", b"", None),
            s.generate_ledger_id,
            lambda: s.read_ledger_metadata(1),
            lambda: update_ledger(s, 1, begin_recovery),
            lambda: s.watch_ledger_metadata(1, Calls()),
            lambda: s.watch_bookies(Calls()),
            lambda: s.bookie_info("b:1"),
        ):
            started = time.monotonic()
            with pytest.raises(MetadataUnavailableError):
                call()
            assert time.monotonic() - started < 5
        zk.start()  # same data dir: the session is still within its timeout
        events.wait_for(SessionEvent.SUSPENDED, SessionEvent.CONNECTED)
        assert "LOST" not in events.events
        assert s.list_bookies() == ["b:1"]
        update_ledger(s, 1, begin_recovery)  # kazoo dropped the watch on suspension: re-armed
        assert watched.wait_for(2)[1][1] == 1
        s.close()
    finally:
        zk.stop()
