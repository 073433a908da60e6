"""Pure transitions of a Spark write into a stream (DESIGN §4.6, invariant 10): the ledgers that
a batch's tasks wrote become sealed segments of the stream, in one change that also records the
batch, so a replayed or retried batch adds nothing.

Why one change: the stream node carries ``spark_batches`` (a query or write key -> the last batch
id committed under it), and the store applies the stream node's CAS and the segments' creates as
one multi-op; either the batch is linked and recorded, or neither. A second commit of the same
batch reads the record and decides "nothing to do" (:func:`already_linked`).

Txids (invariant 8 wants every record's txid fixed once it is readable): a task that got a
``txid`` column wrote those txids into its record sets, and linking only checks that they follow
the stream's last txid; a task without one wrote *segment-relative* txids (0, 1, ... flagged in
the record-set header), and linking gives its segment ``first_txid`` = the stream's last txid + 1,
so readers compute txid = first_txid + offset. Tasks never need to know what the stream holds.

Keys: ``q:<query id>`` for a streaming query (its micro-batch ids grow by one per batch), and
``w:<write id>`` for a batch write (batch 0). Batch-write keys are pruned to the newest
``BATCH_WRITES_KEPT`` (write ids start with a millisecond timestamp, so key order is age order):
the stream node stays small, and a batch write's commit is only ever replayed within its job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from metadata.errors import InvalidMetadataError
from metadata.streams.model import Position, SegmentMeta, SegmentState, StreamMeta
from metadata.streams.transitions import Change, StreamView

BATCH_WRITES_KEPT = 1_000
QUERY_PREFIX = "q:"
WRITE_PREFIX = "w:"
KEY_CHARS_MAX = 200


class TxidOrderError(InvalidMetadataError):
    """A batch's txids go below the stream's last txid (or below those of an earlier task)."""


@dataclass(frozen=True)
class SparkBatch:
    """The identity of one Spark write: a key (``q:<query id>`` / ``w:<write id>``) and a batch id."""

    key: str
    batch_id: int

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.startswith((QUERY_PREFIX, WRITE_PREFIX)) \
                or len(self.key) <= 2 or len(self.key) > KEY_CHARS_MAX or "/" in self.key:
            raise InvalidMetadataError(f"bad Spark batch key {self.key!r}: want q:<query id> or w:<write id>")
        if not isinstance(self.batch_id, int) or isinstance(self.batch_id, bool) or self.batch_id < 0:
            raise InvalidMetadataError(f"bad Spark batch id {self.batch_id!r}: want an int >= 0")

    @classmethod
    def query(cls, query_id: str, batch_id: int) -> SparkBatch:
        return cls(QUERY_PREFIX + query_id, batch_id)

    @classmethod
    def write(cls, write_id: str) -> SparkBatch:
        return cls(WRITE_PREFIX + write_id, 0)


@dataclass(frozen=True)
class TaskLedger:
    """What one task wrote: a closed ledger of record sets, its end, and its txids (None: the
    record sets carry segment-relative txids and linking assigns them)."""

    partition: int
    ledger_id: int
    record_count: int
    last_entry_id: int
    last_slot: int
    nbytes: int
    first_txid: int | None = None
    last_txid: int | None = None
    source: tuple[Position, Position] | None = None   # a replica's: the source positions it copies
    source_ctime_ms: int | None = None   # a replica's: the ctime_ms of the source stream it copies

    def check(self) -> None:
        where = f"task ledger {self.ledger_id} (partition {self.partition})"
        if self.record_count < 1 or self.last_entry_id < 0 or self.last_slot < 0 or self.nbytes < 0:
            raise InvalidMetadataError(f"{where}: {self.record_count} records up to entry {self.last_entry_id} "
                                       f"slot {self.last_slot}: not a non-empty ledger")
        if (self.first_txid is None) != (self.last_txid is None):
            raise InvalidMetadataError(f"{where}: first and last txid must both be given or both be None")
        if self.first_txid is not None and self.last_txid is not None and self.last_txid < self.first_txid:
            raise TxidOrderError(f"{where}: last txid {self.last_txid} is below its first {self.first_txid}")
        if self.source is not None and not self.source[0] <= self.source[1]:
            raise InvalidMetadataError(f"{where}: source range {self.source} runs backwards")


def already_linked(meta: StreamMeta, batch: SparkBatch) -> bool:
    """Whether this batch (or a later one of the same query) was committed already."""
    return meta.spark_batches.get(batch.key, -1) >= batch.batch_id


def link_batch(view: StreamView, batch: SparkBatch, tasks: Sequence[TaskLedger], now_ms: int) -> Change | None:
    """The change that appends ``tasks``' ledgers (in partition order) as sealed segments and
    records ``batch``; None when the batch was committed before (a replay adds nothing)."""
    meta = view.meta
    if already_linked(meta, batch):
        return None
    if meta.end_of_stream:
        raise InvalidMetadataError("the stream has ended")
    if view.in_progress is not None:
        raise InvalidMetadataError(f"segment {view.in_progress.sequence} is in progress: recover it before linking")
    source_ctime = _source_ctime(view, tasks)
    ordered = _new_copies(view, _checked(view, tasks))
    seq, last_txid = meta.next_sequence, meta.max_txid
    created: list[SegmentMeta] = []
    for t in ordered:
        if t.first_txid is None:
            first, last = last_txid + 1, last_txid + t.record_count
        else:
            first, last = t.first_txid, t.last_txid if t.last_txid is not None else t.first_txid
            if first < last_txid:
                raise TxidOrderError(f"partition {t.partition}: txid {first} is below the stream's last txid "
                                     f"{last_txid}")
        created.append(SegmentMeta(seq, t.ledger_id, SegmentState.SEALED, first, last_txid=last,
                                   last_entry_id=t.last_entry_id, last_slot=t.last_slot,
                                   record_count=t.record_count, bytes=t.nbytes, ctime_ms=now_ms, sealed_ms=now_ms,
                                   source=t.source))
        seq, last_txid = seq + 1, last
    new_meta = replace(meta, next_sequence=seq, max_txid=last_txid,
                       spark_batches=_recorded(meta.spark_batches, batch),
                       source_ctime_ms=meta.source_ctime_ms if source_ctime is None else source_ctime)
    return Change(new_meta, create=tuple(created))


def _source_ctime(view: StreamView, tasks: Sequence[TaskLedger]) -> int | None:
    """The source stream the tasks copy (its ctime_ms; None: not said), refused when the replica
    copies another: a source stream deleted and created again under its name starts its positions
    again, and its copies would pass for the old one's continuation or be left out as held."""
    said = {t.source_ctime_ms for t in tasks if t.source_ctime_ms is not None}
    if len(said) > 1:
        raise InvalidMetadataError(f"one batch copies source streams created at {sorted(said)}: a stream's tasks "
                                   "copy one source stream")
    ctime = next(iter(said), None)
    held = view.meta.source_ctime_ms
    if ctime is not None and held is not None and ctime != held:
        raise InvalidMetadataError(
            f"its source stream was created again (at {ctime} ms; the replica copies the one created at {held} "
            "ms): delete the replica stream to copy the new source stream into a new one")
    return ctime


def _checked(view: StreamView, tasks: Sequence[TaskLedger]) -> list[TaskLedger]:
    ordered = sorted(tasks, key=lambda t: t.partition)
    partitions = [t.partition for t in ordered]
    if len(set(partitions)) != len(partitions):
        raise InvalidMetadataError(f"two ledgers for one partition: {partitions}")
    ledgers = [t.ledger_id for t in ordered]
    linked = {s.ledger_id for s in view.ordered()}
    if len(set(ledgers)) != len(ledgers) or linked & set(ledgers):
        raise InvalidMetadataError(f"ledgers {sorted(set(ledgers))} repeat or are already segments of the stream")
    for t in ordered:
        t.check()
    return ordered


def replicated_through(view: StreamView) -> Position | None:
    """A replica's last source position linked so far (None: it copies nothing yet)."""
    ends = [s.source[1] for s in view.ordered() if s.source is not None]
    return max(ends) if ends else None


def _new_copies(view: StreamView, ordered: list[TaskLedger]) -> list[TaskLedger]:
    """A replica is a prefix of its source (invariant 13): a task copying source records the
    stream already holds is left out (a replicator restarted without its checkpoint, a second
    one on the same target); one that overlaps them only in part is refused."""
    through = replicated_through(view)
    kept: list[TaskLedger] = []
    for t in ordered:
        if t.source is None:
            kept.append(t)
            continue
        if through is not None and t.source[1] <= through:
            continue
        if through is not None and t.source[0] <= through:
            raise InvalidMetadataError(f"task ledger {t.ledger_id} copies source records {t.source} of which the "
                                       f"stream holds those up to {through}: a replica cannot take part of them twice")
        kept.append(t)
        through = t.source[1]
    return kept


def _recorded(batches: dict[str, int], batch: SparkBatch) -> dict[str, int]:
    out = {**batches, batch.key: batch.batch_id}
    writes = sorted(k for k in out if k.startswith(WRITE_PREFIX))
    for k in writes[:max(0, len(writes) - BATCH_WRITES_KEPT)]:
        del out[k]
    return out


def linked_ledgers(view: StreamView) -> set[int]:
    """Every ledger that is a segment of the stream (what orphan collection must never delete)."""
    return {s.ledger_id for s in view.ordered() if s.ledger_id is not None}


def replica_cut(view: StreamView, source_before: Position) -> tuple[Position, SegmentMeta | None]:
    """Where a replica is truncated when its source is truncated before ``source_before``: the
    start of the first segment that copies a record at or after it, when that is exact; or that
    segment's start and the segment itself when it copies records on both sides (the caller
    counts within it). Never past a segment that is not a copy (nor past the replica's end)."""
    for seg in view.ordered():
        if seg.source is None or seg.source[0] >= source_before:
            return seg.first_dlsn, None
        if seg.source[1] >= source_before:
            return seg.first_dlsn, seg
    return (view.meta.next_sequence, 0, 0), None
