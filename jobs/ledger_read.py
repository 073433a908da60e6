"""Batch reads of ledgers (DESIGN §4.4), and the parts the streaming reader shares with them.

Where things run: the reader is built and planned on the driver (in PySpark's planner worker),
from ZooKeeper metadata only; partitions are picklable lists of entry spans; each task opens its
own LedgerClient inside ``read()`` on the executor, reads its spans with
``ReadHandle.read_arrow`` and closes the client in a ``finally`` (Python workers are reused:
nothing may outlive the task). Batches are built to exactly the Arrow schema Spark derives from the
declared one (it rejects e.g. binary_view where binary was declared). Which entries and how many
tasks: jobs/ledger_planning.py; the DataSource that hands out these readers: jobs/ledger_source.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from .connect import TASK_TIMEOUTS
from .connect import connect as connect_cluster
from .decode import decode_payload
from .ledger_planning import LedgerExtent, Pushdown, Span, plan_spans, push_filters
from .options import SourceOptions
from .pyspark_compat import arrow_schema_of

if TYPE_CHECKING:
    from ledger_client import LedgerClient, ReadHandle

log = logging.getLogger(__name__)


class LedgerPartition(InputPartition):
    """One task's share: entry spans of one or more ledgers (picklable, planned on the driver)."""

    def __init__(self, spans: Sequence[Span]) -> None:
        super().__init__(tuple(spans))
        self.spans: tuple[Span, ...] = tuple(spans)

    def __repr__(self) -> str:
        return f"LedgerPartition({', '.join(f'{s.ledger_id}:{s.first}..{s.last}' for s in self.spans)})"


# ---------------------------------------------------------------- driver: metadata → extents


def ledger_extents(client: LedgerClient, opts: SourceOptions, pushdown: Pushdown,
                   include_open: bool) -> list[LedgerExtent]:
    """The ledgers a read covers and how far each is readable.

    Named ledgers (option `ledgers`) must exist and open with the password; an open one is read up
    to its current LAC, without recovery (a Spark read never fences a writer). Without `ledgers`,
    every ledger matching the metadata filters, closed ones only unless `include_open` (streams);
    ledgers with another password belong to someone else and are skipped.
    """
    from ledger_client import errors
    from ledger_client.protocol.framing import master_key
    from metadata import LedgerState

    named = opts.ledgers is not None
    ids = list(opts.ledgers) if opts.ledgers is not None else sorted(client.list_ledgers())
    key = master_key(opts.password)
    out: list[LedgerExtent] = []
    for lid in ids:
        if not pushdown.ledger.admits(lid):
            continue
        try:
            md = client.ledger_metadata(lid)
        except errors.NoSuchLedgerError:
            if named:
                raise
            continue  # deleted since it was listed
        if not opts.admits_metadata(md.custom_metadata):
            continue
        if md.password_hash != key:
            if named:
                raise errors.UnauthorizedAccessError(f"wrong password for ledger {lid} (option password)")
            continue
        starts = tuple(sorted(md.ensembles))
        if md.state is LedgerState.CLOSED:
            out.append(LedgerExtent(lid, md.last_entry_id, starts, True))
        elif named or include_open:
            h = client.open_ledger(lid, opts.password, recovery=False)
            out.append(LedgerExtent(lid, h.last_add_confirmed, tuple(sorted(h.metadata.ensembles)), False))
    return out


def connect(opts: SourceOptions) -> LedgerClient:
    return connect_cluster(opts.zk, opts.client_conf, **TASK_TIMEOUTS)


# ---------------------------------------------------------------- executors: spans → Arrow batches


def read_spans(opts: SourceOptions, spans: Sequence[Span], schema: StructType) -> Iterator[pa.RecordBatch]:
    """The task body: one client for the task, spans read in batches of opts.batch_entries rows."""
    target = arrow_schema_of(schema)
    if not spans:
        return
    client = connect(opts)
    try:
        for span in spans:
            h = _open_for(client, opts, span)
            for batch in _prefetched(h, span, opts.batch_entries):
                yield decode_batch(batch, opts, target)
    finally:
        client.close()


def _prefetched(h: ReadHandle, span: Span, n: int) -> Iterator[pa.RecordBatch]:
    """read_arrow of span in windows of n, the next window read while Spark consumes this one
    (the bookies' reads and the hand-off to the JVM overlap instead of taking turns)."""
    windows = [(a, min(span.last, a + n - 1)) for a in range(span.first, span.last + 1, n)]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-prefetch") as pool:
        nxt = pool.submit(h.read_arrow, *windows[0])
        for i in range(len(windows)):
            batch = nxt.result()
            if i + 1 < len(windows):
                nxt = pool.submit(h.read_arrow, *windows[i + 1])
            yield batch


def _open_for(client: LedgerClient, opts: SourceOptions, span: Span) -> ReadHandle:
    from ledger_client import errors

    h = client.open_ledger(span.ledger_id, opts.password, recovery=False)
    if span.last > h.last_add_confirmed:
        h.read_last_add_confirmed()  # planned from a LAC this handle has not seen yet
    if span.last > h.last_add_confirmed:
        raise errors.ReadError(f"ledger {span.ledger_id}: planned up to entry {span.last} but the bookies now "
                               f"confirm only {h.last_add_confirmed} (entries lost?)")
    return h


def decode_batch(batch: pa.RecordBatch, opts: SourceOptions, target: pa.Schema) -> pa.RecordBatch:
    """read_arrow's batch in the declared schema: payload as is, as UTF-8 text or parsed JSON."""
    want = target.field("payload").type
    payload = decode_payload(batch.column(2), opts.decode, want)
    if payload.type != want:
        payload = payload.cast(want)
    cols = [batch.column(0), batch.column(1), payload]
    return pa.RecordBatch.from_arrays(
        [c if c.type == f.type else c.cast(f.type) for c, f in zip(cols, target, strict=True)], schema=target)


# ---------------------------------------------------------------- the batch readers


class LedgerReader(DataSourceReader):
    """Batch reads: partitions from metadata on the driver, read_arrow on the executors."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.pushdown = Pushdown()

    def partitions(self) -> Sequence[InputPartition]:
        with connect(self.opts) as client:
            extents = ledger_extents(client, self.opts, self.pushdown, include_open=False)
        plans = plan_spans(extents, self.pushdown, self.opts.entries_per_partition, self.opts.min_partitions)
        log.info("ledger source: %d ledgers in %d partitions", len(extents), len(plans))
        return [LedgerPartition(p) for p in plans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        spans = partition.spans if isinstance(partition, LedgerPartition) else ()
        return read_spans(self.opts, spans, self.schema)


class LedgerPushdownReader(LedgerReader):
    """LedgerReader that prunes ledgers and entry ranges by filters on ledger_id and entry_id."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        self.pushdown, rest = push_filters(filters)
        return rest
