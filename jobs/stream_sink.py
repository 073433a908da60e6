"""The ``ledger`` sink: Spark writes into a stream exactly once (DESIGN §4.6, invariant 10).

    df.write.format("ledger").option("zk", Z).option("stream", "ns/s").mode("append").save()
    df.writeStream.format("ledger").option("stream", "ns/s").option("checkpointLocation", C).start()

Input: a ``payload`` column (binary or string, UTF-8) and an optional ``txid`` column (integer,
non-decreasing in partition order and against the stream's last txid).

Two phases, as Spark's writer API intends: each task (``write`` on an executor) writes its rows, in
order, into a ledger of its own and returns its description; the driver's ``commit`` links every
task's ledger to the stream as a sealed segment in one metadata change that also records the batch
(``w:<write id>`` for a batch write, ``q:<query id>`` + the micro-batch id for a streaming query),
so a retried or replayed commit adds nothing (ledger_client/stream/sink.py,
metadata/streams/linking.py). A failed task deletes its ledger; ``abort`` deletes the batch's;
orphans of dead attempts and dead drivers are collected by later commits and by
``spark-bookie stream gc NS/S``.

The streaming query's id (stable across restarts from the checkpoint) reaches the tasks as
Spark's local property ``sql.streaming.queryId``; tasks put it in their commit message, so the
driver's commit knows which query's record to check without any option.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from jobs.connect import task_client
from jobs.options import SinkOptions
from ledger_client.errors import IncorrectParameterError
from metadata.streams.linking import SparkBatch, TaskLedger

if TYPE_CHECKING:
    from ledger_client import LedgerClient

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class SinkMessage(WriterCommitMessage):
    """One task's result: its ledger (None when it had no rows) and, for a streaming query, the
    query and micro-batch it wrote for."""

    task: TaskLedger | None
    batch: SparkBatch


# ---------------------------------------------------------------- executors


def write_task(opts: SinkOptions, batch: SparkBatch | None, batches: Iterator[pa.RecordBatch]) -> SinkMessage:
    """The task body: the partition's rows, in order, into one new ledger (or none if no rows)."""
    from pyspark import TaskContext

    from ledger_client.stream.sink import TaskLedgerWriter

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    if batch is None:  # streaming: the query and micro-batch come with the task
        batch = streaming_batch(ctx)
    with task_client(opts.zk, opts.client_conf) as client:
        ns = client.namespace(opts.namespace)
        w = TaskLedgerWriter(ns, opts.stream, batch, partition, relative_txids=not opts.has_txid)
        try:
            for rb in batches:
                w.add_arrow(*arrow_columns(rb, opts.has_txid))
            task = w.finish()
        except BaseException:
            w.discard()
            raise
        return SinkMessage(task, batch)


def streaming_batch(ctx: Any) -> SparkBatch:
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
    batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
    if not query or batch_id is None:
        raise IncorrectParameterError("the ledger stream sink runs only inside a streaming query "
                                      f"(no {QUERY_ID_PROPERTY} / {BATCH_ID_PROPERTY} on the task)")
    return SparkBatch.query(query, int(batch_id))


def arrow_columns(rb: pa.RecordBatch, has_txid: bool) -> tuple[pa.Array, Any]:
    """The batch's payload column (binary or string, as it comes) and its txids (an int64 numpy
    array, or None without a txid column), for TaskLedgerWriter.add_arrow."""
    names = {n.lower(): i for i, n in enumerate(rb.schema.names)}
    col = rb.column(names["payload"])
    if col.null_count:
        raise IncorrectParameterError("a null payload: every row written to a stream needs one")
    if not has_txid:
        return col, None
    txid = rb.column(names["txid"])
    if txid.null_count:
        raise IncorrectParameterError("a null txid: the txid column must be set on every row")
    return col, txid.cast(pa.int64()).to_numpy()


# ---------------------------------------------------------------- driver


def commit_batch(opts: SinkOptions, batch: SparkBatch, messages: Sequence[WriterCommitMessage | None],
                 sweep: bool) -> bool:
    """Link the tasks' ledgers (once); delete those of a replayed batch; collect orphans."""
    msgs = [m for m in messages if isinstance(m, SinkMessage)]
    foreign = [m.batch for m in msgs if m.batch != batch]
    if foreign:
        raise IncorrectParameterError(f"commit of {batch} got messages of other batches: {foreign[:3]}")
    tasks = [m.task for m in msgs if m.task is not None]
    with task_client(opts.zk, opts.client_conf) as client:
        return link_stream(client, client.namespace(opts.namespace), opts.stream, batch, tasks, opts, sweep)


def link_stream(client: LedgerClient, ns: Any, stream: str, batch: SparkBatch, tasks: list[TaskLedger], opts: Any,
                sweep: bool, prune: bool = False) -> bool:
    """One stream's part of a commit (both sinks): link the tasks' ledgers once; delete those that
    are not segments when the batch was linked before, or with ``prune`` (linking may have left
    some out: copies a replica held); collect orphans on a sweep or after a replay. Whether the
    batch was linked now."""
    from ledger_client.stream.sink import collect_orphans, link_task_ledgers, owner_name

    linked = bool(tasks) and link_task_ledgers(ns, stream, batch, tasks, opts.lock_timeout_ms,
                                               owner_name(f"{batch.key}#{batch.batch_id}"))
    if tasks and not linked:
        log.info("ledger sink: %s#%d was committed to %s/%s before: nothing added", batch.key, batch.batch_id,
                 ns.name, stream)
    if tasks and (prune or not linked):
        delete_unlinked(client, ns, stream, [t.ledger_id for t in tasks])
    if sweep or (tasks and not linked):
        collect_orphans(client, ns, stream, opts.orphan_grace_ms, batch)
    return linked


def abort_batch(opts: SinkOptions, messages: Sequence[WriterCommitMessage | None]) -> None:
    """The batch failed: every ledger its tasks reported goes (unless, somehow, it is linked)."""
    lids = [m.task.ledger_id for m in messages if isinstance(m, SinkMessage) and m.task is not None]
    if not lids:
        return
    with task_client(opts.zk, opts.client_conf) as client:
        delete_unlinked(client, client.namespace(opts.namespace), opts.stream, lids)


def delete_unlinked(client: LedgerClient, ns: Any, stream: str, lids: list[int]) -> None:
    """The task ledgers ``lids`` that are not segments go, and all their markers
    (ledger_client/stream/sink.py)."""
    from ledger_client.stream.sink import delete_unlinked as delete

    delete(client, ns, stream, lids)


def new_write_id() -> str:
    """Millisecond time first: the stream's record of batch writes is pruned oldest first by it."""
    return f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- the Spark writers


@dataclass(frozen=True)
class SinkSteps:
    """What a kind of ledger sink does at each of Spark's steps: this module's one-stream sink,
    jobs/stream_fanout.py's rows that name their stream. The writers below call them."""

    parse: Callable[[Mapping[str, str], StructType, bool], Any]   # options checked on the driver
    write: Callable[[Any, SparkBatch | None, Iterator[pa.RecordBatch]], WriterCommitMessage]
    commit: Callable[[Any, SparkBatch, Sequence[WriterCommitMessage | None], bool], object]
    abort: Callable[[Any, Sequence[WriterCommitMessage | None]], None]
    message: type[WriterCommitMessage]                              # its tasks' messages (with .batch)


class SinkWriter(DataSourceArrowWriter):
    """``df.write``: one batch, one write id (an option, or new per save())."""

    steps: ClassVar[SinkSteps]

    def __init__(self, opts: Any, write_id: str) -> None:
        self.opts = opts
        self.batch = SparkBatch.write(write_id)

    @classmethod
    def build(cls, options: Mapping[str, str], schema: StructType, overwrite: bool) -> SinkWriter:
        opts = cls.steps.parse(options, schema, overwrite)
        return cls(opts, opts.write_id or new_write_id())

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.steps.write(self.opts, self.batch, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        self.steps.commit(self.opts, self.batch, messages, True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        self.steps.abort(self.opts, messages)


class SinkStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: each micro-batch linked once, keyed by the query id and batch id."""

    steps: ClassVar[SinkSteps]

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    @classmethod
    def build(cls, options: Mapping[str, str], schema: StructType, overwrite: bool) -> SinkStreamWriter:
        return cls(cls.steps.parse(options, schema, overwrite))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.steps.write(self.opts, None, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]  # noqa: N803
        msgs = [m for m in messages if isinstance(m, self.steps.message)]
        if not msgs:
            return  # an empty micro-batch: nothing to link
        batch: SparkBatch = msgs[0].batch  # type: ignore[attr-defined]
        if batch.batch_id != batchId:
            raise IncorrectParameterError(f"commit of micro-batch {batchId} got messages of batch {batch.batch_id}")
        self.steps.commit(self.opts, batch, messages, batchId % self.opts.orphan_sweep_every_batches == 0)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]  # noqa: N803
        self.steps.abort(self.opts, messages)


def _checked_build(options: Mapping[str, str], schema: StructType, overwrite: bool) -> SinkOptions:
    """Options parsed and the namespace checked on the driver, so bad input fails before any task.
    A role without ``produce`` on the namespace is refused here: its tasks would create ledgers in
    the namespace that the bookies then refuse to fill and its client may not delete (orphans)."""
    if overwrite:
        raise IncorrectParameterError("a stream is append-only: use mode('append'), not overwrite")
    opts = SinkOptions.parse(options, schema)
    with task_client(opts.zk, opts.client_conf) as client:
        client.namespace(opts.namespace).require("produce")   # NoSuchNamespaceError, UnauthorizedAccessError now
    return opts


ONE_STREAM = SinkSteps(_checked_build, write_task, commit_batch, abort_batch, SinkMessage)


class StreamSinkWriter(SinkWriter):
    steps = ONE_STREAM


class StreamSinkStreamWriter(SinkStreamWriter):
    steps = ONE_STREAM
