"""Pure transitions of a stream's metadata: from what was read (a StreamView) to what one
multi-op must write (a Change). No I/O: the store applies a Change atomically, CAS on the
versions the view was read at, so two writers (or a writer and a truncation) can never both win.

Rules (DistributedLog's, DESIGN §4.5, invariants 8 and 9):
- segments are numbered 1, 2, ... in the order they start; at most one is in progress, the last;
- a segment starts only on a stream that has not ended and has nothing in progress;
- sealing fixes a segment's end (last entry, slot, txid, record count, bytes) and moves the
  stream's max txid; txids never go back from one segment to the next;
- a truncation point only moves forward; whole segments that end before it are deleted;
- retention deletes sealed (or tiered) segments only, oldest first, never the last one;
- end of stream is final;
- the stream node counts the bytes its segments hold on bookies (``accounted``, applied to every
  change by the commit loop); a writer publishes its segment's bytes now and then, never per entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from metadata.errors import InvalidMetadataError
from metadata.streams.model import Position, SegmentMeta, SegmentState, StreamMeta, SubscriptionMeta, sealed


@dataclass(frozen=True)
class StreamView:
    """A stream as read: its meta and every segment, each with the znode version it was read at,
    and its subscriptions (DESIGN §4.11) with theirs. A subscription's forward commits touch its own
    node only (the stream's version moves only with the stream, so readers do not re-read segments
    for commits); what can make a retention unsafe, a subscription created or moved back, also
    moves the version of the subscriptions' directory (``subscriptions_version``, None while it is
    absent), which such a change checks (``Change.guard``; metadata.streams.store)."""

    meta: StreamMeta
    version: int
    segments: dict[int, tuple[SegmentMeta, int]] = field(default_factory=dict)
    subscriptions: dict[str, tuple[SubscriptionMeta, int]] = field(default_factory=dict)
    subscriptions_version: int | None = None

    def ordered(self) -> list[SegmentMeta]:
        return [self.segments[k][0] for k in sorted(self.segments)]

    @property
    def in_progress(self) -> SegmentMeta | None:
        last = max(self.segments, default=None)
        if last is None:
            return None
        seg = self.segments[last][0]
        return seg if seg.state is SegmentState.IN_PROGRESS else None

    def segment_version(self, sequence: int) -> int:
        if sequence not in self.segments:
            raise InvalidMetadataError(f"segment {sequence} does not exist")
        return self.segments[sequence][1]


@dataclass(frozen=True)
class Change:
    """What one multi-op writes: the stream node (always, CAS on the view's version, so every
    change is ordered against every other), segments created, updated (CAS) and deleted (CAS)."""

    meta: StreamMeta
    create: tuple[SegmentMeta, ...] = ()
    update: tuple[tuple[SegmentMeta, int], ...] = ()
    delete: tuple[tuple[int, int], ...] = ()     # (sequence, version)
    released_ledgers: tuple[int, ...] = ()       # ledgers of deleted segments: delete after commit
    moved: tuple[tuple[str, SubscriptionMeta, int], ...] = ()   # subscriptions moved (CAS on their version)
    guard: int | None = None    # the subscriptions' directory must still be at this version (None: unchecked)


@dataclass(frozen=True)
class SegmentEnd:
    """Where a segment ends, as its writer (or the recovery of its ledger) found it."""

    last_entry_id: int
    last_slot: int
    record_count: int
    nbytes: int
    last_txid: int


def start_segment(view: StreamView, ledger_id: int, first_txid: int, now_ms: int) -> Change:
    m = view.meta
    if m.end_of_stream:
        raise InvalidMetadataError("the stream has ended")
    if view.in_progress is not None:
        raise InvalidMetadataError(f"segment {view.in_progress.sequence} is still in progress")
    if first_txid < m.max_txid:
        raise InvalidMetadataError(f"first txid {first_txid} is below the stream's last txid {m.max_txid}")
    seg = SegmentMeta(m.next_sequence, ledger_id, SegmentState.IN_PROGRESS, first_txid, ctime_ms=now_ms)
    return Change(replace(m, next_sequence=m.next_sequence + 1), create=(seg,))


def seal_segment(view: StreamView, sequence: int, end: SegmentEnd, now_ms: int) -> Change:
    seg = view.segments.get(sequence, (None, 0))[0]
    if seg is None:
        raise InvalidMetadataError(f"segment {sequence} does not exist")
    done = sealed(seg, last_entry_id=end.last_entry_id, last_slot=end.last_slot, record_count=end.record_count,
                  nbytes=end.nbytes, last_txid=end.last_txid, now_ms=now_ms)
    if done.record_count and done.last_txid < view.meta.max_txid:
        raise InvalidMetadataError(f"segment {sequence} ends at txid {done.last_txid}, below {view.meta.max_txid}")
    meta = replace(view.meta, max_txid=max(view.meta.max_txid, done.last_txid))
    return Change(meta, update=((done, view.segment_version(sequence)),))


def roll(view: StreamView, sequence: int, end: SegmentEnd, ledger_id: int, first_txid: int, now_ms: int) -> Change:
    """Seal the segment in progress and start the next one, in one multi-op: readers never see
    a stream with a sealed last segment and a writer that has moved on without a segment."""
    sealing = seal_segment(view, sequence, end, now_ms)
    after = StreamView(sealing.meta, view.version,
                       {**view.segments, sequence: (sealing.update[0][0], view.segment_version(sequence))})
    starting = start_segment(after, ledger_id, first_txid, now_ms)
    return Change(starting.meta, create=starting.create, update=sealing.update)


def drop_empty_segment(view: StreamView, sequence: int) -> Change:
    """An in-progress segment whose ledger turned out empty (its writer died before an entry was
    acknowledged): it goes, with its ledger; its sequence number is not reused."""
    seg = view.segments[sequence][0]
    if seg.state is not SegmentState.IN_PROGRESS:
        raise InvalidMetadataError(f"segment {sequence} is {seg.state.value}")
    return Change(view.meta, delete=((sequence, view.segment_version(sequence)),),
                  released_ledgers=(seg.ledger_id,) if seg.ledger_id is not None else ())


def end_stream(view: StreamView) -> Change:
    if view.in_progress is not None:
        raise InvalidMetadataError(f"seal segment {view.in_progress.sequence} before ending the stream")
    return Change(replace(view.meta, end_of_stream=True))


def truncate(view: StreamView, before: Position) -> Change:
    """Records before ``before`` are gone for every reader; whole segments before it are deleted."""
    if len(before) != 3 or min(before) < 0 or before[0] < 1:
        raise InvalidMetadataError(f"bad truncation point {before}")
    old = view.meta.truncated_before
    point = before if old is None or before > old else old
    doomed = [s for s in view.ordered() if s.is_sealed and _ends_before(s, point)]
    return _deleting(view, replace(view.meta, truncated_before=point), doomed)


def _ends_before(seg: SegmentMeta, point: Position) -> bool:
    last = seg.last_dlsn
    return (seg.sequence, 0, 0) < point if last is None else last < point


def _deleting(view: StreamView, meta: StreamMeta, doomed: list[SegmentMeta]) -> Change:
    return Change(meta, delete=tuple((s.sequence, view.segment_version(s.sequence)) for s in doomed),
                  released_ledgers=tuple(s.ledger_id for s in doomed if s.ledger_id is not None))


def passed(seg: SegmentMeta, resume: Position) -> bool:
    """Whether a reader resuming at ``resume`` has consumed every record of the sealed ``seg``."""
    last = seg.last_dlsn
    return seg.is_sealed and (last is None and resume >= seg.first_dlsn or last is not None and last < resume)


def retention(view: StreamView, now_ms: int, retention_ms: int | None, retention_bytes: int | None,
              protect: Position | None = None) -> Change | None:
    """Sealed segments past the age or size limit, oldest first; never the newest segment (so a
    stream keeps its position and max txid readable). ``protect``: the earliest point a
    subscription resumes at, with ``retain_until_consumed`` (invariant 12): a segment it has not
    passed stays, and so does every later one. None when nothing is due."""
    segs = view.ordered()
    if len(segs) < 2:
        return None
    candidates = [s for s in segs[:-1] if s.is_sealed]
    if protect is not None:
        kept = next((i for i, s in enumerate(candidates) if not passed(s, protect)), len(candidates))
        candidates = candidates[:kept]
    doomed: list[SegmentMeta] = []
    if retention_ms is not None:
        doomed += [s for s in candidates if s.sealed_ms is not None and now_ms - s.sealed_ms > retention_ms]
    if retention_bytes is not None:
        total = sum(s.bytes for s in segs)
        for s in candidates:
            if total <= retention_bytes:
                break
            total -= s.bytes
            if s not in doomed:
                doomed.append(s)
    if not doomed:
        return None
    doomed.sort(key=lambda s: s.sequence)
    # Deleting a segment before the truncation point's segment keeps readers consistent: records
    # before the oldest kept segment are gone, which is what the truncation point then says.
    keep_from = min(s.sequence for s in segs if s not in doomed)
    point = (keep_from, 0, 0)
    old = view.meta.truncated_before
    meta = replace(view.meta, truncated_before=point if old is None or point > old else old)
    return _deleting(view, meta, [s for s in doomed if s.sequence < keep_from])


# ---------------------------------------------------------------------- bytes on bookies (DESIGN §4.10)

def on_bookies(segments: list[SegmentMeta]) -> tuple[int, int]:
    """(sealed, open): the bytes of the sealed segments (tiered ones live in Delta, not on bookies)
    and of the segment in progress as its writer last published them. The unit is the segments'
    ledger bytes, one copy (records and their record-set framing; not times the write quorum):
    what ``SegmentMeta.bytes``, stream info and ``retention_bytes`` count too."""
    sealed = sum(s.bytes for s in segments if s.state is SegmentState.SEALED)
    return sealed, sum(s.bytes for s in segments if s.state is SegmentState.IN_PROGRESS)


def accounted(view: StreamView, change: Change) -> Change:
    """``change`` with the stream node's byte counts (``sealed_bytes``, ``open_bytes``) recomputed
    from the segments it leaves. The commit loop applies it to every change, so the counts follow
    every seal, roll, truncation, retention, tiering and publication without a change having to
    know them, and a stream written before they were kept gets them at its next change."""
    segs = {seq: seg for seq, (seg, _v) in view.segments.items()}
    for seq, _v in change.delete:
        segs.pop(seq, None)
    for seg, _v in change.update:
        segs[seg.sequence] = seg
    for seg in change.create:
        segs[seg.sequence] = seg
    sealed, open_ = on_bookies(list(segs.values()))
    if change.meta.sealed_bytes == sealed and change.meta.open_bytes == open_:
        return change
    return replace(change, meta=replace(change.meta, sealed_bytes=sealed, open_bytes=open_))


def publish_open_bytes(view: StreamView, sequence: int, nbytes: int) -> Change | None:
    """The writer of segment ``sequence`` says it holds ``nbytes`` so far (so that other writers and
    the namespace's usage see it before the segment is sealed). None when there is nothing to
    change: the segment is no longer in progress (sealed meanwhile: its seal recorded the exact
    bytes) or already shows as much (a publication never lowers the count)."""
    if nbytes < 0:
        raise InvalidMetadataError(f"segment {sequence}: {nbytes} bytes")
    got = view.segments.get(sequence)
    if got is None or got[0].state is not SegmentState.IN_PROGRESS or got[0].bytes >= nbytes:
        return None
    return Change(view.meta, update=((replace(got[0], bytes=nbytes), got[1]),))
