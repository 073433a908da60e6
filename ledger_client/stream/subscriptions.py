"""Subscriptions: durable reader positions with their backlog (DESIGN §4.11, invariant 12;
DistributedLog's SubscriptionsStore, Pulsar's cursors).

A subscription is a znode under its stream (metadata/streams/store.py) holding the last record it
consumed and a ``mark``: how many records and bytes of that record's segment are at or before it.
The mark is read once, from the record's entry, when a position is written (a reader writes at
most one position per ``commit_interval_ms``: stream/commits.py), so that a backlog is exact from
segment metadata alone (sealed and tiered segments' counts, the segment in progress's from its
LAC entry, as stream info reads it): ``subscriptions(stream)`` never reads records.

Every change is a pure transition (metadata/streams/subscriptions.py) committed by CAS in one loop
(``update``): a commit only moves forward (a lower position is ignored), a reset may move back and
then also sets the stream node, so a retention decided before it loses its CAS and decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metadata import BadVersionError, NodeExistsError
from metadata.streams import SegmentMeta, StreamView, SubscriptionMeta
from metadata.streams import subscriptions as subs
from metadata.streams.model import Position

from .. import errors
from ..metadata_errors import metadata_errors
from .dlsn import DLSN
from .meta import check_names, now_ms
from .records import HEADER_BYTES, RECORD_OVERHEAD_BYTES, RecordSet
from .segments import live_end
from .tiered import read_tiered_segment

if TYPE_CHECKING:
    from .namespace import Namespace

log = logging.getLogger(__name__)

UPDATE_TRIES_MAX = 20     # lost CASes in a row (racing commits of one subscription) before giving up
INFO_TRIES = 3            # reads of a stream whose segment in progress lost its ledger meanwhile


@dataclass(frozen=True)
class SubscriptionInfo:
    """A subscription as ``Namespace.subscriptions`` finds it. ``position`` is the last record it
    consumed (a reader resumes after it); one that consumed nothing of an entry yet shows slot -1
    (it resumes at slot 0). The backlog is exact: records after the position and their bytes (the
    unit of ``SegmentInfo.bytes`` and the storage quota), counted from segment metadata and the
    segment in progress's LAC entry, never by reading records."""

    name: str
    position: DLSN
    backlog_records: int
    backlog_bytes: int
    updated_ms: int


def check_subscription(name: str) -> None:
    check_names((name, "subscription"))


def as_position(dlsn: object, what: str = "position") -> Position:
    """A DLSN (or a 3-tuple) as a stored position: segment >= 1, entry >= 0, slot >= -1."""
    if not isinstance(dlsn, tuple) or len(dlsn) != 3 or any(
            not isinstance(x, int) or isinstance(x, bool) for x in dlsn):
        raise errors.IncorrectParameterError(f"{what} must be a DLSN, not {dlsn!r}")
    seg, entry, slot = dlsn
    if seg < 1 or entry < 0 or slot < -1:
        raise errors.IncorrectParameterError(f"{what} {seg}/{entry}/{slot} is not a position")
    return (seg, entry, slot)


# ---------------------------------------------------------------------- where the stream ends

def stream_end(ns: Namespace, stream: str, view: StreamView) -> Position | None:
    """The last record acknowledged so far (the segment in progress read up to its LAC), or None."""
    last: Position | None = None
    for seg in view.ordered():
        if seg.is_sealed:
            last = seg.last_dlsn or last
        else:
            live = live_end(ns, stream, seg)
            if live is not None and live.record_count:
                last = (seg.sequence, live.last_entry_id, live.last_slot)
    return last


def check_not_past_end(ns: Namespace, stream: str, view: StreamView, pos: Position) -> None:
    """PositionPastEndError unless ``pos`` is a record written so far, or a point just before one
    (slot -1), or the start of the next segment."""
    if pos[1] == 0 and pos[2] == -1 and pos[0] <= view.meta.next_sequence:
        return
    end = stream_end(ns, stream, view)
    if end is not None and (pos <= end or pos[2] == -1 and (pos[0], pos[1], 0) <= (end[0], end[1], end[2] + 1)):
        return
    raise errors.PositionPastEndError(f"stream {ns.name}/{stream}: position {DLSN(*pos)} is after its last record "
                                      f"({DLSN(*end) if end else 'none yet'})")


# ---------------------------------------------------------------------- marks: records and bytes up to a position

def position_mark(ns: Namespace, stream: str, view: StreamView, pos: Position) -> tuple[int, int]:
    """(records, bytes) of ``pos``'s segment at or before it: read from the one entry holding it
    (for slot -1, the entry before). A segment gone (retention) or not yet started counts (0, 0).
    PositionPastEndError when the entry or slot does not exist."""
    got = view.segments.get(pos[0])
    if got is None or (pos[1] == 0 and pos[2] == -1):
        return (0, 0)
    seg = got[0]
    entry, slot = (pos[1] - 1, None) if pos[2] == -1 else (pos[1], pos[2])
    if seg.ledger_id is not None:
        return _ledger_mark(ns, stream, seg, entry, slot, pos)
    if seg.tier is not None:
        return _tiered_mark(ns, stream, seg, entry, slot, pos)
    return (0, 0)


def _past_end(ns: Namespace, stream: str, pos: Position) -> errors.PositionPastEndError:
    return errors.PositionPastEndError(f"stream {ns.name}/{stream}: no record at {DLSN(*pos)} (past the end)")


def _ledger_mark(ns: Namespace, stream: str, seg: SegmentMeta, entry: int, slot: int | None,
                 pos: Position) -> tuple[int, int]:
    """From the entry's record set (records before it, its payload lengths) and its framing
    header (the ledger's length through it), on a handle of its own, never fencing a writer."""
    h = ns.client.open_ledger(seg.ledger_id or 0, ns.settings.ledger_password, recovery=False)
    if entry > h.last_add_confirmed and not h.is_closed:
        h.read_last_add_confirmed()
    if entry > h.last_add_confirmed:
        raise _past_end(ns, stream, pos)
    data = h.read(entry, entry)[0].data
    at, length = h.known_length
    if at != entry:
        raise errors.MetadataServiceError(f"stream {ns.name}/{stream}: the length of segment {seg.sequence} "
                                          f"through entry {entry} is unknown")
    rs = RecordSet(data, f"stream {ns.name}/{stream} segment {seg.sequence} entry {entry}", seg.first_txid)
    if slot is None:
        return rs.records_before + rs.count, length
    if slot >= rs.count:
        raise _past_end(ns, stream, pos)
    tail = sum(RECORD_OVERHEAD_BYTES + len(p) for p in rs.payloads[slot + 1:])
    return rs.records_before + slot + 1, length - tail


def _tiered_mark(ns: Namespace, stream: str, seg: SegmentMeta, entry: int, slot: int | None,
                 pos: Position) -> tuple[int, int]:
    """A tiered segment's ledger is gone: its rows up to the entry, from Delta (a subscription that
    far behind is rare; the bytes leave out the control records' framing, which Delta does not keep)."""
    rows = read_tiered_segment(seg, ns.name, stream, DLSN(seg.sequence, 0, 0), entry)
    upto = [r for r in rows if slot is None or (r.dlsn.entry_id, r.dlsn.slot) <= (entry, slot)]
    if slot is not None and (not upto or upto[-1].dlsn != (seg.sequence, entry, slot)):
        raise _past_end(ns, stream, pos)
    entries = {r.dlsn.entry_id for r in upto}
    return len(upto), len(entries) * HEADER_BYTES + sum(RECORD_OVERHEAD_BYTES + len(r.payload) for r in upto)


# ---------------------------------------------------------------------- the CAS loop

Decide = Callable[[SubscriptionMeta | None], tuple[SubscriptionMeta, bool] | None]


def update(ns: Namespace, stream: str, name: str, decide: Decide, what: str) -> SubscriptionMeta | None:
    """Read the subscription, decide (the new meta and whether it must guard the stream node, or
    None: nothing to write), write by CAS; a lost CAS decides again on a fresh read. The meta
    written, or None."""
    store = ns.client.store.streams
    for _ in range(UPDATE_TRIES_MAX):
        with metadata_errors(what):
            got = store.read_subscription(ns.name, stream, name)
        decided = decide(got[0] if got else None)
        if decided is None:
            return None
        new, guard = decided
        try:
            with metadata_errors(what):
                try:
                    store.write_subscription(ns.name, stream, name, new, None if got is None else got[1], guard=guard)
                except (BadVersionError, NodeExistsError):
                    continue
        except errors.NoSuchSubscriptionError:
            if got is None:
                raise
            continue   # deleted after the read: decide again (a reader's commit then says so)
        return new
    raise errors.MetadataVersionError(f"{what}: the subscription kept changing; gave up after {UPDATE_TRIES_MAX} tries")


def _gone(ns: Namespace, stream: str, name: str) -> errors.NoSuchSubscriptionError:
    return errors.NoSuchSubscriptionError(f"stream {ns.name}/{stream} has no subscription {name!r}")


# ---------------------------------------------------------------------- operations

def commit_position(ns: Namespace, stream: str, name: str, pos: Position, *, create: bool,
                    view: StreamView | None = None) -> None:
    """Move ``name`` forward to ``pos`` (a lower or equal position is ignored); ``create``: make it
    when absent (else NoSuchSubscriptionError)."""
    view = view if view is not None else ns.view(stream)
    mark = position_mark(ns, stream, view, pos)

    def decide(cur: SubscriptionMeta | None) -> tuple[SubscriptionMeta, bool] | None:
        if cur is None:
            if not create:
                raise _gone(ns, stream, name)
            return subs.created(pos, mark, now_ms()), True
        new = subs.advanced(cur, pos, mark, now_ms())
        return None if new is None else (new, False)

    update(ns, stream, name, decide, f"commit subscription {name} of {ns.name}/{stream}")


def target_position(ns: Namespace, stream: str, view: StreamView, target: object) -> Position:
    """A reset's target: a DLSN (checked against the stream's end), ``"earliest"`` (before the first
    record kept) or ``"latest"`` (the last record written)."""
    if target == "earliest":
        tb = view.meta.truncated_before
        if tb is not None:
            return (tb[0], tb[1], tb[2] - 1)
        first = min(view.segments, default=view.meta.next_sequence)
        return (first, 0, -1)
    if target == "latest":
        end = stream_end(ns, stream, view)
        if end is not None:
            return end
        seg = view.in_progress
        return (seg.sequence if seg is not None else view.meta.next_sequence, 0, -1)
    if isinstance(target, str):
        raise errors.IncorrectParameterError(f"a position is a DLSN, 'earliest' or 'latest', not {target!r}")
    pos = as_position(target)
    check_not_past_end(ns, stream, view, pos)
    return pos


def reset_position(ns: Namespace, stream: str, name: str, target: object) -> None:
    """Move ``name`` to ``target``, back or forward; NoSuchSubscriptionError if absent."""
    view = ns.view(stream)
    pos = target_position(ns, stream, view, target)
    mark = position_mark(ns, stream, view, pos)

    def decide(cur: SubscriptionMeta | None) -> tuple[SubscriptionMeta, bool] | None:
        if cur is None:
            raise _gone(ns, stream, name)
        new = subs.reset(cur, pos, mark, now_ms())
        return None if new is None else (new, pos < cur.position)

    update(ns, stream, name, decide, f"reset subscription {name} of {ns.name}/{stream}")
    log.info("stream %s/%s: subscription %s reset to %s", ns.name, stream, name, DLSN(*pos))


def delete(ns: Namespace, stream: str, name: str) -> None:
    ns.view(stream)   # NoSuchStreamError first
    with metadata_errors(f"delete subscription {name} of {ns.name}/{stream}"):
        ns.client.store.streams.delete_subscription(ns.name, stream, name)


def infos(ns: Namespace, stream: str) -> dict[str, SubscriptionInfo]:
    """Every subscription with its exact backlog (the segment in progress read up to its LAC; read
    again when its ledger went meanwhile: an empty segment dropped by a writer's recovery)."""
    for attempt in range(INFO_TRIES):
        view = ns.view(stream)
        if not view.subscriptions:
            return {}
        seg = view.in_progress
        try:
            live = live_end(ns, stream, seg) if seg is not None else None
            break
        except errors.NoSuchLedgerError:
            if attempt + 1 == INFO_TRIES:
                raise
    out = {}
    for name, (sub, _v) in sorted(view.subscriptions.items()):
        records, nbytes = subs.backlog(view, sub, live)
        out[name] = SubscriptionInfo(name, DLSN(*sub.position), records, nbytes, sub.updated_ms)
    return out


def open_position(ns: Namespace, stream: str, name: str, view: StreamView, start: DLSN) -> tuple[DLSN, Position]:
    """Where a reader of ``name`` starts: after its committed position, or, for a new one (created
    here, just before ``start``), at ``start``. Also the position stored."""
    what = f"open subscription {name} of {ns.name}/{stream}"
    with metadata_errors(what):
        got = ns.client.store.streams.read_subscription(ns.name, stream, name)
    if got is None:
        pos = (start.segment, start.entry_id, start.slot - 1)
        mark = position_mark(ns, stream, view, pos)
        update(ns, stream, name, lambda cur: None if cur is not None else (subs.created(pos, mark, now_ms()), True),
               what)
        with metadata_errors(what):
            got = ns.client.store.streams.read_subscription(ns.name, stream, name)
        if got is None:
            raise _gone(ns, stream, name)   # deleted as soon as made
    return DLSN(*got[0].resume), got[0].position


__all__ = ["SubscriptionInfo", "as_position", "check_not_past_end", "commit_position", "delete", "infos",
           "open_position", "reset_position", "stream_end"]
