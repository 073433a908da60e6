"""The ``ledger`` sink for rows that name their stream: a ``stream`` column ("ns/name") instead of
option ``stream``, as Kafka's sink takes a ``topic`` column. The replicator (§4.12) writes this way.

    df.writeStream.format("ledger").option("zk", Z).option("checkpointLocation", C).start()
        # df: stream, payload [, txid] [, segment, entry_id, slot]

Exactly once per stream, as the one-stream sink (jobs/stream_sink.py, invariant 10): a task writes
each stream's rows, in order, into a ledger of its own per stream; the driver's commit links each
stream's ledgers (in partition order) in one metadata change per stream that also records the
batch, so a batch replayed after a driver died between two streams' links adds nothing to those
linked and links the rest. With the source position columns, every ledger keeps the range of source
positions it copies and linking never takes a source record twice (jobs/options.FanoutOptions).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from jobs.connect import task_client
from jobs.options import FanoutOptions
from jobs.stream_sink import (
    SinkSteps,
    SinkStreamWriter,
    SinkWriter,
    arrow_columns,
    delete_unlinked,
    link_stream,
    streaming_batch,
)
from ledger_client.errors import IncorrectParameterError
from metadata.streams.linking import SparkBatch, TaskLedger

if TYPE_CHECKING:
    from ledger_client import LedgerClient, Namespace
    from ledger_client.stream.sink import TaskLedgerWriter


@dataclass(frozen=True)
class FanoutMessage(WriterCommitMessage):
    """One task's ledgers, one per stream it had rows for ("ns/name" -> TaskLedger)."""

    tasks: tuple[tuple[str, TaskLedger], ...]
    batch: SparkBatch


class _Namespaces:
    """The target's namespaces as a task or commit meets them, made from the source's when absent
    (the source cluster is reached only then)."""

    def __init__(self, client: LedgerClient, opts: FanoutOptions) -> None:
        self.client, self.opts = client, opts
        self._known: dict[str, Namespace] = {}

    def get(self, name: str) -> Namespace:
        from ledger_client import errors
        from ledger_client.stream.replica import replica_namespace

        ns = self._known.get(name)
        if ns is None:
            try:
                ns = self.client.namespace(name)
            except errors.NoSuchNamespaceError:
                if self.opts.source_zk is None:
                    raise
                with task_client(self.opts.source_zk, self.opts.source_client_conf) as source:
                    ns = replica_namespace(self.client, source, name)
            self._known[name] = ns
        return ns


def split_key(key: str) -> tuple[str, str]:
    ns, _, stream = key.partition("/")
    if not ns or not stream or "/" in stream:
        raise IncorrectParameterError(f"a row's stream must be NAMESPACE/STREAM, not {key!r}")
    return ns, stream


# ---------------------------------------------------------------- executors


def write_task(opts: FanoutOptions, batch: SparkBatch | None, batches: Iterator[pa.RecordBatch]) -> FanoutMessage:
    """The task body: each stream's rows, in order, into one new ledger per stream."""
    from pyspark import TaskContext

    from ledger_client.stream.sink import TaskLedgerWriter

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    if batch is None:
        batch = streaming_batch(ctx)
    with task_client(opts.zk, opts.client_conf) as client:
        spaces = _Namespaces(client, opts)
        writers: dict[str, TaskLedgerWriter] = {}

        def writer(key: str) -> TaskLedgerWriter:
            w = writers.get(key)
            if w is None:
                ns, stream = split_key(key)
                w = writers[key] = TaskLedgerWriter(spaces.get(ns), stream, batch, partition,
                                                    relative_txids=not opts.has_txid)
            return w

        try:
            for key, rows, source_ctime in _task_rows(opts, batches):
                _add(writer(key), rows, opts, source_ctime)
            done = tuple((key, t) for key, w in sorted(writers.items()) if (t := w.finish()) is not None)
            return FanoutMessage(done, batch)
        except BaseException:
            for w in writers.values():
                w.discard()
            raise


def _task_rows(opts: FanoutOptions,
               batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[str, pa.RecordBatch, int | None]]:
    """The task's records per stream, in order: its rows, or the records of its span rows read from
    the source cluster (jobs/stream_copy.py), with the source stream's ctime_ms when known."""
    if not opts.copies_spans:
        for rb in batches:
            for key, rows in _by_stream(rb):
                yield key, rows, None
        return
    from jobs.stream_copy import copied_records

    with task_client(opts.source_zk, opts.source_client_conf) as source:   # type: ignore[arg-type]
        for rb in batches:
            yield from copied_records(source, rb)


def _by_stream(rb: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows per stream, each stream's in their order (one slice when all are one's)."""
    col = rb.column(rb.schema.get_field_index("stream"))
    if col.null_count:
        raise IncorrectParameterError("a null stream: every row written this way names its stream")
    keys = pc.unique(col).to_pylist()
    if len(keys) == 1:
        yield keys[0], rb
        return
    for key in keys:
        yield key, rb.filter(pc.equal(col, key))


def _add(w: TaskLedgerWriter, rows: pa.RecordBatch, opts: FanoutOptions, source_ctime: int | None = None) -> None:
    if opts.copies_positions and len(rows):
        names = {n.lower(): i for i, n in enumerate(rows.schema.names)}
        seg, entry, slot = (rows.column(names[c]) for c in ("segment", "entry_id", "slot"))
        last = len(rows) - 1
        w.copying((seg[0].as_py(), entry[0].as_py(), slot[0].as_py()),
                  (seg[last].as_py(), entry[last].as_py(), slot[last].as_py()), source_ctime or None)
    w.add_arrow(*arrow_columns(rows, opts.has_txid))


# ---------------------------------------------------------------- driver


def commit_batch(opts: FanoutOptions, batch: SparkBatch, messages: Sequence[WriterCommitMessage | None],
                 sweep: bool) -> int:
    """Link each stream's ledgers once; the number of streams that took records."""
    msgs = [m for m in messages if isinstance(m, FanoutMessage)]
    foreign = [m.batch for m in msgs if m.batch != batch]
    if foreign:
        raise IncorrectParameterError(f"commit of {batch} got messages of other batches: {foreign[:3]}")
    per_stream: dict[str, list[TaskLedger]] = {}
    for m in msgs:
        for key, task in m.tasks:
            per_stream.setdefault(key, []).append(task)
    linked = 0
    with task_client(opts.zk, opts.client_conf) as client:
        spaces = _Namespaces(client, opts)
        for key, tasks in sorted(per_stream.items()):
            ns_name, stream = split_key(key)
            linked += link_stream(client, spaces.get(ns_name), stream, batch, tasks, opts, sweep,
                                  prune=opts.copies_positions)   # copies the replica held were left out
    return linked


def abort_batch(opts: FanoutOptions, messages: Sequence[WriterCommitMessage | None]) -> None:
    """The batch failed: every ledger its tasks reported goes (unless, somehow, it is linked)."""
    per_stream: dict[str, list[int]] = {}
    for m in messages:
        if isinstance(m, FanoutMessage):
            for key, task in m.tasks:
                per_stream.setdefault(key, []).append(task.ledger_id)
    if not per_stream:
        return
    with task_client(opts.zk, opts.client_conf) as client:
        for key, lids in per_stream.items():
            ns_name, stream = split_key(key)
            delete_unlinked(client, client.namespace(ns_name), stream, lids)


# ---------------------------------------------------------------- the Spark writers


def _checked_build(options: Mapping[str, str], schema: StructType, overwrite: bool) -> FanoutOptions:
    if overwrite:
        raise IncorrectParameterError("a stream is append-only: use mode('append'), not overwrite")
    opts = FanoutOptions.parse(options, schema)
    with task_client(opts.zk, opts.client_conf):
        pass   # the cluster is reachable (and its credentials good) before any task runs
    return opts


FANOUT = SinkSteps(_checked_build, write_task, commit_batch, abort_batch, FanoutMessage)


class FanoutWriter(SinkWriter):
    steps = FANOUT


class FanoutStreamWriter(SinkStreamWriter):
    steps = FANOUT
