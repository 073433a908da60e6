"""``readStream.format("ledger").option("subscription", NAME)``: each committed microbatch moves
the subscription NAME of every stream it read (DESIGN §4.11) to where the batch ended.

Spark's checkpoint stays the query's source of truth: a restarted query starts from its
checkpoint, never from the subscription. The subscription makes the query's progress visible
(``spark-bookie stream subscriptions``, the backlog gauge) and, with ``retain_until_consumed``,
keeps retention from deleting what the query has yet to read. It is committed on the driver from
the source's ``commit(end)`` and ``latestOffset(start)``: Spark calls the first for a batch only
when the next batch with data starts, and the second, on every trigger, with the end of a batch
whose output is committed (a batch restarted after a failure is re-run from the offset log without
asking). So a subscription never passes what the sink holds, and reaches the end of the last
batch within a trigger (an availableNow query asks once more before it stops). A replayed batch
commits the same or a lower position, which the subscription ignores (positions only move
forward); an unchanged end costs nothing. A failed commit is a warning, not a failed query: the
next trigger commits past it.

An end offset is the next position to read (exclusive); a subscription's position is the last
record consumed, and the client accepts only a record written so far or a point just before one
(slot -1). So for an end ``(s, e, k)``: ``(s, e, k - 1)`` inside an entry; ``(s, 0, -1)`` at a
segment's start (nothing of it consumed, everything before it); otherwise the last record before
entry ``e``: a sealed segment's from its metadata (or ``(s, e, -1)`` when records follow), the
segment in progress's from one range read of the entries just before ``e`` (the last one may be
its writer's idle control record, which holds no record).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ledger_client.stream.dlsn import DLSN

if TYPE_CHECKING:
    from ledger_client import LedgerClient, Namespace
    from metadata.streams import SegmentMeta

log = logging.getLogger(__name__)

TAIL_ENTRIES = 8   # entries read back from a microbatch's end for its last record (one range read)


def consumed_through(ns: Namespace, name: str, end: DLSN) -> DLSN:
    """The subscription position of a reader that read everything of stream ``name`` before
    ``end`` and nothing from it (see the module's doc)."""
    if end.slot > 0:
        return DLSN(end.segment, end.entry_id, end.slot - 1)
    if end.entry_id == 0:
        return DLSN(end.segment, 0, -1)
    got = ns.view(name).segments.get(end.segment)
    if got is None:
        return DLSN(end.segment, end.entry_id, -1)   # gone since (retention): the stream is past it
    seg = got[0]
    if not seg.is_sealed:
        return _last_record_before(ns, name, seg, end)
    last = seg.last_dlsn
    if last is None:
        return DLSN(end.segment, 0, -1)   # an empty segment
    return DLSN(*last) if last[1] < end.entry_id else DLSN(end.segment, end.entry_id, -1)


def _last_record_before(ns: Namespace, name: str, seg: SegmentMeta, end: DLSN) -> DLSN:
    from ledger_client.stream.records import RecordSet

    h = ns.client.open_ledger(seg.ledger_id or 0, ns.settings.ledger_password, recovery=False)
    if end.entry_id - 1 > h.last_add_confirmed:
        h.read_last_add_confirmed()
    lo = max(0, end.entry_id - TAIL_ENTRIES)
    for entry in reversed(h.read(lo, end.entry_id - 1)):
        rs = RecordSet(entry.data, f"stream {ns.name}/{name} segment {seg.sequence} entry {entry.entry_id}",
                       seg.first_txid)
        if rs.count:
            return DLSN(seg.sequence, entry.entry_id, rs.count - 1)
    return DLSN(seg.sequence, lo, -1)


def commit_subscription(client: LedgerClient, subscription: str, ends: Mapping[str, DLSN],
                        committed: dict[str, DLSN]) -> int:
    """Move ``subscription`` of each stream ("ns/name") to where its microbatch ended; streams
    whose end did not move since the last commit (``committed``, updated) cost nothing. Returns
    the number of subscriptions written; failures are logged and retried with the next batch."""
    from ledger_client import errors

    written = 0
    for key, end in sorted(ends.items()):
        if committed.get(key) == end:
            continue
        ns_name, name = key.split("/", 1)
        try:
            ns = client.namespace(ns_name)
            ns.commit_subscription(name, subscription, consumed_through(ns, name, end))
            written += 1
            committed[key] = end
        except (errors.NoSuchStreamError, errors.NoSuchNamespaceError):
            committed.pop(key, None)   # deleted since the batch read it
        except errors.LedgerError as e:
            log.warning("subscription %s of %s not committed at %s: %s (the next batch tries again)",
                        subscription, key, end, e)
    return written
