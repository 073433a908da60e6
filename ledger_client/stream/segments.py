"""What a stream writer does to segments through the metadata: the commit loop, recovering a dead
writer's segment, and retention. Each step is a pure transition (metadata.streams.transitions)
committed by one multi-op; a lost CAS re-reads the stream and decides again. Also where a segment
in progress ends so far (stream info), read without fencing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from metadata import BadVersionError, NoNodeError
from metadata.streams import Change, SegmentEnd, SegmentMeta, StreamLockInfo, StreamView
from metadata.streams import subscriptions as subs
from metadata.streams import transitions as tr

from .. import errors
from ..metadata_errors import metadata_errors
from .meta import now_ms
from .records import RecordSet

if TYPE_CHECKING:
    from ..read_handle import ReadHandle
    from .namespace import Namespace

log = logging.getLogger(__name__)

COMMIT_TRIES_MAX = 20


def commit(ns: Namespace, name: str, decide: Callable[[StreamView], Change | None],
           lock: StreamLockInfo | None) -> tuple[StreamView, Change | None]:
    """Read the stream, decide the change, commit it; a lost CAS (someone else changed the stream:
    retention, a truncation) decides again on a fresh read. A lost lock is StreamLockedError.
    Every change leaves with the stream node's bytes on bookies recomputed (tr.accounted): the
    change returned is the one committed."""
    for _ in range(COMMIT_TRIES_MAX):
        view = ns.view(name)
        decided = decide(view)
        if decided is None:
            return view, None
        change = tr.accounted(view, decided)
        try:
            with metadata_errors(f"change stream {ns.name}/{name}"):
                try:
                    ns.client.store.streams.commit_stream(ns.name, name, view.version, change, lock)
                except NoNodeError as e:
                    raise errors.StreamLockedError(f"stream {ns.name}/{name}: this writer lost its lock ({e}); "
                                                   "another writer may own the stream now") from e
        except errors.MetadataVersionError as e:
            if not isinstance(e.__cause__, BadVersionError):
                raise
            continue
        for lid in change.released_ledgers:
            ns.client.delete_ledger(lid)
        return view, change
    raise errors.MetadataVersionError(f"stream {ns.name}/{name} kept changing: gave up after {COMMIT_TRIES_MAX} tries")


def recover_segment(ns: Namespace, name: str, seg: SegmentMeta, lock: StreamLockInfo) -> None:
    """A writer died with ``seg`` in progress: open its ledger with recovery (fencing: the dead
    writer, should it be alive after all, gets no more acks) and seal the segment where the
    ledger ends. The last entry's record-set header gives the record count and the last txid.
    An empty ledger's segment is dropped instead."""
    if seg.ledger_id is None:
        raise errors.MetadataServiceError(f"segment {seg.sequence} of {ns.name}/{name} is in progress without a ledger")
    h = ns.client.open_ledger(seg.ledger_id, ns.settings.ledger_password, recovery=True)
    found = last_records(h, seg, h.last_add_confirmed, f"ledger {seg.ledger_id}")
    if found is None:
        log.info("stream %s/%s: dropping segment %d (ledger %d) without records", ns.name, name, seg.sequence,
                 seg.ledger_id)
        commit(ns, name, lambda v: tr.drop_empty_segment(v, seg.sequence) if _still(v, seg) else None, lock)
        return
    last, rs = found
    end = SegmentEnd(last_entry_id=last, last_slot=rs.count - 1, record_count=rs.records_before + rs.count,
                     nbytes=h.length, last_txid=int(rs.txids[-1]))
    log.info("stream %s/%s: sealing segment %d of a dead writer at entry %d (%d records)", ns.name, name,
             seg.sequence, last, end.record_count)
    commit(ns, name, lambda v: tr.seal_segment(v, seg.sequence, end, now_ms()) if _still(v, seg) else None, lock)


def last_records(h: ReadHandle, seg: SegmentMeta, last: int, where: str,
                 top: RecordSet | None = None) -> tuple[int, RecordSet] | None:
    """The last entry at or before ``last`` that holds records, with its record set (``top``: entry
    ``last``'s, already read); None when none does. The ledger may end with a control record set
    (no records), but control entries only follow a write that completed, one per idle spell, so
    this walks back one or two entries."""
    while last >= 0:
        rs = top if top is not None else RecordSet(h.read(last, last)[0].data, f"{where} entry {last}",
                                                  seg.first_txid)
        top = None
        if rs.count:
            return last, rs
        last -= 1
    return None


def live_end(ns: Namespace, name: str, seg: SegmentMeta) -> SegmentEnd | None:
    """Where the in-progress segment ``seg`` ends now, as any process sees it: its ledger opened
    without recovery (never fencing its writer, alive or dead), up to the LAC the bookies know,
    which covers every record acknowledged to the writer once its next entry (at the latest its
    idle control record) is stored. The entry at the LAC tells the records so far (its record
    set's count of the records before it) and the bytes (its framing header's ledger length); the
    last record comes from the last entry holding records. None while no entry is confirmed."""
    if seg.ledger_id is None:
        return None
    h = ns.client.open_ledger(seg.ledger_id, ns.settings.ledger_password, recovery=False)
    lac = h.last_add_confirmed
    if lac < 0 and not h.is_closed:
        lac = h.read_last_add_confirmed()   # the open found none, or failed quietly: now its errors show
    if lac < 0:
        return None
    where = f"stream {ns.name}/{name} segment {seg.sequence} (ledger {seg.ledger_id})"
    data = h.read(lac, lac)[0].data
    top = RecordSet(data, f"{where} entry {lac}", seg.first_txid)
    nbytes = h.length   # the ledger's length through the entry at the LAC, from its framing header
    found = last_records(h, seg, lac, where, top)
    if found is None:
        return SegmentEnd(last_entry_id=-1, last_slot=-1, record_count=0, nbytes=nbytes, last_txid=-1)
    last, rs = found
    return SegmentEnd(last_entry_id=last, last_slot=rs.count - 1, record_count=rs.records_before + rs.count,
                      nbytes=nbytes, last_txid=int(rs.txids[-1]))


def _still(view: StreamView, seg: SegmentMeta) -> bool:
    cur = view.segments.get(seg.sequence)
    return cur is not None and not cur[0].is_sealed


def apply_retention(ns: Namespace, name: str, now: int | None = None) -> int:
    """Delete the sealed segments past the namespace's retention limits (and their ledgers), none
    that a subscription has not passed with ``retain_until_consumed`` (invariant 12); then, with a
    backlog quota's ``drop_oldest``, the oldest segments while the slowest subscription's backlog is
    over it. How many segments went."""
    s = ns.settings
    deleted = 0
    if s.retention_ms is not None or s.retention_bytes is not None:
        def decide(v: StreamView) -> Change | None:
            if not s.retain_until_consumed:
                return tr.retention(v, now if now is not None else now_ms(), s.retention_ms, s.retention_bytes)
            change = tr.retention(v, now if now is not None else now_ms(), s.retention_ms, s.retention_bytes,
                                  subs.protect_point(v))
            # Decided on these subscriptions: lost if one is created or moved back meanwhile.
            return None if change is None else replace(change, guard=v.subscriptions_version)
        _view, change = commit(ns, name, decide, None)
        deleted += 0 if change is None else len(change.delete)
    if s.backlog_quota_bytes is not None and s.backlog_quota_policy == "drop_oldest":
        deleted += _drop_oldest(ns, name, s.backlog_quota_bytes)
    return deleted


def _drop_oldest(ns: Namespace, name: str, quota: int) -> int:
    """The backlog quota's drop_oldest (Pulsar's consumer_backlog_eviction), with a log line and a
    counter for the segments deleted unconsumed and the subscriptions moved past them."""
    _view, change = commit(ns, name, lambda v: subs.drop_oldest(v, quota, now_ms()), None)
    if change is None:
        return 0
    moved = [m[0] for m in change.moved]
    log.warning("stream %s/%s: backlog over its quota of %d bytes: deleted segments %s unconsumed; "
                "subscriptions %s moved to %s", ns.name, name, quota, [seq for seq, _v in change.delete],
                moved, change.meta.truncated_before)
    metrics = ns.client.metrics
    if metrics is not None:
        metrics.stream_backlog_dropped_segments.inc(len(change.delete))
        metrics.stream_subscriptions_moved.inc(len(moved))
    return len(change.delete)
