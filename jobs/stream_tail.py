"""``spark.readStream.format("ledger").option("streams", "payments/*")``: tail streams.

Offsets are ``{"ns/name": "segment/entry/slot"}``, the next position to read per stream (a stream
missing from an offset is read from its start). Each microbatch lists the streams the globs match
again, so a stream created later is picked up (from its first record), and reads per stream the
records from the previous end up to what is acknowledged now: the segment in progress up to its
LAC (opened without recovery: the query never fences the stream's writer), sealed segments
whole, tiered ones from Delta. A replayed microbatch (Spark checkpoints each one's start and end
before running it) reads exactly the same records, because records below a LAC never change and
tiering moves them without changing their DLSN (DESIGN §5, invariant 8); only a truncation can
remove some, and then no reader returns them.

``startingOffsets``: ``earliest`` (default), ``latest`` (each stream's end when the query
starts; streams created later from their start), or a JSON object of DLSNs per stream.
``rows``: ``records`` (default), or ``spans``: one row per planned span, for a sink that copies it
itself (jobs/stream_copy.py; the replicator). ``max_records_per_trigger`` caps a microbatch
(records counted from sealed segments' metadata, cut at an entry boundary:
jobs/stream_planning.cap_end). ``subscription``: each committed
microbatch moves that subscription of the streams it read (jobs/stream_subscription.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ledger_client.stream.dlsn import DLSN

from .options import StreamSourceOptions
from .stream_planning import (
    SegmentExtent,
    StreamPushdown,
    cap_end,
    offset_ctimes,
    offsets_from_json,
    offsets_to_json,
    plan_stream_spans,
    stream_end,
)
from .stream_source import StreamPartition, connect, gather, read_stream_spans, resolve_streams, start_of
from .stream_subscription import commit_subscription

if TYPE_CHECKING:
    from ledger_client import LedgerClient
    from metadata.streams import StreamView

log = logging.getLogger(__name__)

Found = dict[str, tuple["StreamView", list[SegmentExtent]]]

# With rows=spans, each task's share of a stream becomes a segment of the copy (jobs/stream_copy.py):
# a batch smaller than this is one task, not min_partitions (one task copies ~870,000 records/s).
SPLIT_MIN_RECORDS = 100_000


class StreamTailReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in PySpark's streaming worker on the driver (one client between microbatches, closed
    in ``stop``); the copy shipped to executors carries only options and schema."""

    def __init__(self, opts: StreamSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._client: LedgerClient | None = None
        self._target: dict[str, DLSN] | None = None   # Trigger.AvailableNow: stop here
        self._committed: dict[str, DLSN] = {}          # option subscription: the ends committed last
        self._ctimes: dict[str, int] = {}              # each stream's ctime_ms, as last found

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema, "_client": None, "_target": None, "_committed": {},
                "_ctimes": {}}

    def _connected(self) -> LedgerClient:
        if self._client is None:
            self._client = connect(self.opts)
        return self._client

    def _found(self) -> Found:
        client = self._connected()
        found = gather(client, resolve_streams(client, self.opts, strict=False))
        self._ctimes.update({k: v.meta.ctime_ms for k, (v, _xs) in found.items()})
        return found

    @staticmethod
    def _ctimes_of(found: Found, was: dict[str, int]) -> dict[str, int]:
        """Each stream's ctime_ms: as found now, else as an offset had it (``was``: a stream gone since)."""
        return {**was, **{k: v.meta.ctime_ms for k, (v, _xs) in found.items()}}

    def _same_streams(self, have: dict[str, DLSN], was: dict[str, int], found: Found) -> dict[str, DLSN]:
        """``have`` without the streams deleted and created again since it was written (``was``: their
        ctime_ms then): the new one is read from its start (its positions begin again)."""
        again = [k for k in have if k in was and k in found and found[k][0].meta.ctime_ms != was[k]]
        for k in again:
            log.warning("stream %s was deleted and created again: it is read from its start", k)
        return {k: v for k, v in have.items() if k not in again}

    @staticmethod
    def _ends(found: Found) -> dict[str, DLSN]:
        return {k: stream_end(xs, v.meta.next_sequence) for k, (v, xs) in found.items()}

    def initialOffset(self) -> dict[str, str]:
        if self.opts.starting_offsets == "latest":
            found = self._found()
            return offsets_to_json(self._ends(found), self._ctimes_of(found, {}))
        if self.opts.starting_offsets == "json":
            return offsets_to_json(dict(self.opts.starting_dlsns))
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger > 0:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        """Each stream's end now (never before its start), capped to the read limit's records in
        all, streams in name order. ``start`` is where the previous batch ended, and Spark asks
        only once that batch's output is committed: the subscription moves there (Spark's own
        commit(end) of a batch comes only when the next batch with data starts)."""
        found = self._found()
        was = offset_ctimes(start)
        have = self._same_streams(offsets_from_json(start), was, found)
        self._commit_subscription(have, was)
        ends = self._ends(found)
        if self._target is not None:
            ends = {k: min(e, self._target[k]) for k, e in ends.items() if k in self._target}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        out = dict(have)
        for k in sorted(ends):
            view, xs = found[k]
            lo = max(have.get(k, DLSN(*start_of(view))), DLSN(*start_of(view)))
            end = max(lo, ends[k])
            if budget is not None:
                end, used = cap_end(xs, lo, end, budget) if budget > 0 else (lo, 0)
                budget -= used
            if k in have or end > DLSN(*start_of(view)):
                out[k] = max(have.get(k, end), end)
        return offsets_to_json(out, self._ctimes_of(found, was))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends(self._found())

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        lo, hi = offsets_from_json(start), offsets_from_json(end)
        lo_ctime, hi_ctime = offset_ctimes(start), offset_ctimes(end)
        names = [tuple(k.split("/", 1)) for k in sorted(hi)]
        found = gather(self._connected(), names, read_lac=False)  # type: ignore[arg-type]
        ranges: dict[str, tuple[tuple[int, int, int], tuple[int, int, int] | None]] = {}
        for k, (view, _xs) in found.items():
            if hi_ctime.get(k, view.meta.ctime_ms) != view.meta.ctime_ms:
                continue   # the stream the batch read was deleted since: none of its records remain
            again = k in lo_ctime and k in hi_ctime and lo_ctime[k] != hi_ctime[k]
            first = max(DLSN.INITIAL if again else lo.get(k, DLSN.INITIAL), DLSN(*start_of(view)))
            if first < hi[k]:
                ranges[k] = (first, hi[k])
        extents = [x for k, (_v, xs) in found.items() if k in ranges for x in xs]
        plans = plan_stream_spans(extents, ranges, StreamPushdown(), self.opts.entries_per_partition,
                                  self.opts.min_partitions,
                                  SPLIT_MIN_RECORDS if self.opts.rows == "spans" else 0)
        return [StreamPartition(p) for p in plans]

    def commit(self, end: dict[str, str]) -> None:
        """The batch's output is committed: with option subscription, the subscription of each
        stream moves to where the batch ended (the checkpoint, not it, is where a restart begins)."""
        self._commit_subscription(offsets_from_json(end), offset_ctimes(end))

    def _commit_subscription(self, ends: dict[str, DLSN], ctimes: dict[str, int]) -> None:
        """Positions of a stream since created again (ctime_ms not the one last found) are left out."""
        ends = {k: e for k, e in ends.items() if ctimes.get(k, self._ctimes.get(k)) == self._ctimes.get(k)}
        if self.opts.subscription is not None and ends:
            commit_subscription(self._connected(), self.opts.subscription, ends, self._committed)

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        spans = partition.spans if isinstance(partition, StreamPartition) else ()
        if self.opts.rows == "spans":
            from .stream_copy import span_rows

            return iter([span_rows(list(spans))] if spans else [])
        return read_stream_spans(self.opts, spans, self.schema)
