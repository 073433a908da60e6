"""``spark.readStream.format("ledger")``: tail ledgers as they are written.

Offsets are ``{"<ledger id>": next entry id}``: a microbatch reads, per ledger, the entries from
the previous end up to what is confirmed now (an open ledger's LAC, a closed ledger's last
entry). Each microbatch also looks for ledgers that appeared since (same `ledgers` and metadata
filters as batch reads), so a writer that rolls to a new ledger is followed. Exactly-once comes
from Spark: it checkpoints each microbatch's (start, end) before running it, and a replayed
microbatch reads exactly the same entries, because entries below the LAC never change
(DESIGN §5, invariants 2 and 4). Open ledgers are read without recovery: the stream never fences
a writer. ``commit`` has nothing to release.

The reader object lives in PySpark's long-running streaming worker on the driver and keeps one
LedgerClient and a handle per open ledger between microbatches (closed in ``stop``); the copy
shipped to executors carries only options and schema.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .ledger_planning import advance_offsets, offsets_from_json, offsets_to_json, stream_spans
from .ledger_read import LedgerPartition, connect, read_spans
from .options import SourceOptions

if TYPE_CHECKING:
    from ledger_client import LedgerClient, ReadHandle

log = logging.getLogger(__name__)


class LedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._client: LedgerClient | None = None
        self._open: dict[int, ReadHandle] = {}     # ledgers still being written
        self._closed_end: dict[int, int] = {}      # closed ledgers: next id after the last entry
        self._ignored: set[int] = set()            # other filters' or passwords' ledgers
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow: stop here

    def __getstate__(self) -> dict[str, Any]:
        """Executors get options and schema only (no client, no handles)."""
        return {"opts": self.opts, "schema": self.schema, "_client": None, "_open": {}, "_closed_end": {},
                "_ignored": set(), "_target": None}

    # ---------------------------------------------------------------- driver side

    def _connected(self) -> LedgerClient:
        if self._client is None:
            self._client = connect(self.opts)
        return self._client

    def _discover(self, client: LedgerClient, lid: int) -> None:
        """First sight of a ledger: ignore it, remember it closed, or keep a handle to follow it."""
        from ledger_client import errors
        from ledger_client.protocol.framing import master_key
        from metadata import LedgerState

        try:
            md = client.ledger_metadata(lid)
        except errors.NoSuchLedgerError:
            return
        if not self.opts.admits_metadata(md.custom_metadata) or md.password_hash != master_key(self.opts.password):
            self._ignored.add(lid)
        elif md.state is LedgerState.CLOSED:
            self._closed_end[lid] = md.last_entry_id + 1
        else:
            self._open[lid] = client.open_ledger(lid, self.opts.password, recovery=False)

    def _follow(self, lid: int, h: ReadHandle) -> int:
        """The next id after what an open ledger has confirmed now (moves it to closed when it is)."""
        md = h.refresh_metadata()
        if h.is_closed:
            del self._open[lid]
            self._closed_end[lid] = md.last_entry_id + 1
            return self._closed_end[lid]
        return h.read_last_add_confirmed() + 1

    def current_ends(self) -> dict[int, int]:
        """Every followed ledger → the next entry id after what is readable now."""
        from ledger_client import errors

        client = self._connected()
        ids = self.opts.ledgers if self.opts.ledgers is not None else sorted(client.list_ledgers())
        for lid in ids:
            if lid not in self._ignored and lid not in self._closed_end and lid not in self._open:
                self._discover(client, lid)
        ends = dict(self._closed_end)
        for lid, h in list(self._open.items()):
            try:
                ends[lid] = self._follow(lid, h)
            except errors.NoSuchLedgerError:
                del self._open[lid]  # deleted while followed: what was read stays read
            except errors.LedgerError as e:
                log.warning("ledger %d: LAC unavailable this microbatch (%s)", lid, e)
                ends[lid] = h.last_add_confirmed + 1
        return ends

    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting_offsets == "latest":
            return offsets_to_json(self.current_ends())
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_entries_per_trigger > 0:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self.current_ends()
        if self._target is not None:
            ends = {lid: min(e, self._target[lid]) for lid, e in ends.items() if lid in self._target}
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        return offsets_to_json(advance_offsets(offsets_from_json(start), ends, cap))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.current_ends()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        plans = stream_spans(offsets_from_json(start), offsets_from_json(end), self.opts.entries_per_partition)
        return [LedgerPartition(p) for p in plans]

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: ledgers are retained by their owners, not by this reader."""

    def stop(self) -> None:
        client, self._client = self._client, None
        self._open.clear()
        if client is not None:
            client.close()

    # ---------------------------------------------------------------- executors

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        spans = partition.spans if isinstance(partition, LedgerPartition) else ()
        return read_spans(self.opts, spans, self.schema)
