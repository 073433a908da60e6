"""The ``ledger`` source over streams (DESIGN §4.6): ``option("streams", "payments/orders,payments/*")``.

    spark.read.format("ledger").option("zk", Z).option("streams", "payments/*").load()

Columns: ``stream`` STRING ("ns/name"), ``segment`` BIGINT, ``entry_id`` BIGINT, ``slot`` INT,
``txid`` BIGINT, ``payload`` (BINARY, or as ``decode`` says, as for ledgers).

The driver reads each matching stream's metadata and, for the segment in progress, its LAC
(opened without recovery: a Spark read never fences a live writer, and never returns a record the
writer was not told is durable); jobs/stream_planning.py turns that into partitions of entry
ranges. Each task opens its own client, reads its ranges (a sealed or in-progress segment from its
ledger, a tiered one from its Delta table at the version the metadata names), decodes record sets
into rows and closes the client in a ``finally`` (Python workers are reused).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from .connect import TASK_TIMEOUTS, task_client
from .connect import connect as connect_cluster
from .decode import decode_payload
from .options import StreamSourceOptions, matches
from .pyspark_compat import arrow_schema_of
from .stream_planning import (
    SegmentExtent,
    StreamPushdown,
    StreamSpan,
    plan_stream_spans,
    push_stream_filters,
    stream_end,
)

if TYPE_CHECKING:
    from ledger_client import LedgerClient
    from ledger_client.stream import Namespace
    from metadata.streams import StreamView

log = logging.getLogger(__name__)

ENTRIES_PER_READ = 64          # record sets per range read (each up to output_buffer_bytes)
ROW_SCHEMA = pa.schema([("stream", pa.string()), ("segment", pa.int64()), ("entry_id", pa.int64()),
                        ("slot", pa.int32()), ("txid", pa.int64()), ("payload", pa.binary())])


class StreamPartition(InputPartition):
    """One task's share: entry ranges of segments (picklable, planned on the driver)."""

    def __init__(self, spans: Sequence[StreamSpan]) -> None:
        super().__init__(tuple(spans))
        self.spans: tuple[StreamSpan, ...] = tuple(spans)

    def __repr__(self) -> str:
        return f"StreamPartition({', '.join(f'{s.stream}#{s.sequence}:{s.first}..{s.last}' for s in self.spans)})"


# ---------------------------------------------------------------- driver: metadata → extents


def connect(opts: StreamSourceOptions) -> LedgerClient:
    return connect_cluster(opts.zk, opts.client_conf, **TASK_TIMEOUTS)


def resolve_streams(client: LedgerClient, opts: StreamSourceOptions, strict: bool) -> list[tuple[str, str]]:
    """(namespace, stream) of every existing stream the patterns match, sorted. ``strict``: a
    pattern without glob characters that names no stream is NoSuchStreamError (a typo in a batch
    read should not read nothing); streaming reads wait for such a stream to appear instead."""
    from ledger_client import errors

    found: set[tuple[str, str]] = set()
    for ns in client.list_namespaces():
        if not any(matches([(a, "*")], ns, "x") for a, _ in opts.patterns):
            continue
        try:
            names = client.namespace(ns).list_streams()
        except errors.NoSuchNamespaceError:
            continue
        found |= {(ns, s) for s in names if matches(opts.patterns, ns, s)}
    if strict:
        for a, b in opts.patterns:
            if not any(c in a + b for c in "*?[") and (a, b) not in found:
                raise errors.NoSuchStreamError(f"option streams: stream {a}/{b} does not exist")
    return sorted(found)


def stream_extents(ns: Namespace, name: str, view: StreamView, read_lac: bool = True) -> list[SegmentExtent]:
    """Every segment of one stream as planning sees it; the one in progress up to its LAC (or,
    without ``read_lac``, unbounded: a microbatch's end offset bounds it, from an earlier LAC)."""
    from metadata.streams import SegmentState

    stream = f"{ns.name}/{name}"
    pw, ctime = ns.settings.ledger_password, view.meta.ctime_ms
    out: list[SegmentExtent] = []
    for s in view.ordered():
        if s.state is SegmentState.TIERED:
            tier = (s.tier.table, s.tier.delta_version) if s.tier else None
            if tier is None:
                raise ValueError(f"segment {s.sequence} of {stream} is tiered but names no table")
            out.append(SegmentExtent(stream, s.sequence, None, s.last_entry_id, s.first_txid, s.last_txid,
                                     s.record_count, tier, pw, ctime))
        elif s.is_sealed:
            out.append(SegmentExtent(stream, s.sequence, s.ledger_id, s.last_entry_id, s.first_txid, s.last_txid,
                                     s.record_count, None, pw, ctime))
        elif s.ledger_id is not None:
            lac = ns.client.open_ledger(s.ledger_id, pw, recovery=False).read_last_add_confirmed() if read_lac \
                else (1 << 62)
            out.append(SegmentExtent(stream, s.sequence, s.ledger_id, lac, s.first_txid, None, None, None, pw, ctime))
    return out


def gather(client: LedgerClient, streams: Sequence[tuple[str, str]],
           read_lac: bool = True) -> dict[str, tuple[StreamView, list[SegmentExtent]]]:
    """"ns/name" → (its metadata, its extents), for the streams that still exist."""
    from ledger_client import errors

    out: dict[str, tuple[StreamView, list[SegmentExtent]]] = {}
    spaces: dict[str, Namespace] = {}
    for ns_name, name in streams:
        try:
            ns = spaces.get(ns_name) or spaces.setdefault(ns_name, client.namespace(ns_name))
            view = ns.view(name)
            out[f"{ns_name}/{name}"] = (view, stream_extents(ns, name, view, read_lac))
        except (errors.NoSuchStreamError, errors.NoSuchNamespaceError):
            continue  # deleted since it was listed
    return out


def start_of(view: StreamView) -> tuple[int, int, int]:
    """The first position a reader may get: DLSN.INITIAL, or the truncation point."""
    tb = view.meta.truncated_before
    return max((1, 0, 0), tuple(tb)) if tb else (1, 0, 0)  # type: ignore[return-value]


# ---------------------------------------------------------------- executors: spans → Arrow batches


def segment_rows(stream: str, sequence: int, entries: Sequence[tuple[int, bytes]], first_txid: int) -> pa.Table:
    """Record sets (entry id, bytes) of one segment → rows in ROW_SCHEMA, in DLSN order: decoded into
    Arrow columns without a Python object per record (ledger_client/stream/chunks.py)."""
    import numpy as np

    from ledger_client.stream.chunks import Chunk
    from ledger_client.stream.dlsn import DLSN

    rb = Chunk(sequence, first_txid, list(entries), DLSN(sequence, 0, 0), f"stream {stream}").arrow()
    name = pa.array([stream], pa.string()).take(pa.array(np.zeros(rb.num_rows, dtype=np.int32)))
    return pa.Table.from_arrays([name, *rb.columns], schema=ROW_SCHEMA)


def span_mask(rows: pa.Table, span: StreamSpan) -> pa.Array | None:
    """Rows of ``rows`` (one segment) inside [lo, hi) with a wanted txid; None when all are."""
    masks = []
    eid, slot, txid = rows.column("entry_id"), rows.column("slot"), rows.column("txid")
    if span.sequence == span.lo[0] and span.lo[2] > 0:
        masks.append(pc.invert(pc.and_(pc.equal(eid, span.lo[1]), pc.less(slot, span.lo[2]))))
    if span.hi is not None and span.sequence == span.hi[0] and span.hi[2] > 0:
        masks.append(pc.invert(pc.and_(pc.equal(eid, span.hi[1]), pc.greater_equal(slot, span.hi[2]))))
    t = span.txid
    if t.lo > -(1 << 63):
        masks.append(pc.greater_equal(txid, t.lo))
    if t.hi < (1 << 63) - 1:
        masks.append(pc.less_equal(txid, t.hi))
    if t.values is not None:
        masks.append(pc.is_in(txid, value_set=pa.array(sorted(t.values), pa.int64())))
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = pc.and_(out, m)
    return out


def read_span(client: LedgerClient, span: StreamSpan, entries_per_read: int = ENTRIES_PER_READ) -> Iterator[pa.Table]:
    """The span's rows in DLSN order: from Delta if tiered, else range reads of its ledger."""
    from ledger_client.stream.tiered import read_tiered_arrow

    if span.tier is not None:
        chunks: Iterator[pa.Table] = iter([read_tiered_arrow(span.tier[0], span.tier[1], span.stream,
                                                             span.sequence, span.first, span.last)])
    else:
        chunks = _ledger_chunks(client, span, entries_per_read)
    for rows in chunks:
        mask = span_mask(rows, span)
        yield rows if mask is None else rows.filter(mask)


def _ledger_chunks(client: LedgerClient, span: StreamSpan, entries_per_read: int) -> Iterator[pa.Table]:
    from ledger_client import errors

    if span.ledger_id is None:
        raise errors.MetadataServiceError(f"segment {span.sequence} of {span.stream} has no ledger")
    try:
        h = client.open_ledger(span.ledger_id, span.password, recovery=False)
    except errors.NoSuchLedgerError:
        # Tiered (or truncated) since it was planned: its records are in Delta now (or gone for
        # every reader); the segment's metadata says which.
        moved = _moved(client, span)
        if moved is not None:
            yield from read_span(client, moved, entries_per_read)
        return
    if span.last > h.last_add_confirmed:
        h.read_last_add_confirmed()   # planned from a LAC this handle has not seen yet
    if span.last > h.last_add_confirmed:
        raise errors.ReadError(f"{span.stream} segment {span.sequence}: planned up to entry {span.last}, "
                               f"the bookies confirm only {h.last_add_confirmed}")
    for a in range(span.first, span.last + 1, entries_per_read):
        entries = h.read(a, min(span.last, a + entries_per_read - 1))
        yield segment_rows(span.stream, span.sequence, [(e.entry_id, e.data) for e in entries], span.first_txid)


def _moved(client: LedgerClient, span: StreamSpan) -> StreamSpan | None:
    """The span read from Delta if its segment is tiered now; None if the segment is gone (its
    records were truncated away: no reader returns them); NoSuchLedgerError otherwise."""
    from dataclasses import replace

    from ledger_client import errors
    from metadata.streams import SegmentState

    ns_name, name = span.stream.split("/", 1)
    view = client.namespace(ns_name).view_if_any(name)
    got = view.segments.get(span.sequence) if view is not None else None
    if got is None:
        log.warning("%s segment %d was deleted since it was planned: its records are gone", span.stream, span.sequence)
        return None
    seg = got[0]
    if seg.state is SegmentState.TIERED and seg.tier is not None:
        return replace(span, ledger_id=None, tier=(seg.tier.table, seg.tier.delta_version))
    raise errors.NoSuchLedgerError(f"{span.stream} segment {span.sequence}: ledger {span.ledger_id} is gone")


def read_stream_spans(opts: StreamSourceOptions, spans: Sequence[StreamSpan],
                      schema: StructType) -> Iterator[pa.RecordBatch]:
    """The task body, on the client this Python worker keeps for the cluster (jobs/connect.task_client)."""
    target = arrow_schema_of(schema)
    if not spans:
        return
    if all(s.tier is not None for s in spans):
        yield from _spans_rows(None, spans, opts, target)
        return
    with task_client(opts.zk, opts.client_conf) as client:
        yield from _spans_rows(client, spans, opts, target)


def _spans_rows(client: LedgerClient | None, spans: Sequence[StreamSpan], opts: StreamSourceOptions,
                target: pa.Schema) -> Iterator[pa.RecordBatch]:
    for span in spans:
        for rows in read_span(client, span):  # type: ignore[arg-type]
            for batch in rows.to_batches():
                yield to_target(batch, opts, target)


def to_target(batch: pa.RecordBatch, opts: StreamSourceOptions, target: pa.Schema) -> pa.RecordBatch:
    """Rows in the declared schema: payload as is, as UTF-8 text or parsed JSON (as for ledgers)."""
    payload = decode_payload(batch.column(5), opts.decode, target.field("payload").type)
    cols = [*batch.columns[:5], payload]
    return pa.RecordBatch.from_arrays(
        [c if c.type == f.type else c.cast(f.type) for c, f in zip(cols, target, strict=True)], schema=target)


# ---------------------------------------------------------------- the batch reader


class StreamBatchReader(DataSourceReader):
    """Batch reads of streams: partitions from metadata on the driver, ranges read on executors."""

    def __init__(self, opts: StreamSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.pushdown = StreamPushdown()

    def partitions(self) -> Sequence[InputPartition]:
        with connect(self.opts) as client:
            found = gather(client, resolve_streams(client, self.opts, strict=True))
        extents = [x for _, xs in found.values() for x in xs]
        ranges = {k: (start_of(v), tuple(stream_end(xs, v.meta.next_sequence))) for k, (v, xs) in found.items()}
        plans = plan_stream_spans(extents, ranges, self.pushdown,  # type: ignore[arg-type]
                                  self.opts.entries_per_partition, self.opts.min_partitions)
        log.info("ledger source: %d streams, %d segments in %d partitions", len(found), len(extents), len(plans))
        return [StreamPartition(p) for p in plans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        spans = partition.spans if isinstance(partition, StreamPartition) else ()
        return read_stream_spans(self.opts, spans, self.schema)


class StreamPushdownReader(StreamBatchReader):
    """StreamBatchReader that prunes streams and segments by filters on stream and txid."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.pushdown, rest = push_stream_filters(filters)
        return rest
