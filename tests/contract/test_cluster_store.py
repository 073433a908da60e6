"""The contract of ``store.cluster`` (layout, instance id, bookie registrations and their watch,
cookies, application data), against a real ZooKeeper and the in-memory twin."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from contract_helpers import Backend, Calls, Recorder, wait_until

from metadata import (
    BadVersionError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionEvent,
)
from metadata.layout import LAYOUT_TEXT


# -- cluster ------------------------------------------------------------------------------------
def test_init_cluster_is_idempotent_and_race_safe(backend: Backend) -> None:
    first = backend.make()
    with pytest.raises(NoNodeError, match="init"):
        first.cluster.instance_id()
    others = [backend.make() for _ in range(3)]
    results: list[str] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.cluster.init_cluster())) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert uuid.UUID(results[0])
    assert first.cluster.init_cluster() == results[0] == first.cluster.instance_id()
    assert first.cluster.list_bookies() == [] and first.cluster.list_bookies(readonly=True) == []
    assert first.ledgers.ledger_ids() == set()


def test_layout_text_matches_bookkeeper() -> None:
    assert LAYOUT_TEXT == "2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1"


# -- registration -------------------------------------------------------------------------------
def test_register_list_unregister(store: MetadataStore) -> None:
    store.cluster.register_bookie("10.0.0.1:3181", readonly=False, data=b"info", wait_ms_max=0)
    store.cluster.register_bookie("10.0.0.2:3181", readonly=False, wait_ms_max=0)
    store.cluster.register_bookie("10.0.0.3:3181", readonly=True, wait_ms_max=0)
    store.cluster.register_bookie("10.0.0.1:3181", readonly=False, data=b"again", wait_ms_max=0)  # idempotent
    assert store.cluster.list_bookies() == ["10.0.0.1:3181", "10.0.0.2:3181"]  # no "readonly" child
    assert store.cluster.list_bookies(readonly=True) == ["10.0.0.3:3181"]
    store.cluster.unregister_bookie("10.0.0.1:3181", readonly=False)
    store.cluster.unregister_bookie("10.0.0.1:3181", readonly=False)  # idempotent
    store.cluster.unregister_bookie("10.0.0.3:3181", readonly=True)
    assert store.cluster.list_bookies() == ["10.0.0.2:3181"]
    assert store.cluster.list_bookies(readonly=True) == []


def test_register_needs_initialised_cluster(backend: Backend) -> None:
    with pytest.raises(NoNodeError, match="spark-bookie init"):
        backend.make().cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)


def test_registration_is_ephemeral(backend: Backend, store: MetadataStore) -> None:
    other = backend.make()
    other.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)
    assert store.cluster.list_bookies() == ["b:1"]
    other.close()
    wait_until(lambda: store.cluster.list_bookies() == [], 10, "the closed session's node to go")


def test_live_registration_of_another_session_is_respected(backend: Backend, store: MetadataStore) -> None:
    other = backend.make()
    other.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)
    started = time.monotonic()
    with pytest.raises(NodeExistsError, match="b:1"):
        store.cluster.register_bookie("b:1", readonly=False, wait_ms_max=600)
    assert time.monotonic() - started >= 0.5
    store.cluster.unregister_bookie("b:1", readonly=False)  # not ours: must not delete it
    assert store.cluster.list_bookies() == ["b:1"]


def test_stale_registration_of_a_dead_process_is_waited_for(backend: Backend, store: MetadataStore) -> None:
    kill = backend.hold_registration("b:1")
    try:
        assert store.cluster.list_bookies() == ["b:1"]
    finally:
        kill()
    with pytest.raises(NodeExistsError, match="already registered"):
        store.cluster.register_bookie("b:1", readonly=False, wait_ms_max=200)  # session still alive
    started = time.monotonic()
    store.cluster.register_bookie("b:1", readonly=False, wait_ms_max=20_000)
    assert time.monotonic() - started < 15
    assert store.cluster.list_bookies() == ["b:1"]


def test_a_stale_registration_known_to_be_left_by_the_dead_is_taken_over(backend: Backend,
                                                                         store: MetadataStore) -> None:
    """``left_by_dead`` sees the node's data; a node it calls dead is replaced at once by ours,
    which then outlives the dead session (its expiry must not take our node with it)."""
    kill = backend.hold_registration("b:1")
    kill()
    seen: list[bytes] = []

    def dead(data: bytes) -> bool:
        seen.append(data)
        return True

    started = time.monotonic()
    store.cluster.register_bookie("b:1", readonly=False, data=b"new", wait_ms_max=20_000, left_by_dead=dead)
    assert time.monotonic() - started < 1.5   # under the old session's 2 s timeout
    assert seen == [b""]   # what the holder wrote
    time.sleep(3)   # past the dead session's expiry
    assert store.cluster.list_bookies() == ["b:1"]
    with pytest.raises(NodeExistsError):   # and the new node is a live one's: respected like any other
        backend.make().cluster.register_bookie("b:1", readonly=False, wait_ms_max=0, left_by_dead=lambda _d: False)


def test_registration_comes_back_after_session_expiry(backend: Backend, store: MetadataStore) -> None:
    events = Recorder()
    store.add_session_listener(events)
    store.cluster.register_bookie("b:1", readonly=False, data=b"d", wait_ms_max=0)
    store.cluster.register_bookie("b:2", readonly=True, wait_ms_max=0)
    store.cluster.unregister_bookie("b:2", readonly=True)
    store.cluster.write_cookie("b:1", b"cookie", None)
    backend.expire(store)
    events.wait_for(SessionEvent.LOST, SessionEvent.CONNECTED)
    assert store.cluster.read_cookie("b:1") == (b"cookie", 0)  # persistent nodes are untouched
    assert store.cluster.list_bookies() == ["b:1"]  # re-created before CONNECTED was reported
    assert store.cluster.list_bookies(readonly=True) == []  # unregistered ones stay gone
    observer = backend.make()
    assert observer.cluster.list_bookies() == ["b:1"]
    store.close()
    wait_until(lambda: observer.cluster.list_bookies() == [], 10, "registration to go with the closed store")


# -- application data ---------------------------------------------------------------------------
def test_app_data_put_get_list_delete(backend: Backend, store: MetadataStore) -> None:
    assert store.cluster.get_app_data("spark/stop") is None
    assert store.cluster.list_app_data("spark") == []
    store.cluster.put_app_data("spark/slots/0", b"a")
    store.cluster.put_app_data("spark/slots/1", b"b")
    store.cluster.put_app_data("spark/slots/0", b"a2")  # overwrite, last writer wins
    other = backend.make()  # another session sees it: persistent, not ephemeral
    assert other.cluster.get_app_data("spark/slots/0") == b"a2"
    assert other.cluster.list_app_data("spark/slots") == ["0", "1"]
    assert store.ledgers.ledger_ids() == set()  # never mistaken for ledgers
    store.cluster.delete_app_data("spark")  # the whole subtree
    assert other.cluster.get_app_data("spark/slots/1") is None and other.cluster.list_app_data("spark") == []
    store.cluster.delete_app_data("spark")  # absent: no error


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "../x", "a/./b"])
def test_app_data_rejects_bad_keys(store: MetadataStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.cluster.put_app_data(key, b"")


# -- cookies ------------------------------------------------------------------------------------
def test_cookie_cas(store: MetadataStore) -> None:
    assert store.cluster.read_cookie("b:1") is None
    assert store.cluster.write_cookie("b:1", b"v0", None) == 0
    with pytest.raises(NodeExistsError):
        store.cluster.write_cookie("b:1", b"again", None)
    assert store.cluster.read_cookie("b:1") == (b"v0", 0)
    assert store.cluster.write_cookie("b:1", b"v1", 0) == 1
    with pytest.raises(BadVersionError):
        store.cluster.write_cookie("b:1", b"lost", 0)
    assert store.cluster.read_cookie("b:1") == (b"v1", 1)
    with pytest.raises(BadVersionError):
        store.cluster.delete_cookie("b:1", 0)
    store.cluster.delete_cookie("b:1", 1)
    assert store.cluster.read_cookie("b:1") is None
    with pytest.raises(NoNodeError):
        store.cluster.delete_cookie("b:1", -1)
    with pytest.raises(NoNodeError):
        store.cluster.write_cookie("b:1", b"x", 3)


def test_watch_bookies(backend: Backend, store: MetadataStore) -> None:
    calls = Calls()
    cancel = store.cluster.watch_bookies(calls)
    assert calls.wait_for(1) == [([], [])]  # at once, both lists
    other = backend.make()
    other.cluster.register_bookie("b:2", readonly=False, wait_ms_max=0)
    other.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)
    other.cluster.register_bookie("b:3", readonly=True, wait_ms_max=0)
    wait_until(lambda: calls.calls[-1] == (["b:1", "b:2"], ["b:3"]), 30, "all three registrations")
    assert all(w == sorted(w) and "readonly" not in w for w, _ in calls.calls)
    other.close()
    wait_until(lambda: calls.calls[-1] == ([], []), 30, "the closed session's bookies to go")
    seen = len(calls.calls)
    cancel()
    store.cluster.register_bookie("b:4", readonly=False, wait_ms_max=0)
    time.sleep(0.3)
    assert len(calls.calls) == seen
    assert all("watches" in name for name in calls.threads), calls.threads


def test_watch_bookies_needs_an_initialised_cluster(backend: Backend) -> None:
    with pytest.raises(NoNodeError, match="init"):
        backend.make().cluster.watch_bookies(Calls())


def test_bookie_info(store: MetadataStore) -> None:
    info = {"id": "h:1", "address": "10.0.0.1:3181", "network_location": "/rack1"}
    store.cluster.register_bookie("h:1", readonly=False, data=json.dumps(info).encode(), wait_ms_max=0)
    store.cluster.register_bookie("h:2", readonly=True, data=b'{"id": "h:2", "port": 3181}', wait_ms_max=0)
    store.cluster.register_bookie("h:3", readonly=False, data=b"not json", wait_ms_max=0)
    store.cluster.register_bookie("h:4", readonly=False, data=b"[1, 2]", wait_ms_max=0)
    assert store.cluster.bookie_info("h:1") == info
    assert store.cluster.bookie_info("h:2") == {"id": "h:2", "port": "3181"}
    assert store.cluster.bookie_info("h:3") == {} and store.cluster.bookie_info("h:4") == {}
    assert store.cluster.bookie_info("nobody:1") == {}


