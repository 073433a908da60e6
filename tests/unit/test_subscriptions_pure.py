"""Subscriptions' pure parts (DESIGN §4.11, invariant 12): forward-only commits whatever order
they land in, resets, exact backlog from segment metadata, retention that waits for the slowest
subscription, drop_oldest, the writer gate's backlog bound, and the settings."""

from __future__ import annotations

import os
import random

import pytest

from ledger_client import errors
from ledger_client.stream.quota import NamespaceUsage, QuotaGate, SyncPlan, Verdict
from ledger_client.stream.settings import NamespaceSettings
from metadata import InvalidMetadataError
from metadata.streams import SegmentEnd, SegmentMeta, SegmentState, StreamMeta, StreamView
from metadata.streams import subscriptions as subs
from metadata.streams import transitions as tr
from metadata.streams.model import decode_subscription, encode_subscription

pytestmark = pytest.mark.unit


def _view(n_sealed: int, *, in_progress: bool = True, subscriptions: dict | None = None, tiered: int = 0) -> StreamView:
    """Segments 1..n sealed (10 records in entries 0-1, 100 bytes, sealed at 1000 * seq), the first
    ``tiered`` of them tiered, then one in progress."""
    segs = {}
    for i in range(1, n_sealed + 1):
        state = SegmentState.TIERED if i <= tiered else SegmentState.SEALED
        segs[i] = (SegmentMeta(i, 100 + i, state, (i - 1) * 10, i * 10 - 1, 1, 4, 10, 100, 0, 1000 * i), 0)
    if in_progress:
        seq = n_sealed + 1
        segs[seq] = (SegmentMeta(seq, 100 + seq, SegmentState.IN_PROGRESS, n_sealed * 10, bytes=40), 0)
    meta = StreamMeta(next_sequence=n_sealed + 1 + in_progress, max_txid=n_sealed * 10 - 1)
    return StreamView(meta, 3, segs, {k: (v, 0) for k, v in (subscriptions or {}).items()})


def test_commits_only_move_forward_in_any_order():
    seed = int(os.environ.get("SPARK_BOOKIE_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(200):
        positions = [(rng.randint(1, 3), rng.randint(0, 5), rng.randint(-1, 4)) for _ in range(rng.randint(1, 12))]
        cur = subs.created((1, 0, -1), (0, 0), 0)
        seen = [cur.position]
        for p in rng.sample(positions, len(positions)):       # two readers' commits, interleaved any way
            new = subs.advanced(cur, p, (1, 1), 1)
            if new is not None:
                cur = new
            seen.append(cur.position)
        assert seen == sorted(seen), seed                       # never backwards
        assert cur.position == max([(1, 0, -1), *positions]), seed


def test_reset_moves_back_and_bad_positions_are_refused():
    cur = subs.created((3, 2, 1), (5, 50), 0)
    back = subs.reset(cur, (1, 0, -1), (0, 0), 9)
    assert back is not None and back.position == (1, 0, -1) and back.updated_ms == 9 and back.resume == (1, 0, 0)
    assert subs.reset(cur, (3, 2, 1), (5, 50), 9) is None
    for bad in [(0, 0, 0), (1, -1, 0), (1, 0, -2), (1, 0), ("1", 0, 0), (1, 0, True)]:
        with pytest.raises(InvalidMetadataError):
            subs.advanced(cur, bad, (0, 0), 1)
    with pytest.raises(InvalidMetadataError):
        subs.created((1, 0, 0), (-1, 0), 1)
    assert decode_subscription(encode_subscription(back)) == back


def test_backlog_is_exact_from_metadata():
    live = SegmentEnd(last_entry_id=3, last_slot=2, record_count=7, nbytes=300, last_txid=36)
    sub = subs.created((2, 1, 1), (7, 70), 0)          # 7 of segment 2's 10 records consumed, 70 of its 100 bytes
    view = _view(3, subscriptions={"a": sub})
    assert subs.backlog(view, sub, live) == (3 + 10 + 7, 30 + 100 + 300)
    assert subs.backlog(view, sub, None) == (3 + 10 + 0, 30 + 100 + 0)   # in progress as published: no records
    done = subs.created((4, 3, 2), (7, 300), 0)
    assert subs.backlog(view, done, live) == (0, 0)
    before = subs.created((1, 0, -1), (0, 0), 0)
    assert subs.backlog(_view(3, tiered=2), before, live) == (37, 600)   # tiered segments count by position


def test_retention_waits_for_the_slowest_subscription():
    slow = subs.created((2, 1, 1), (7, 70), 0)            # inside segment 2
    view = _view(4, subscriptions={"slow": slow, "fast": subs.created((4, 1, 4), (10, 100), 0)})
    change = tr.retention(view, 10**9, 0, None, subs.protect_point(view))
    assert [seq for seq, _v in change.delete] == [1] and change.meta.truncated_before == (2, 0, 0)
    assert tr.retention(view, 10**9, 0, None, None).delete == ((1, 0), (2, 0), (3, 0), (4, 0))
    by_bytes = tr.retention(view, 0, None, 150, subs.protect_point(view))
    assert [seq for seq, _v in by_bytes.delete] == [1]
    at_end = subs.created((2, 1, 4), (10, 100), 0)        # segment 2's last record consumed: it has passed it
    v2 = _view(4, subscriptions={"a": at_end})
    assert [seq for seq, _v in tr.retention(v2, 10**9, 0, None, subs.protect_point(v2)).delete] == [1, 2]
    nobody = _view(4)
    assert subs.protect_point(nobody) is None


def test_drop_oldest_deletes_until_the_backlog_fits_and_moves_subscriptions():
    slow = subs.created((1, 0, 1), (2, 20), 0)
    fast = subs.created((3, 0, 0), (1, 10), 0)
    view = _view(4, subscriptions={"slow": slow, "fast": fast})
    # slow's backlog: 80 + 100 + 100 + 100 + 40 (in progress, published) = 420
    change = subs.drop_oldest(view, 250, 5)
    assert [seq for seq, _v in change.delete] == [1, 2] and change.meta.truncated_before == (3, 0, 0)
    assert [(n, m.position, m.mark) for n, m, _v in change.moved] == [("slow", (3, 0, -1), (0, 0))]
    assert subs.drop_oldest(view, 420, 5) is None
    assert subs.drop_oldest(_view(4), 1, 5) is None                     # no subscription: no backlog
    all_but_last = subs.drop_oldest(view, 1, 5)
    assert [seq for seq, _v in all_but_last.delete] == [1, 2, 3, 4]     # never the segment in progress


def test_writer_gate_refuses_past_the_backlog_quota_and_rechecks():
    g = QuotaGate(None, 0.0, backlog_quota=1_000)
    assert g.checking and g.check(10**6, 0, 0.0) is Verdict.ADMIT       # not read yet: nothing known to refuse
    view = _view(2, subscriptions={"a": subs.created((1, 0, 4), (5, 50), 0)})
    fixed, sealed = subs.unconsumed_held(view)
    assert (fixed, sealed) == (50 + 100, 200)
    g.committed(sealed, 3)
    g.synced(SyncPlan(None, 0), True, None, "s", 10.0, fixed - sealed)
    assert g.check(800, 50, 10.1) is Verdict.ADMIT                       # 150 + 50 + 800 = 1,000
    assert g.check(801, 50, 10.2) is Verdict.REFUSE
    assert "backlog quota" in str(g.refusal(50, 801, "s"))
    assert g.check(801, 50, 11.0) is Verdict.RECHECK
    g.synced(SyncPlan(None, 0), True, None, "s", 11.0, None)            # the subscription is gone: no backlog
    assert g.check(10**6, 50, 11.1) is Verdict.ADMIT
    assert not QuotaGate(None, 0.0).checking
    later = QuotaGate(None, 0.0)                                          # a quota set while a writer writes
    later.synced(SyncPlan(None, 0), True, NamespaceUsage("ns", 0, None, {}, 500), "s", 1.0, 0)
    assert later.checking and later.check(501, 0, 1.1) is Verdict.REFUSE


def test_settings():
    s = NamespaceSettings.build(retain_until_consumed=True, backlog_quota_bytes=10, backlog_quota_policy="drop_oldest")
    assert NamespaceSettings.from_json(s.to_json()) == s
    assert NamespaceSettings().backlog_quota_policy == "refuse_writes" and not NamespaceSettings().retain_until_consumed
    for bad in ({"retain_until_consumed": 1}, {"backlog_quota_bytes": 0}, {"backlog_quota_policy": "evict"}):
        with pytest.raises(errors.IncorrectParameterError):
            NamespaceSettings.build(**bad)
