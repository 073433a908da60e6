"""The contract of ``store.streams`` (namespaces, streams, segments, the writer lock), against a
real ZooKeeper and the in-memory twin."""

from __future__ import annotations

import threading
import time

import pytest

from metadata import (
    BadVersionError,
    InvalidMetadataError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
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


def test_namespaces_create_read_update_list_delete(store):
    assert store.streams.list_namespaces() == []
    store.streams.create_namespace("payments", encode_settings({"ensemble_size": 3}))
    store.streams.create_namespace("audit", encode_settings({}))
    with pytest.raises(NodeExistsError):
        store.streams.create_namespace("payments", encode_settings({}))
    assert store.streams.list_namespaces() == ["audit", "payments"]
    data, v = store.streams.read_namespace("payments")
    assert decode_settings(data) == {"ensemble_size": 3}
    v2 = store.streams.write_namespace("payments", encode_settings({"ensemble_size": 5}), v)
    with pytest.raises(BadVersionError):
        store.streams.write_namespace("payments", encode_settings({}), v)
    assert store.streams.read_namespace("payments")[1] == v2
    store.streams.create_stream("payments", "orders", StreamMeta(ctime_ms=1))
    with pytest.raises(MetadataError, match="still has streams"):
        store.streams.delete_namespace("payments")
    store.streams.delete_stream("payments", "orders")
    store.streams.delete_namespace("payments")
    assert store.streams.read_namespace("payments") is None
    with pytest.raises(NamespaceGoneError):
        store.streams.delete_namespace("payments")
    with pytest.raises(NamespaceGoneError):
        store.streams.write_namespace("payments", b"{}", 0)


def test_names_are_checked(store):
    for bad in ("", "a/b", "..", ".", "a b", "x" * 256, "é"):
        with pytest.raises(InvalidMetadataError):
            store.streams.create_namespace(bad, encode_settings({}))
    store.streams.create_namespace("ns", encode_settings({}))
    with pytest.raises(InvalidMetadataError):
        store.streams.create_stream("ns", "a/b", StreamMeta())


def test_streams_live_in_their_namespace(store):
    with pytest.raises(NamespaceGoneError):
        store.streams.create_stream("nope", "s", StreamMeta())
    with pytest.raises(NamespaceGoneError):
        store.streams.list_streams("nope")
    store.streams.create_namespace("ns", encode_settings({}))
    store.streams.create_stream("ns", "b", StreamMeta())
    store.streams.create_stream("ns", "a", StreamMeta())
    with pytest.raises(NodeExistsError):
        store.streams.create_stream("ns", "a", StreamMeta())
    assert store.streams.list_streams("ns") == ["a", "b"]
    assert store.streams.read_stream("ns", "zzz") is None
    with pytest.raises(StreamGoneError):
        store.streams.delete_stream("ns", "zzz")


def _segmented(store) -> tuple:
    store.streams.create_namespace("ns", encode_settings({}))
    store.streams.create_stream("ns", "s", StreamMeta(ctime_ms=5))
    view = store.streams.read_stream("ns", "s")
    assert view.segments == {} and view.meta.next_sequence == 1
    v = store.streams.commit_stream("ns", "s", view.version, tr.start_segment(view, 42, 0, 100))
    return v, store.streams.read_stream("ns", "s")


def test_segments_start_seal_roll_and_cas(store):
    v, view = _segmented(store)
    assert view.version == v and view.in_progress.sequence == 1 and view.in_progress.ledger_id == 42
    stale = view.version - 1
    end = SegmentEnd(last_entry_id=9, last_slot=3, record_count=40, nbytes=4000, last_txid=39)
    with pytest.raises(BadVersionError):
        store.streams.commit_stream("ns", "s", stale, tr.seal_segment(view, 1, end, 200))
    v = store.streams.commit_stream("ns", "s", view.version, tr.roll(view, 1, end, 43, 40, 200))
    view = store.streams.read_stream("ns", "s")
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
        store.streams.commit_stream("ns", "s", view.version, tr.roll(view, i, end, 42 + i, i * 10, 100 * i))
        view = store.streams.read_stream("ns", "s")
    change = tr.truncate(view, (3, 0, 0))
    assert change.released_ledgers == (42, 43)
    store.streams.commit_stream("ns", "s", view.version, change)
    view = store.streams.read_stream("ns", "s")
    assert [s.sequence for s in view.ordered()] == [3, 4] and view.meta.truncated_before == (3, 0, 0)
    assert tr.truncate(view, (1, 0, 0)).meta.truncated_before == (3, 0, 0)  # never moves back


def test_writer_lock_excludes_a_second_writer_and_goes_with_the_session(backend, store):
    _segmented(store)
    other = backend.make()
    lock = store.streams.lock_stream("ns", "s", "writer-A", timeout_s=5)
    assert store.streams.stream_lock_holder("ns", "s") == "writer-A"
    t0 = time.monotonic()
    with pytest.raises(StreamLockTimeoutError, match="writer-A"):
        other.streams.lock_stream("ns", "s", "writer-B", timeout_s=0.5)
    assert time.monotonic() - t0 >= 0.45
    got = {}

    def take() -> None:
        got["lock"] = other.streams.lock_stream("ns", "s", "writer-B", timeout_s=20)

    t = threading.Thread(target=take)
    t.start()
    time.sleep(0.2)
    view = store.streams.read_stream("ns", "s")
    end = SegmentEnd(0, 0, 1, 10, 0)
    store.streams.commit_stream("ns", "s", view.version, tr.seal_segment(view, 1, end, 1), lock)  # still ours
    backend.expire(store)                 # writer A's session expires: B gets the stream
    t.join(20)
    assert got["lock"].owner == "writer-B" and other.streams.stream_lock_holder("ns", "s") == "writer-B"
    view = other.streams.read_stream("ns", "s")
    with pytest.raises(NoNodeError, match="lock"):  # A cannot change the stream any more
        other.streams.commit_stream("ns", "s", view.version, tr.end_stream(view), lock)
    other.streams.commit_stream("ns", "s", view.version, tr.end_stream(view), got["lock"])
    other.streams.unlock_stream(got["lock"])
    assert other.streams.stream_lock_holder("ns", "s") is None
    assert other.streams.read_stream("ns", "s").meta.end_of_stream


def test_commit_on_a_deleted_stream(store):
    _v, view = _segmented(store)
    store.streams.delete_stream("ns", "s")
    with pytest.raises(StreamGoneError):
        store.streams.commit_stream("ns", "s", view.version, tr.truncate(view, (1, 0, 0)))
