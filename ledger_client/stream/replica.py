"""A stream's replica on another cluster (DESIGN §4.12, invariant 13): what the replicator needs
of the client beyond the sink, with no Spark here.

A replica's segments are the ledgers a replicator's tasks wrote, each linked with the range of
source positions it copies (``SegmentMeta.source``; linking refuses to take a source record twice).
From those ranges:

- ``replica_namespace``: a target namespace that does not exist yet is made with the source's
  settings, less those that name things of the source cluster (its bookie groups, its Delta
  tiering table: two clusters tiering into one table would corrupt it).
- ``replicated_through``: the last source position the replica holds, where a replicator without
  a checkpoint resumes.
- ``carry_truncation``: the source was truncated before a position; the replica is truncated
  before the first record that copies a source record at or after it. Exact: inside a segment
  that straddles the point, the records of the source from the point to the segment's last source
  position are counted (they still exist, being at or after the point), and the replica keeps
  exactly that many of the segment's last records. A replicator whose role on the replica may
  only produce cannot read it and cuts at that segment's start: a few records more are kept,
  never one fewer.
- ``carry_end``: the source ended and the replica holds all of it: the replica ends too.

Both changes are CAS commits (a lost one decides again on a fresh read), never taking the
stream's writer lock, as retention does: the replicator's own links hold it only to link.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from metadata.streams import linking
from metadata.streams import transitions as tr
from metadata.streams.model import Position, SegmentMeta

from .. import errors
from .dlsn import DLSN
from .segments import commit

if TYPE_CHECKING:
    from ..client import LedgerClient
    from .namespace import Namespace

log = logging.getLogger(__name__)

CLUSTER_LOCAL_SETTINGS = ("bookie_groups", "bookie_groups_secondary", "tier_table", "tier_after_ms")
COUNT_BATCH_RECORDS = 10_000
COUNT_WAIT_MS = 200


def replica_settings(source: Namespace) -> dict[str, object]:
    """The source namespace's settings a replica's namespace takes (see the module's doc)."""
    return {k: v for k, v in source.settings.to_json().items() if k not in CLUSTER_LOCAL_SETTINGS}


def replica_namespace(target: LedgerClient, source: LedgerClient | None, name: str) -> Namespace:
    """The target's namespace ``name``, made from the source's (same tenant, settings as above)
    when it does not exist and a source is given; NoSuchNamespaceError otherwise."""
    try:
        return target.namespace(name)
    except errors.NoSuchNamespaceError:
        if source is None:
            raise
    src = source.namespace(name)
    try:
        ns = target.create_namespace(name, tenant=src.tenant, **replica_settings(src))
        log.info("replica namespace %s created from the source's settings (tenant %s)", name, src.tenant)
        return ns
    except errors.NamespaceExistsError:
        return target.namespace(name)


def replicated_through(target: Namespace, stream: str, source_ctime_ms: int | None = None) -> DLSN | None:
    """The last source position the replica holds (None: no replica, or nothing copied yet, or
    copies of another source stream than the one created at ``source_ctime_ms``, when given: a
    stream deleted and created again under its name starts its positions again)."""
    view = target.view_if_any(stream)
    if view is None or (source_ctime_ms and view.meta.source_ctime_ms not in (None, source_ctime_ms)):
        return None
    through = linking.replicated_through(view)
    return DLSN(*through) if through is not None else None


def carry_truncation(source: Namespace, target: Namespace, stream: str, source_before: DLSN) -> DLSN | None:
    """Truncate the replica where its source was truncated (``source_before``); the replica's new
    truncation point, or None when it was there already. The cut is found once, before the CAS
    loop: a segment's source range never changes, so a lost CAS only decides again whether to cut."""
    view = target.view(stream)
    cut, straddled = linking.replica_cut(view, tuple(source_before))  # type: ignore[arg-type]
    if straddled is not None:
        try:
            cut = _cut_inside(source, target, stream, straddled, source_before)
        except errors.UnauthorizedAccessError as e:   # a role with produce only on the replica
            log.warning("replica %s/%s: truncated at segment %d's start, not inside it (%s)", target.name,
                        stream, straddled.sequence, e)

    def decide(v: tr.StreamView) -> tr.Change | None:
        old = v.meta.truncated_before
        return None if old is not None and cut <= old else tr.truncate(v, cut)

    _view, change = commit(target, stream, decide, None)
    if change is None:
        return None
    log.info("replica %s/%s truncated before %s (source before %s)", target.name, stream, DLSN(*cut), source_before)
    return DLSN(*cut)


def _cut_inside(source: Namespace, target: Namespace, stream: str, seg: SegmentMeta, before: DLSN) -> Position:
    """The replica's position of the first record that copies one at or after ``before``, inside
    ``seg`` (which copies records on both sides of it)."""
    if seg.source is None:
        raise errors.MetadataServiceError(f"segment {seg.sequence} of {target.name}/{stream} is not a copy")
    kept = _records_through(source, stream, before, DLSN(*seg.source[1]))
    if kept > seg.record_count:
        raise errors.MetadataServiceError(
            f"replica {target.name}/{stream} segment {seg.sequence} holds {seg.record_count} records, but its source "
            f"has {kept} from {before} through {DLSN(*seg.source[1])}: the replica does not copy its source")
    if kept == 0:
        return (seg.sequence + 1, 0, 0)
    return tuple(_nth_record(target, stream, DLSN(seg.sequence, 0, 0), seg.record_count - kept))  # type: ignore[return-value]


def _records_through(ns: Namespace, stream: str, start: DLSN, last: DLSN) -> int:
    """How many records the stream holds from ``start`` through ``last``."""
    n = 0
    with ns.open_reader(stream, start=start) as r:
        while recs := r.read_batch(max_records=COUNT_BATCH_RECORDS, timeout_ms=COUNT_WAIT_MS):
            for rec in recs:
                if rec.dlsn > last:
                    return n
                n += 1
    return n


def _nth_record(ns: Namespace, stream: str, start: DLSN, index: int) -> DLSN:
    """The position of the stream's ``index``-th record (from 0) at or after ``start``."""
    seen = 0
    with ns.open_reader(stream, start=start) as r:
        while recs := r.read_batch(max_records=COUNT_BATCH_RECORDS, timeout_ms=COUNT_WAIT_MS):
            if seen + len(recs) > index:
                return recs[index - seen].dlsn
            seen += len(recs)
    raise errors.MetadataServiceError(f"stream {ns.name}/{stream} has {seen} records from {start}, "
                                      f"fewer than its metadata says (> {index})")


def carry_end(target: Namespace, stream: str) -> bool:
    """End the replica (its source ended and it holds every record); True when it was ended now."""
    def decide(view: tr.StreamView) -> tr.Change | None:
        return None if view.meta.end_of_stream else tr.end_stream(view)

    _view, change = commit(target, stream, decide, None)
    if change is not None:
        log.info("replica %s/%s ended, as its source did", target.name, stream)
    return change is not None
