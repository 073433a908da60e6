"""One contract for stream metadata (namespaces, streams, segments, the writer lock), against a
real ZooKeeper and the in-memory twin."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from metadata import (
    BadVersionError,
    InMemoryMetadataStore,
    InMemoryZooKeeper,
    InvalidMetadataError,
    MetadataError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    connect,
)
from metadata.streams import (
    NamespaceGoneError,
    SegmentEnd,
    SegmentState,
    StreamGoneError,
    StreamLockTimeoutError,
    StreamMeta,
    decode_settings,
    encode_settings,
)
from metadata.streams import transitions as tr

SESSION_TIMEOUT_MS = 2000


@dataclass
class Backend:
    kind: str
    make: Callable[[], MetadataStore]
    expire: Callable[[MetadataStore], None]


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.unit),
                        pytest.param("zk", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    stores: list[MetadataStore] = []
    if request.param == "memory":
        zk = InMemoryZooKeeper(session_timeout_ms=SESSION_TIMEOUT_MS)
        root = f"/t-{uuid.uuid4().hex[:8]}/ledgers"

        def make() -> MetadataStore:
            stores.append(InMemoryMetadataStore(zk, root=root))
            return stores[-1]

        def expire(store: MetadataStore) -> None:
            assert isinstance(store, InMemoryMetadataStore)
            store.expire_session()
        yield Backend("memory", make, expire)
    else:
        connect_string = f"{request.getfixturevalue('zk_server')}/t-{uuid.uuid4().hex[:8]}/ledgers"

        def make() -> MetadataStore:
            stores.append(connect(connect_string, session_timeout_ms=SESSION_TIMEOUT_MS, op_timeout_ms=5000))
            return stores[-1]

        def expire(store: MetadataStore) -> None:
            from metadata.zk.testing import expire_session
            expire_session(store, timeout_s=SESSION_TIMEOUT_MS / 1000)
        yield Backend("zk", make, expire)
    for s in stores:
        s.close()


@pytest.fixture
def store(backend: Backend) -> MetadataStore:
    s = backend.make()
    s.init_cluster()
    return s


def test_namespaces_create_read_update_list_delete(store):
    assert store.list_namespaces() == []
    store.create_namespace("payments", encode_settings({"ensemble_size": 3}))
    store.create_namespace("audit", encode_settings({}))
    with pytest.raises(NodeExistsError):
        store.create_namespace("payments", encode_settings({}))
    assert store.list_namespaces() == ["audit", "payments"]
    data, v = store.read_namespace("payments")
    assert decode_settings(data) == {"ensemble_size": 3}
    v2 = store.write_namespace("payments", encode_settings({"ensemble_size": 5}), v)
    with pytest.raises(BadVersionError):
        store.write_namespace("payments", encode_settings({}), v)
    assert store.read_namespace("payments")[1] == v2
    store.create_stream("payments", "orders", StreamMeta(ctime_ms=1))
    with pytest.raises(MetadataError, match="still has streams"):
        store.delete_namespace("payments")
    store.delete_stream("payments", "orders")
    store.delete_namespace("payments")
    assert store.read_namespace("payments") is None
    with pytest.raises(NamespaceGoneError):
        store.delete_namespace("payments")
    with pytest.raises(NamespaceGoneError):
        store.write_namespace("payments", b"{}", 0)


def test_names_are_checked(store):
    for bad in ("", "a/b", "..", ".", "a b", "x" * 256, "é"):
        with pytest.raises(InvalidMetadataError):
            store.create_namespace(bad, encode_settings({}))
    store.create_namespace("ns", encode_settings({}))
    with pytest.raises(InvalidMetadataError):
        store.create_stream("ns", "a/b", StreamMeta())


def test_streams_live_in_their_namespace(store):
    with pytest.raises(NamespaceGoneError):
        store.create_stream("nope", "s", StreamMeta())
    with pytest.raises(NamespaceGoneError):
        store.list_streams("nope")
    store.create_namespace("ns", encode_settings({}))
    store.create_stream("ns", "b", StreamMeta())
    store.create_stream("ns", "a", StreamMeta())
    with pytest.raises(NodeExistsError):
        store.create_stream("ns", "a", StreamMeta())
    assert store.list_streams("ns") == ["a", "b"]
    assert store.read_stream("ns", "zzz") is None
    with pytest.raises(StreamGoneError):
        store.delete_stream("ns", "zzz")


def _segmented(store) -> tuple:
    store.create_namespace("ns", encode_settings({}))
    store.create_stream("ns", "s", StreamMeta(ctime_ms=5))
    view = store.read_stream("ns", "s")
    assert view.segments == {} and view.meta.next_sequence == 1
    v = store.commit_stream("ns", "s", view.version, tr.start_segment(view, 42, 0, 100))
    return v, store.read_stream("ns", "s")


def test_segments_start_seal_roll_and_cas(store):
    v, view = _segmented(store)
    assert view.version == v and view.in_progress.sequence == 1 and view.in_progress.ledger_id == 42
    stale = view.version - 1
    end = SegmentEnd(last_entry_id=9, last_slot=3, record_count=40, nbytes=4000, last_txid=39)
    with pytest.raises(BadVersionError):
        store.commit_stream("ns", "s", stale, tr.seal_segment(view, 1, end, 200))
    v = store.commit_stream("ns", "s", view.version, tr.roll(view, 1, end, 43, 40, 200))
    view = store.read_stream("ns", "s")
    s1, s2 = view.ordered()
    assert (s1.state, s1.last_dlsn, s1.last_txid, s1.record_count) == (SegmentState.SEALED, (1, 9, 3), 39, 40)
    assert (s2.sequence, s2.state, s2.first_txid, s2.ledger_id) == (2, SegmentState.IN_PROGRESS, 40, 43)
    assert view.meta.max_txid == 39 and view.meta.next_sequence == 3 and view.version == v
    with pytest.raises(InvalidMetadataError):
        tr.start_segment(view, 44, 50, 300)  # one in progress at a time


def test_truncation_deletes_whole_segments_before_it(store):
    _v, view = _segmented(store)
    for i in range(1, 4):  # three sealed segments of 10 entries each, then one in progress
        end = SegmentEnd(9, 0, 10, 100, i * 10 - 1)
        store.commit_stream("ns", "s", view.version, tr.roll(view, i, end, 42 + i, i * 10, 100 * i))
        view = store.read_stream("ns", "s")
    change = tr.truncate(view, (3, 0, 0))
    assert change.released_ledgers == (42, 43)
    store.commit_stream("ns", "s", view.version, change)
    view = store.read_stream("ns", "s")
    assert [s.sequence for s in view.ordered()] == [3, 4] and view.meta.truncated_before == (3, 0, 0)
    assert tr.truncate(view, (1, 0, 0)).meta.truncated_before == (3, 0, 0)  # never moves back


def test_writer_lock_excludes_a_second_writer_and_goes_with_the_session(backend, store):
    _segmented(store)
    other = backend.make()
    lock = store.lock_stream("ns", "s", "writer-A", timeout_s=5)
    assert store.stream_lock_holder("ns", "s") == "writer-A"
    t0 = time.monotonic()
    with pytest.raises(StreamLockTimeoutError, match="writer-A"):
        other.lock_stream("ns", "s", "writer-B", timeout_s=0.5)
    assert time.monotonic() - t0 >= 0.45
    got = {}

    def take() -> None:
        got["lock"] = other.lock_stream("ns", "s", "writer-B", timeout_s=20)

    t = threading.Thread(target=take)
    t.start()
    time.sleep(0.2)
    view = store.read_stream("ns", "s")
    end = SegmentEnd(0, 0, 1, 10, 0)
    store.commit_stream("ns", "s", view.version, tr.seal_segment(view, 1, end, 1), lock)  # still ours
    backend.expire(store)                 # writer A's session expires: B gets the stream
    t.join(20)
    assert got["lock"].owner == "writer-B" and other.stream_lock_holder("ns", "s") == "writer-B"
    view = other.read_stream("ns", "s")
    with pytest.raises(NoNodeError, match="lock"):  # A cannot change the stream any more
        other.commit_stream("ns", "s", view.version, tr.end_stream(view), lock)
    other.commit_stream("ns", "s", view.version, tr.end_stream(view), got["lock"])
    other.unlock_stream(got["lock"])
    assert other.stream_lock_holder("ns", "s") is None
    assert other.read_stream("ns", "s").meta.end_of_stream


def test_commit_on_a_deleted_stream(store):
    _v, view = _segmented(store)
    store.delete_stream("ns", "s")
    with pytest.raises(StreamGoneError):
        store.commit_stream("ns", "s", view.version, tr.truncate(view, (1, 0, 0)))
