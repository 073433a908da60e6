"""Pure transitions and counts of a stream's subscriptions (DESIGN §4.11, invariant 12;
DistributedLog's SubscriptionsStore, Pulsar's cursors and backlog quotas). No I/O.

A subscription is a durable reader position: the last record it consumed (``position``) and how
much of that record's segment lies at or before it (``mark``: records, bytes), so that its backlog
is counted from segment metadata alone. Rules:

- a commit only moves a position forward (a lower or equal one is ignored): ``advanced``;
- only an explicit reset moves it back (``reset``);
- with ``retain_until_consumed``, retention keeps every segment some subscription has not passed
  (``protect_point``, given to ``transitions.retention``);
- a backlog quota with ``drop_oldest`` deletes the oldest segments until the slowest subscription's
  backlog fits, and moves subscriptions behind the new start to it (``drop_oldest``).
"""

from __future__ import annotations

from dataclasses import replace

from metadata.errors import InvalidMetadataError
from metadata.streams.model import Position, SegmentMeta, SegmentState, SubscriptionMeta, check_position
from metadata.streams.transitions import Change, SegmentEnd, StreamView, passed


def created(position: Position, mark: tuple[int, int], now_ms: int) -> SubscriptionMeta:
    return SubscriptionMeta(check_position(position), _checked_mark(mark), now_ms, now_ms)


def advanced(cur: SubscriptionMeta, position: Position, mark: tuple[int, int], now_ms: int) -> SubscriptionMeta | None:
    """``cur`` moved forward to ``position``; None when it is not ahead of ``cur`` (ignored:
    positions never move backwards, invariant 12, whatever order racing commits land in)."""
    position = check_position(position)
    if position <= cur.position:
        return None
    return replace(cur, position=position, mark=_checked_mark(mark), updated_ms=now_ms)


def reset(cur: SubscriptionMeta, position: Position, mark: tuple[int, int], now_ms: int) -> SubscriptionMeta | None:
    """``cur`` moved to ``position``, back or forward (an operator's explicit move)."""
    position = check_position(position)
    if position == cur.position:
        return None
    return replace(cur, position=position, mark=_checked_mark(mark), updated_ms=now_ms)


def _checked_mark(mark: tuple[int, int]) -> tuple[int, int]:
    if len(mark) != 2 or min(mark) < 0:
        raise InvalidMetadataError(f"bad subscription mark {mark!r}")
    return (int(mark[0]), int(mark[1]))


def slowest(view: StreamView) -> SubscriptionMeta | None:
    """The subscription furthest behind (None without subscriptions)."""
    subs = [s for s, _v in view.subscriptions.values()]
    return min(subs, key=lambda s: s.position) if subs else None


def protect_point(view: StreamView) -> Position | None:
    """Where the slowest subscription resumes: with ``retain_until_consumed`` nothing from there on
    may be deleted by retention (None: no subscription, nothing to protect)."""
    s = slowest(view)
    return None if s is None else s.resume


def after(seg: SegmentMeta, records: int, nbytes: int, sub: SubscriptionMeta) -> tuple[int, int]:
    """Records and bytes of ``seg`` (holding ``records`` / ``nbytes`` so far) after ``sub``'s
    position. Bytes are the segment's ledger bytes (records and their framing): those after the
    subscription's mark, and 0 when no record is left (a control record's framing is no backlog)."""
    if sub.position[0] < seg.sequence:
        return records, nbytes if records else 0
    if sub.position[0] > seg.sequence:
        return 0, 0
    left = max(0, records - sub.mark[0])
    return left, max(0, nbytes - sub.mark[1]) if left else 0


def backlog(view: StreamView, sub: SubscriptionMeta, live: SegmentEnd | None) -> tuple[int, int]:
    """(records, bytes) after ``sub``'s position: sealed and tiered segments from their metadata,
    the segment in progress from ``live`` (where it ends now, read from its ledger's LAC; None:
    its metadata's published figures)."""
    records = nbytes = 0
    for seg in view.ordered():
        if seg.state is SegmentState.IN_PROGRESS and live is not None:
            r, b = after(seg, live.record_count, live.nbytes, sub)
        else:
            r, b = after(seg, seg.record_count, seg.bytes, sub)
        records, nbytes = records + r, nbytes + b
    return records, nbytes


def drop_oldest(view: StreamView, quota_bytes: int, now_ms: int) -> Change | None:
    """The backlog quota's ``drop_oldest`` (Pulsar's consumer_backlog_eviction): while the slowest
    subscription's backlog is over ``quota_bytes``, the oldest sealed segment goes (never the last
    segment); subscriptions behind the new start move to just before it. None when it fits."""
    sub = slowest(view)
    segs = view.ordered()
    if sub is None or len(segs) < 2:
        return None
    _r, over = backlog(view, sub, None)
    over -= quota_bytes
    doomed: list[SegmentMeta] = []
    for seg in segs[:-1]:
        if over <= 0 or not seg.is_sealed:
            break
        over -= after(seg, seg.record_count, seg.bytes, sub)[1]
        doomed.append(seg)
    if not doomed:
        return None
    start = (doomed[-1].sequence + 1, 0, 0)
    moved = tuple((name, replace(s, position=(start[0], 0, -1), mark=(0, 0), updated_ms=now_ms), v)
                  for name, (s, v) in sorted(view.subscriptions.items()) if s.resume < start)
    old = view.meta.truncated_before
    meta = replace(view.meta, truncated_before=start if old is None or start > old else old)
    return Change(meta, delete=tuple((s.sequence, view.segment_version(s.sequence)) for s in doomed),
                  released_ledgers=tuple(s.ledger_id for s in doomed if s.ledger_id is not None), moved=moved,
                  guard=view.subscriptions_version)


def unconsumed_held(view: StreamView) -> tuple[int, int] | None:
    """For a writer's backlog check: (bytes the slowest subscription has not consumed in the
    sealed and tiered segments, minus what it consumed of the segment in progress; this stream's
    sealed bytes on bookies), or None without subscriptions. The writer adds its own segment's
    bytes as it counts them (stream/quota.py)."""
    sub = slowest(view)
    if sub is None:
        return None
    fixed = 0
    for seg in view.ordered():
        if seg.state is SegmentState.IN_PROGRESS:
            fixed -= sub.mark[1] if sub.position[0] == seg.sequence else 0
        else:
            fixed += after(seg, seg.record_count, seg.bytes, sub)[1]
    sealed = sum(s.bytes for s in view.ordered() if s.state is SegmentState.SEALED)
    return fixed, sealed


__all__ = ["advanced", "after", "backlog", "created", "drop_oldest", "passed", "protect_point", "reset", "slowest",
           "unconsumed_held"]
