"""What a stream writer does to segments through the metadata: the commit loop, recovering a dead
writer's segment, and retention. Each step is a pure transition (metadata.streams.transitions)
committed by one multi-op; a lost CAS re-reads the stream and decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from metadata import BadVersionError, NoNodeError
from metadata.streams import Change, SegmentEnd, SegmentMeta, StreamLockInfo, StreamView
from metadata.streams import transitions as tr

from .. import errors
from .namespace import now_ms, stream_errors
from .records import RecordSet

if TYPE_CHECKING:
    from .namespace import Namespace

log = logging.getLogger(__name__)

COMMIT_TRIES_MAX = 20


def commit(ns: Namespace, name: str, decide: Callable[[StreamView], Change | None],
           lock: StreamLockInfo | None) -> tuple[StreamView, Change | None]:
    """Read the stream, decide the change, commit it; a lost CAS (someone else changed the stream:
    retention, a truncation) decides again on a fresh read. A lost lock is StreamLockedError."""
    for _ in range(COMMIT_TRIES_MAX):
        view = ns.view(name)
        change = decide(view)
        if change is None:
            return view, None
        try:
            with stream_errors(f"change stream {ns.name}/{name}"):
                try:
                    ns.client.store.commit_stream(ns.name, name, view.version, change, lock)
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
    last = h.last_add_confirmed
    if last < 0:
        log.info("stream %s/%s: dropping empty segment %d (ledger %d)", ns.name, name, seg.sequence, seg.ledger_id)
        commit(ns, name, lambda v: tr.drop_empty_segment(v, seg.sequence) if _still(v, seg) else None, lock)
        return
    # The last entry may be a control record set (no records): the segment ends at the last entry
    # that holds records. Control entries only follow a write that completed, one per idle spell,
    # so this walks back one or two entries.
    while True:
        rs = RecordSet(h.read(last, last)[0].data, f"ledger {seg.ledger_id} entry {last}", seg.first_txid)
        if rs.count or last == 0:
            break
        last -= 1
    if rs.count == 0:
        log.info("stream %s/%s: dropping segment %d without records", ns.name, name, seg.sequence)
        commit(ns, name, lambda v: tr.drop_empty_segment(v, seg.sequence) if _still(v, seg) else None, lock)
        return
    end = SegmentEnd(last_entry_id=last, last_slot=rs.count - 1, record_count=rs.records_before + rs.count,
                     nbytes=h.length, last_txid=int(rs.txids[-1]))
    log.info("stream %s/%s: sealing segment %d of a dead writer at entry %d (%d records)", ns.name, name,
             seg.sequence, last, end.record_count)
    commit(ns, name, lambda v: tr.seal_segment(v, seg.sequence, end, now_ms()) if _still(v, seg) else None, lock)


def _still(view: StreamView, seg: SegmentMeta) -> bool:
    cur = view.segments.get(seg.sequence)
    return cur is not None and not cur[0].is_sealed


def apply_retention(ns: Namespace, name: str, now: int | None = None) -> int:
    """Delete the sealed segments past the namespace's retention limits (and their ledgers)."""
    s = ns.settings
    if s.retention_ms is None and s.retention_bytes is None:
        return 0
    _view, change = commit(ns, name, lambda v: tr.retention(v, now if now is not None else now_ms(),
                                                            s.retention_ms, s.retention_bytes), None)
    return 0 if change is None else len(change.delete)
