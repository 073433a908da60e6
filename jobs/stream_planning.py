"""Reads of streams, their pure parts: filter pushdown, partition planning from segments,
streaming offsets ``{"ns/name": "segment/entry/slot"}`` (options and stream globs: jobs/options.py).

No I/O here: jobs/stream_source.py reads the streams' metadata (and the LAC of a segment in
progress) on the driver and hands it to these functions as ``SegmentExtent`` values, so which
records a read covers (and how they are cut into tasks) is unit-tested without Spark or bookies.

A read covers, per stream, the records with ``lo <= DLSN < hi``: ``lo`` is the stream's start
(its truncation point, or a streaming offset), ``hi`` the end of what is acknowledged when
planned (a sealed segment's last entry, the segment in progress up to its LAC). Every planned
piece is an entry range of one segment; a piece of a tiered segment is read from its Delta table
with the same entry range, so both kinds plan, cut and filter alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import EqualTo, Filter, In

from jobs.ledger_planning import IdRange, filter_column
from ledger_client.errors import IncorrectParameterError
from ledger_client.stream.dlsn import DLSN

TXID_MIN = -(1 << 63)

Position = tuple[int, int, int]


# ---------------------------------------------------------------- pushdown


@dataclass(frozen=True)
class StreamPushdown:
    """The AND of the filters the source applies itself: on ``stream`` (= / IN) and ``txid``."""

    streams: frozenset[str] | None = None
    txid: IdRange = field(default_factory=lambda: IdRange(lo=TXID_MIN))

    def admits_stream(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def may_hold(self, first_txid: int, last_txid: int | None) -> bool:
        """Whether a segment with txids first..last (last None: still growing) may hold a wanted txid."""
        hi = last_txid if last_txid is not None else (1 << 63) - 1
        a, b = max(first_txid, self.txid.lo), min(hi, self.txid.hi)
        if a > b:
            return False
        return self.txid.values is None or any(a <= v <= b for v in self.txid.values)


def push_stream_filters(filters: Iterable[Filter]) -> tuple[StreamPushdown, list[Filter]]:
    """(what the source applies exactly, the filters left for Spark)."""
    pd = StreamPushdown()
    rest: list[Filter] = []
    for f in filters:
        name = filter_column(f)
        if name == "txid":
            narrowed = pd.txid.narrowed(f)
            if narrowed is not None:
                pd = replace(pd, txid=narrowed)
                continue
        elif name == "stream":
            vals = (f.value,) if isinstance(f, EqualTo) else tuple(f.value) if isinstance(f, In) else None
            if vals is not None and all(isinstance(v, str) for v in vals):
                s = frozenset(vals)  # type: ignore[arg-type]
                pd = replace(pd, streams=s if pd.streams is None else pd.streams & s)
                continue
        rest.append(f)
    return pd, rest


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class SegmentExtent:
    """What planning needs of one segment, read on the driver."""

    stream: str                    # "ns/name"
    sequence: int
    ledger_id: int | None
    last_entry_id: int             # sealed or tiered: its last entry; in progress: the LAC; -1: none
    first_txid: int
    last_txid: int | None          # None while in progress
    records: int | None            # None while in progress
    tier: tuple[str, int] | None = None    # (Delta table, version) of a tiered segment
    password: bytes = b""
    stream_ctime_ms: int = 0               # which stream of this name (one deleted and created again differs)


@dataclass(frozen=True)
class StreamSpan:
    """Entries first..last of one segment, of which the records with lo <= DLSN < hi (hi None:
    no bound) and a wanted txid are returned. Read from the ledger, or from Delta if ``tier``."""

    stream: str
    sequence: int
    ledger_id: int | None
    first: int
    last: int
    lo: Position
    hi: Position | None = None
    tier: tuple[str, int] | None = None
    password: bytes = b""
    txid: IdRange = field(default_factory=lambda: IdRange(lo=TXID_MIN))
    first_txid: int = 0            # the segment's (record sets may store txids relative to it)
    stream_ctime_ms: int = 0       # the stream's (SegmentExtent.stream_ctime_ms)

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


def entry_range(x: SegmentExtent, lo: Position, hi: Position | None) -> tuple[int, int] | None:
    """The entries of segment ``x`` that may hold a record in [lo, hi); None when there are none."""
    if x.sequence < lo[0] or (hi is not None and (x.sequence > hi[0] or (x.sequence, 0, 0) >= hi)):
        return None
    first = lo[1] if x.sequence == lo[0] else 0
    last = x.last_entry_id
    if hi is not None and x.sequence == hi[0]:
        last = min(last, hi[1] if hi[2] > 0 else hi[1] - 1)
    return (first, last) if first <= last else None


def plan_stream_spans(extents: Iterable[SegmentExtent], ranges: Mapping[str, tuple[Position, Position | None]],
                      pushdown: StreamPushdown, entries_per_partition: int,
                      min_partitions: int = 1, split_min_records: int = 0) -> list[tuple[StreamSpan, ...]]:
    """Partitions (tuples of spans of at most entries_per_partition entries in all), in DLSN order
    per stream. Segments of streams not in ``ranges`` are not read. A plan of fewer than
    ``split_min_records`` records (sealed segments counted from their metadata, a segment in progress
    as one record per entry) is not cut up to reach ``min_partitions``: for a sink that makes a
    segment of each task's share (the replicator), a small batch then adds one segment per stream."""
    wanted: list[StreamSpan] = []
    records = 0
    for x in sorted(extents, key=lambda x: (x.stream, x.sequence)):
        if x.stream not in ranges or not pushdown.admits_stream(x.stream):
            continue
        if not pushdown.may_hold(x.first_txid, x.last_txid if x.records is not None else None):
            continue
        lo, hi = ranges[x.stream]
        got = entry_range(x, lo, hi)
        if got is not None:
            wanted.append(StreamSpan(x.stream, x.sequence, x.ledger_id, got[0], got[1], lo, hi, x.tier,
                                     x.password, pushdown.txid, x.first_txid, x.stream_ctime_ms))
            span_entries = got[1] - got[0] + 1
            records += span_entries if x.records is None else -(-x.records * span_entries // (x.last_entry_id + 1))
    total = sum(s.entries for s in wanted)
    parts_min = min_partitions if records >= split_min_records else 1
    size = max(1, min(entries_per_partition, -(-total // max(1, parts_min))))
    parts: list[tuple[StreamSpan, ...]] = []
    current: list[StreamSpan] = []
    filled = 0
    for span in wanted:
        for a in range(span.first, span.last + 1, size):
            piece = replace(span, first=a, last=min(span.last, a + size - 1))
            if filled + piece.entries > size and current:
                parts.append(tuple(current))
                current, filled = [], 0
            current.append(piece)
            filled += piece.entries
    if current:
        parts.append(tuple(current))
    return parts


def stream_end(extents: Sequence[SegmentExtent], next_sequence: int) -> DLSN:
    """The position just after the last acknowledged record of one stream (its extents, in order):
    inside the segment in progress after its LAC, else the start of the next segment to come."""
    last = max(extents, key=lambda x: x.sequence, default=None)
    if last is not None and last.records is None:
        return DLSN(last.sequence, last.last_entry_id + 1, 0)
    return DLSN(max(next_sequence, 1), 0, 0)


# ---------------------------------------------------------------- streaming offsets


def offsets_to_json(positions: Mapping[str, Position], ctimes: Mapping[str, int] | None = None) -> dict[str, str]:
    """Offsets as Spark stores them: {"ns/name": "segment/entry/slot"}, the next record to read,
    with "@<ctime_ms>" of the stream when ``ctimes`` knows it: a stream deleted and created again
    under its name starts its positions again, and its reader must know it is another stream."""
    ctimes = ctimes or {}
    return {k: str(DLSN(*v)) + (f"@{ctimes[k]}" if ctimes.get(k) else "") for k, v in sorted(positions.items())}


def _offset_parts(offset: Mapping[str, object] | None) -> Iterator[tuple[str, DLSN, int | None]]:
    for k, v in (offset or {}).items():
        if not isinstance(v, str) or "/" not in str(k):
            raise IncorrectParameterError(f"bad stream offset {k!r}: {v!r} (want 'ns/name': 'seg/entry/slot')")
        pos, _, ctime = v.partition("@")
        if ctime and not ctime.isdigit():
            raise IncorrectParameterError(f"bad stream offset {k!r}: {v!r} (want 'seg/entry/slot@ctime_ms')")
        yield str(k), DLSN.parse(pos), int(ctime) if ctime else None


def offsets_from_json(offset: Mapping[str, object] | None) -> dict[str, DLSN]:
    return {k: pos for k, pos, _c in _offset_parts(offset)}


def offset_ctimes(offset: Mapping[str, object] | None) -> dict[str, int]:
    """The ctime_ms of each stream an offset names it with (offsets written before it: none)."""
    return {k: c for k, _p, c in _offset_parts(offset) if c is not None}


def cap_end(extents: Sequence[SegmentExtent], lo: Position, hi: Position, budget: int) -> tuple[DLSN, int]:
    """Where a microbatch of at most ~``budget`` records from ``lo`` ends (before ``hi``), and how
    many records it is counted as. Sealed segments count their known records; a cut inside a
    segment is at an entry boundary estimated from its records per entry (one per entry while a
    segment is in progress), and always moves by at least one entry so a stream never stalls."""
    used = 0
    end = DLSN(*lo)
    for x in sorted(extents, key=lambda x: x.sequence):
        got = entry_range(x, lo, hi)
        if got is None:
            continue
        first, last = got
        per_entry = (x.records / (x.last_entry_id + 1)) if x.records and x.last_entry_id >= 0 else 1.0
        n_entries = last - first + 1
        cost = max(1, round(n_entries * per_entry))
        if used + cost <= budget:
            used += cost
            end = DLSN(x.sequence, last + 1, 0) if x.records is None or last < x.last_entry_id \
                else DLSN(x.sequence + 1, 0, 0)
            continue
        take = max(1 if used == 0 else 0, int((budget - used) / per_entry))
        if take:
            end = DLSN(x.sequence, first + min(take, n_entries), 0)
            used += max(1, round(take * per_entry))
        return min(end, DLSN(*hi)), used
    return DLSN(*hi), used

