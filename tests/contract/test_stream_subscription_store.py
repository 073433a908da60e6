"""The contract of subscriptions in ``store.streams`` (DESIGN §4.11): nodes under the stream, every
change a CAS, a creation or a move back guarding the stream node, drop_oldest's moves in the
stream's multi-op; against a real ZooKeeper and the in-memory twin."""

from __future__ import annotations

from dataclasses import replace

import pytest

from metadata import BadVersionError, InvalidMetadataError, NodeExistsError
from metadata.streams import SegmentEnd, StreamGoneError, StreamMeta, SubscriptionGoneError, SubscriptionMeta
from metadata.streams import subscriptions as subs
from metadata.streams import transitions as tr
from metadata.streams.model import encode_settings


def _stream_with_segments(store, n: int) -> None:
    """A stream of ``n`` sealed segments of 10 records (100 bytes) each, then one in progress."""
    store.streams.create_namespace("ns", encode_settings({}))
    store.streams.create_stream("ns", "s", StreamMeta(ctime_ms=1, sealed_bytes=0))
    view = store.streams.read_stream("ns", "s")
    store.streams.commit_stream("ns", "s", view.version, tr.start_segment(view, 100, 0, 1))
    for i in range(1, n + 1):
        view = store.streams.read_stream("ns", "s")
        end = SegmentEnd(last_entry_id=1, last_slot=4, record_count=10, nbytes=100, last_txid=i * 10 - 1)
        store.streams.commit_stream("ns", "s", view.version, tr.roll(view, i, end, 100 + i, i * 10, 1 + i))


def test_create_read_commit_delete(store):
    _stream_with_segments(store, 2)
    assert store.streams.read_subscription("ns", "s", "billing") is None
    v0 = store.streams.read_stream("ns", "s")
    sub = subs.created((1, 0, -1), (0, 0), 5)
    assert store.streams.write_subscription("ns", "s", "billing", sub, None) == 0
    v1 = store.streams.read_stream("ns", "s")
    assert v1.subscriptions_version == v0.subscriptions_version + 1    # a creation moves the guard
    assert v1.version == v0.version                                    # not the stream (its readers)
    with pytest.raises(NodeExistsError):
        store.streams.write_subscription("ns", "s", "billing", sub, None)
    got, v = store.streams.read_subscription("ns", "s", "billing")
    assert got == sub and v == 0
    ahead = subs.advanced(got, (1, 1, 2), (8, 80), 6)
    assert store.streams.write_subscription("ns", "s", "billing", ahead, v) == 1
    assert store.streams.read_stream("ns", "s").subscriptions_version == v1.subscriptions_version  # a commit does not
    with pytest.raises(BadVersionError):
        store.streams.write_subscription("ns", "s", "billing", ahead, v)   # CAS
    view = store.streams.read_stream("ns", "s")
    assert view.subscriptions == {"billing": (ahead, 1)}
    store.streams.delete_subscription("ns", "s", "billing")
    with pytest.raises(SubscriptionGoneError):
        store.streams.delete_subscription("ns", "s", "billing")
    with pytest.raises(SubscriptionGoneError):
        store.streams.write_subscription("ns", "s", "billing", ahead, 1)
    assert store.streams.read_stream("ns", "s").subscriptions == {}


def test_guarded_write_makes_an_older_stream_change_lose(store):
    _stream_with_segments(store, 3)
    store.streams.write_subscription("ns", "s", "a", subs.created((3, 1, 4), (10, 100), 1), None)
    view = store.streams.read_stream("ns", "s")          # retention decided on this view ...
    store.streams.write_subscription("ns", "s", "a", subs.reset(view.subscriptions["a"][0], (1, 0, -1), (0, 0), 2),
                                     0, guard=True)       # ... then the subscription moves back
    change = tr.retention(view, 10**9, 0, None, subs.protect_point(view))
    assert change is not None and len(change.delete) == 3   # "a" had passed all three sealed segments
    guarded = replace(tr.accounted(view, change), guard=view.subscriptions_version)
    with pytest.raises(BadVersionError):
        store.streams.commit_stream("ns", "s", view.version, guarded)
    fresh = store.streams.read_stream("ns", "s")
    assert tr.retention(fresh, 10**9, 0, None, subs.protect_point(fresh)) is None   # now nothing may go


def test_drop_oldest_moves_subscriptions_in_the_same_multi(store):
    _stream_with_segments(store, 3)
    store.streams.write_subscription("ns", "s", "slow", subs.created((1, 0, 1), (2, 20), 1), None)
    store.streams.write_subscription("ns", "s", "fast", subs.created((3, 1, 4), (10, 100), 1), None)
    view = store.streams.read_stream("ns", "s")
    change = subs.drop_oldest(view, 150, 7)
    assert [seq for seq, _v in change.delete] == [1, 2] and [m[0] for m in change.moved] == ["slow"]
    store.streams.commit_stream("ns", "s", view.version, tr.accounted(view, change))
    after = store.streams.read_stream("ns", "s")
    assert sorted(after.segments) == [3, 4] and after.meta.truncated_before == (3, 0, 0)
    assert after.subscriptions["slow"][0].position == (3, 0, -1)
    assert after.subscriptions["fast"][0].position == (3, 1, 4)


def test_drop_oldest_loses_to_a_concurrent_commit(store):
    _stream_with_segments(store, 3)
    store.streams.write_subscription("ns", "s", "slow", subs.created((1, 0, 1), (2, 20), 1), None)
    view = store.streams.read_stream("ns", "s")
    change = subs.drop_oldest(view, 150, 7)
    sub, v = store.streams.read_subscription("ns", "s", "slow")
    store.streams.write_subscription("ns", "s", "slow", subs.advanced(sub, (3, 0, 0), (1, 10), 8), v)
    with pytest.raises(BadVersionError):
        store.streams.commit_stream("ns", "s", view.version, tr.accounted(view, change))
    assert store.streams.read_subscription("ns", "s", "slow")[0].position == (3, 0, 0)   # never moved back


def test_names_streams_and_deletion(store):
    _stream_with_segments(store, 1)
    for bad in ("", "a/b", "..", "x" * 256):
        with pytest.raises(InvalidMetadataError):
            store.streams.read_subscription("ns", "s", bad)
    with pytest.raises(StreamGoneError):
        store.streams.write_subscription("ns", "nope", "a", subs.created((1, 0, -1), (0, 0), 1), None)
    store.streams.write_subscription("ns", "s", "a", subs.created((1, 0, -1), (0, 0), 1), None)
    store.streams.delete_stream("ns", "s")                # its subscriptions go with it
    assert store.streams.read_stream("ns", "s") is None
    store.streams.create_stream("ns", "s", StreamMeta(ctime_ms=1, sealed_bytes=0))
    assert store.streams.read_subscription("ns", "s", "a") is None


def test_a_stream_made_before_subscriptions_gets_the_node_on_first_use(store):
    _stream_with_segments(store, 1)
    path = f"{store.streams._stream_path('ns', 's')}/subscriptions"
    store.streams._nodes.delete(path)                     # as a stream created before subscriptions existed
    assert store.streams.read_stream("ns", "s").subscriptions == {}
    store.streams.write_subscription("ns", "s", "a", subs.created((1, 0, -1), (0, 0), 1), None)
    assert isinstance(store.streams.read_subscription("ns", "s", "a")[0], SubscriptionMeta)
