"""The storage quota's pure parts (DESIGN §4.10, ledger_client/stream/quota.py): the stream node's
byte counts kept by every change (transitions.accounted), a writer's publication of its segment's
bytes, and the gate that admits or refuses a record and decides when to publish and read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger_client.stream.quota import (
    PUBLISH_MIN_S,
    PUBLISH_S,
    REFRESH_S,
    REFUSED_REFRESH_S,
    SLICE_FRACTION,
    NamespaceUsage,
    QuotaGate,
    StreamUsage,
    SyncPlan,
    Verdict,
)
from metadata import InvalidMetadataError
from metadata.streams import SegmentEnd, SegmentMeta, SegmentState, StreamMeta, StreamView, TierInfo
from metadata.streams import transitions as tr
from metadata.streams.tiering import mark_tiered

pytestmark = pytest.mark.unit


def _apply(view: StreamView, change: tr.Change) -> StreamView:
    """What the store would hold after committing ``change`` (every touched node's version + 1)."""
    segs = dict(view.segments)
    for seq, _v in change.delete:
        del segs[seq]
    for seg, v in change.update:
        segs[seg.sequence] = (seg, v + 1)
    for seg in change.create:
        segs[seg.sequence] = (seg, 0)
    return StreamView(change.meta, view.version + 1, segs)


def _step(view: StreamView, change: tr.Change | None) -> StreamView:
    assert change is not None
    return _apply(view, tr.accounted(view, change))


def _end(records: int, nbytes: int, last_txid: int) -> SegmentEnd:
    return SegmentEnd(last_entry_id=records - 1, last_slot=0, record_count=records, nbytes=nbytes, last_txid=last_txid)


def test_every_kind_of_change_keeps_the_stream_nodes_byte_counts():
    v = _step(StreamView(StreamMeta(), 0), tr.start_segment(StreamView(StreamMeta(), 0), 11, 0, 1))
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (0, 0)
    v = _step(v, tr.publish_open_bytes(v, 1, 500))
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (0, 500)
    assert tr.publish_open_bytes(v, 1, 400) is None          # never lowers the count
    assert tr.publish_open_bytes(v, 7, 900) is None          # not the segment in progress
    with pytest.raises(InvalidMetadataError):
        tr.publish_open_bytes(v, 1, -1)
    for seq in (1, 2, 3):                                    # rolls: each seal records the exact bytes
        v = _step(v, tr.roll(v, seq, _end(10, 1_000 * seq, 10 * seq), 11 + seq, 10 * seq + 1, 2))
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (6_000, 0)
    v = _step(v, tr.publish_open_bytes(v, 4, 77))
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (6_000, 77)
    v = _step(v, tr.truncate(v, (2, 0, 0)))                  # segment 1 goes
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (5_000, 77)
    v = _step(v, mark_tiered(v, {2: (12, TierInfo("t", 0))}))   # tiered: its ledger still exists, not counted
    assert (v.meta.sealed_bytes, v.meta.open_bytes) == (3_000, 77)
    v = _step(v, tr.retention(v, 10**9, None, 3_100))        # the tiered and oldest sealed segments go
    assert v.meta.sealed_bytes == sum(s.bytes for s in v.ordered() if s.state is SegmentState.SEALED)
    assert tr.on_bookies(v.ordered()) == (v.meta.sealed_bytes, v.meta.open_bytes)


def test_accounting_a_stream_written_before_the_counts_were_kept():
    seg = SegmentMeta(1, 5, SegmentState.SEALED, 0, last_txid=3, last_entry_id=3, record_count=4, bytes=321)
    view = StreamView(StreamMeta(next_sequence=2, max_txid=3), 4, {1: (seg, 1)})
    assert view.meta.sealed_bytes is None
    change = tr.accounted(view, tr.end_stream(view))
    assert (change.meta.sealed_bytes, change.meta.open_bytes) == (321, 0) and change.meta.end_of_stream
    assert tr.accounted(view, change) is change              # already right: the same change


def _gate(quota: int | None = 10_000, others: int = 0, sealed: int = 0, now: float = 100.0) -> QuotaGate:
    g = QuotaGate(quota, 0.0)
    g.segment_started(1, now)
    usage = NamespaceUsage("ns", others + sealed, quota,
                           {"me": StreamUsage(sealed, 0, 3), "x": StreamUsage(others, 0, 2)})
    g.busy = True
    g.synced(SyncPlan(None, 0), True, usage, "me", now)
    return g


def test_gate_admits_what_fits_and_refuses_what_would_pass_the_quota():
    g = _gate(others=4_000, sealed=3_000)
    assert g.check(2_000, 1_000, 100.1) is Verdict.ADMIT          # 4,000 + 3,000 + 1,000 + 2,000 = the quota
    assert g.check(2_001, 1_000, 100.2) is Verdict.REFUSE         # read 0.2 s ago: refused as is
    assert g.refused and g.used(1_000) == 8_000
    assert g.check(2_001, 1_000, 100.0 + REFUSED_REFRESH_S) is Verdict.RECHECK   # old read: read first
    assert g.busy and g.check(2_001, 1_000, 200.0) is Verdict.REFUSE            # one read at a time
    assert QuotaGate(None, 0.0).check(10**12, 10**12, 1.0) is Verdict.ADMIT      # no quota


def test_a_fresh_read_lets_a_refused_writer_resume():
    g = _gate(others=9_000)
    assert g.check(2_000, 0, 100.1) is Verdict.REFUSE
    assert g.check(2_000, 0, 101.0) is Verdict.RECHECK
    freed = NamespaceUsage("ns", 1_000, 10_000, {"x": StreamUsage(1_000, 0, 9)})
    g.synced(SyncPlan(None, 0), True, freed, "me", 101.0)
    assert g.check(2_000, 0, 101.0) is Verdict.ADMIT and not g.refused and not g.busy


def test_own_changes_and_reads_keep_the_newest_sealed_count():
    g = _gate(sealed=3_000)
    g.committed(5_000, 4)                       # this writer's roll (stream node version 4)
    stale = NamespaceUsage("ns", 3_000, 10_000, {"me": StreamUsage(3_000, 0, 3)})
    g.busy = True
    g.synced(SyncPlan(None, 0), True, stale, "me", 101.0)   # read before the roll landed
    assert g.sealed == 5_000
    g.committed(1_000, 6)                       # a truncation
    assert g.sealed == 1_000
    g.committed(None, 9)                        # no count: nothing changes
    assert (g.sealed, g.version) == (1_000, 6)


@given(st.integers(0, 2_000), st.floats(0, 20), st.booleans(), st.booleans())
def test_publications_are_rate_bounded_and_never_per_entry(unpublished, since, idle, quota):
    g = _gate(quota=32_000 if quota else None)
    g.published, g.published_at, g.read_at = 500, 100.0, 100.0 + since
    plan = g.due(500 + unpublished, 100.0 + since, idle)
    published = plan is not None and plan.sequence is not None
    if published:
        assert unpublished > 0 and since >= PUBLISH_MIN_S
        assert since >= PUBLISH_S or idle or (quota and unpublished >= 32_000 // SLICE_FRACTION)
        assert plan == SyncPlan(1, 500 + unpublished)
    elif unpublished > 0 and since >= PUBLISH_S:
        raise AssertionError("unpublished bytes past PUBLISH_S must be published")
    if plan is not None:
        assert g.busy and g.due(10**9, 10**9) is None    # one sync at a time
    later = g.due(500, 100.0 + since + REFRESH_S)
    assert (later is None) == (plan is not None)         # while busy nothing; else a read is due by then


def test_a_publication_counts_only_for_its_segment():
    g = _gate()
    g.busy = True
    g.synced(SyncPlan(1, 900), True, None, "me", 101.0)
    assert (g.published, g.published_at) == (900, 101.0)
    g.segment_started(2, 102.0)
    assert g.unpublished(50) == 50
    g.busy = True
    g.synced(SyncPlan(1, 1_500), True, None, "me", 103.0)   # the old segment's: sealed meanwhile
    assert g.published == 0 and g.read_at == 103.0 and not g.busy


def test_usage_is_read_from_stream_nodes_and_from_segments_for_a_stream_never_counted():
    """Over the in-memory metadata twin: a stream written before the counts were kept (its node
    has none) is counted from its segments; the others from their nodes alone."""
    import uuid

    from ledger_client import LedgerClient
    from ledger_client.stream.quota import read_usage
    from metadata import connect

    zk = f"memory://quota-{uuid.uuid4().hex}/ledgers"
    store = connect(zk)
    store.cluster.init_cluster()
    c = LedgerClient(zk)
    try:
        ns = c.create_namespace("pay", storage_quota_bytes=5_000)
        ns.create_stream("new")
        store.streams.create_stream("pay", "old", StreamMeta())     # as an older client made it
        view = store.streams.read_stream("pay", "old")
        assert view is not None
        store.streams.commit_stream("pay", "old", view.version, tr.start_segment(view, 9, 0, 1))
        view = store.streams.read_stream("pay", "old")
        assert view is not None
        store.streams.commit_stream("pay", "old", view.version, tr.seal_segment(view, 1, _end(3, 1_234, 2), 2))
        usage = read_usage(store, "pay")
        assert usage == ns.storage_usage()
        assert (usage.used_bytes, usage.quota_bytes, usage.free_bytes) == (1_234, 5_000, 3_766)
        assert usage.streams["old"].total == 1_234 and usage.streams["new"].total == 0
        assert usage.to_json()["streams"] == {"new": 0, "old": 1_234}

        from prometheus_client import CollectorRegistry

        from spark_bookie.http.routes import AdminContext, build_routes
        from spark_bookie.http.server import Request, dispatch

        ctx = AdminContext(zk, CollectorRegistry())
        routes = build_routes(ctx)
        try:
            got = dispatch(routes, ctx.registry, Request("GET", "/admin/v2/namespaces/public/pay/storage", {}, b""))
            assert got.status == 200
            assert json.loads(got.body) == {"storageSize": 1_234, "storageQuotaBytes": 5_000, "freeBytes": 3_766,
                                            "streams": {"new": {"storageSize": 0}, "old": {"storageSize": 1_234}}}
            for path in ("/admin/v2/namespaces/public/nope/storage", "/admin/v2/namespaces/acme/pay/storage"):
                assert dispatch(routes, ctx.registry, Request("GET", path, {}, b"")).status == 404
        finally:
            ctx.close()
    finally:
        c.close()
        store.close()


def test_the_writer_asks_the_gate_only_when_something_may_be_due():
    g = _gate(quota=32_000)                         # read and segment started at 100.0
    assert (g.next_at, g.next_bytes) == (100.0 + PUBLISH_MIN_S, 1_000)
    assert g.due(500, 100.6) is None and g.next_at == 100.6 + PUBLISH_MIN_S   # below a slice: not yet
    plan = g.due(1_500, 100.7)
    assert plan == SyncPlan(1, 1_500) and g.next_at == float("inf")          # a slice: publish
    g.synced(plan, True, None, "me", 100.8)
    assert (g.published, g.next_at, g.next_bytes) == (1_500, 100.8 + PUBLISH_MIN_S, 2_500)
    free = QuotaGate(None, 5.0)
    free.segment_started(1, 5.0)
    assert free.next_bytes == float("inf") and free.next_at == -float("inf")   # never read: read first
