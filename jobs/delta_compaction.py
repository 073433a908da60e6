"""Compaction of closed ledgers into a Delta table (delta-rs), incremental and idempotent.

A ledger is immutable once closed, so compaction copies each closed ledger into the table exactly
once. The record of "this ledger is in the table" is a Delta **application transaction** (the
protocol's ``txn`` action, app id ``spark-bookie/ledger/<id>``) committed in the *same* atomic
commit as the ledger's data files. Why that and not, say, the partition values: the log entry is
the only thing that makes files visible, so a run that crashes after writing parquet but before
the commit leaves files that no snapshot references (invisible to every Delta reader) and no
``txn`` either; the next run sees the ledger as not compacted and writes it again. It also works
for empty ledgers (no rows, still "done") and for ``--partition-by date``, and it survives log
clean-up (a snapshot keeps the latest ``txn`` per app id). Two runs racing on the same ledger: the
second commit fails with delta-rs's "concurrent transaction" conflict (measured with 1.6.6), its
files stay orphaned and nothing is duplicated.

Writing is two-phase: phase one writes parquet files (one or more per ledger, hive-style
``<partition>=<value>/part-<uuid>.parquet`` under the table) and returns their add actions; phase
two, on the driver, commits every add action plus the ``txn`` records as ONE Delta transaction
(``DeltaTable.create_write_transaction``). Phase one runs in the driver (``spark=None``: small
runs, the notebook) or in Spark executors (one task per group of ledgers, balanced by entry
count); a failed or retried task's files are never in the log. Orphans can be removed later with
``DeltaTable(path).vacuum(full=True, ...)``.

Table columns: ``ledger_id`` int64, ``entry_id`` int64, ``payload`` binary, ``ctime_date`` date
(UTC day of the ledger's creation time); partitioned by ``ledger_id`` (default) or ``ctime_date``.
Partition columns live in the paths and the log, not in the data files (Delta's rule).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.connect import connect
from jobs.errors import BadArgumentError, ConcurrentCompactionError, TableMismatchError
from ledger_client.protocol.checks import invariant

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from ledger_client import LedgerClient
    from metadata import LedgerMetadata

log = logging.getLogger(__name__)

PartitionBy = Literal["ledger_id", "date"]
PARTITION_COLUMN: dict[str, str] = {"ledger_id": "ledger_id", "date": "ctime_date"}
APP_ID_PREFIX = "spark-bookie/ledger/"
TXN_VERSION = 1   # a closed ledger never changes: one version per app id ("committed once")

TABLE_SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary()),
                          ("ctime_date", pa.date32())])
"""Every column of the table, in order (what a reader gets back)."""


# ---------------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class CompactionConfig:
    """One compaction run. ``ledgers=None`` means every closed ledger in the cluster."""

    zk: str
    table_path: str
    ledgers: tuple[int, ...] | None = None
    partition_by: PartitionBy = "ledger_id"
    delete_after_commit: bool = False
    password: bytes = b""
    entries_per_read: int = 10_000          # entries per read_arrow call (one record batch)
    file_bytes_max: int = 128 * 1024 * 1024  # a ledger's rows roll into a new parquet file past this
    tasks_max: int = 64                     # Spark tasks of phase one (fewer if fewer ledgers)
    client_conf: str | None = None          # client TOML of a secured cluster (jobs/connect.py), on every executor

    def __post_init__(self) -> None:
        if self.partition_by not in PARTITION_COLUMN:
            raise BadArgumentError(f"partition_by must be one of {sorted(PARTITION_COLUMN)}, "
                                   f"not {self.partition_by!r}")
        for name in ("entries_per_read", "file_bytes_max", "tasks_max"):
            if getattr(self, name) < 1:
                raise BadArgumentError(f"{name} must be >= 1, not {getattr(self, name)}")
        if not self.table_path:
            raise BadArgumentError("a table path is required")
        if "://" in self.table_path:
            raise BadArgumentError(f"table {self.table_path!r}: give a filesystem path (local, or a mount every "
                                   "executor shares); object-store URIs are not supported by phase one")
        if self.ledgers is not None and any(i < 0 for i in self.ledgers):
            raise BadArgumentError(f"ledger ids must be non-negative: {self.ledgers}")

    @property
    def partition_column(self) -> str:
        return PARTITION_COLUMN[self.partition_by]


def parse_ledger_ids(text: str) -> tuple[int, ...]:
    """'1,2, 5' → (1, 2, 5): the --ledgers option. Duplicates collapse; order is ascending."""
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise BadArgumentError(f"not a ledger id: {part!r} (expected e.g. --ledgers 1,2,3)") from None
        if value < 0:
            raise BadArgumentError(f"ledger ids are non-negative, not {value}")
        ids.add(value)
    if not ids:
        raise BadArgumentError(f"no ledger ids in {text!r}")
    return tuple(sorted(ids))


# ---------------------------------------------------------------------------------- pure planning


@dataclass(frozen=True)
class LedgerInfo:
    """What planning needs of one ledger's metadata (picklable: it travels to Spark executors)."""

    ledger_id: int
    closed: bool
    last_entry_id: int
    ctime_ms: int
    password_ok: bool = True

    @property
    def entries(self) -> int:
        return self.last_entry_id + 1 if self.closed else 0


@dataclass(frozen=True)
class CompactionPlan:
    to_compact: tuple[LedgerInfo, ...]
    already_compacted: tuple[int, ...]
    not_closed: tuple[int, ...]
    wrong_password: tuple[int, ...]
    missing: tuple[int, ...]


def app_id(ledger_id: int) -> str:
    """The Delta application-transaction id that marks ``ledger_id`` as compacted."""
    return f"{APP_ID_PREFIX}{ledger_id}"


def plan_compaction(ledgers: Iterable[LedgerInfo], committed: AbstractSet[int],
                    missing: Iterable[int] = ()) -> CompactionPlan:
    """Split candidate ledgers: closed and not yet committed → compact; the rest say why not.

    Open (or in-recovery) ledgers are skipped: their end is not fixed, so copying them now would
    either miss entries or copy them twice later.
    """
    todo: list[LedgerInfo] = []
    done: list[int] = []
    not_closed: list[int] = []
    wrong_pw: list[int] = []
    for info in sorted(ledgers, key=lambda i: i.ledger_id):
        if not info.closed:
            not_closed.append(info.ledger_id)
        elif info.ledger_id in committed:
            done.append(info.ledger_id)
        elif not info.password_ok:
            wrong_pw.append(info.ledger_id)
        else:
            todo.append(info)
    return CompactionPlan(tuple(todo), tuple(done), tuple(not_closed), tuple(wrong_pw), tuple(sorted(set(missing))))


def deletable_ledgers(closed_in_scope: Iterable[int], committed_after: AbstractSet[int]) -> list[int]:
    """Ledgers --delete-after-commit may delete: in scope, closed, ours, and recorded in the table.

    Includes ledgers committed by an earlier run that stopped before deleting (it is the table,
    not this run's memory, that says a ledger's entries are safe).
    """
    return sorted(set(closed_in_scope) & set(committed_after))


def entry_ranges(last_entry_id: int, entries_per_read: int) -> list[tuple[int, int]]:
    """Inclusive (first, last) read ranges covering 0..last_entry_id; none for an empty ledger."""
    if entries_per_read < 1:
        raise BadArgumentError(f"entries_per_read must be >= 1, not {entries_per_read}")
    return [(s, min(last_entry_id, s + entries_per_read - 1)) for s in range(0, last_entry_id + 1, entries_per_read)]


def assign_tasks(ledgers: Sequence[LedgerInfo], tasks_max: int) -> list[list[LedgerInfo]]:
    """Groups of ledgers for phase-one tasks, balanced by entry count (largest first, to the lightest)."""
    if tasks_max < 1:
        raise BadArgumentError(f"tasks_max must be >= 1, not {tasks_max}")
    n = min(tasks_max, len(ledgers))
    groups: list[list[LedgerInfo]] = [[] for _ in range(n)]
    loads = [0] * n
    for info in sorted(ledgers, key=lambda i: (-i.entries, i.ledger_id)):
        k = min(range(n), key=lambda j: (loads[j], j))
        groups[k].append(info)
        loads[k] += max(1, info.entries)
    return groups


def ctime_date(ctime_ms: int) -> dt.date:
    """The UTC calendar day of a ledger's creation time (milliseconds since the epoch)."""
    return dt.datetime.fromtimestamp(ctime_ms / 1000, tz=dt.UTC).date()


def partition_values(partition_column: str, info: LedgerInfo) -> dict[str, str]:
    """The Delta partition values (strings, as the log stores them) of ``info``'s rows."""
    if partition_column == "ledger_id":
        return {"ledger_id": str(info.ledger_id)}
    if partition_column == "ctime_date":
        return {"ctime_date": ctime_date(info.ctime_ms).isoformat()}
    raise BadArgumentError(f"unknown partition column {partition_column!r}")


def partition_dir(values: dict[str, str]) -> str:
    """Hive-style relative directory ('ledger_id=7'); readers without Delta parse values from it."""
    for k, v in values.items():
        invariant(all(c.isalnum() or c in "-_." for c in k + v), f"partition value needs escaping: {k}={v}")
    return "/".join(f"{k}={v}" for k, v in values.items())


def data_schema(partition_column: str) -> pa.Schema:
    """The columns stored in data files: the table's minus its partition column."""
    return pa.schema([f for f in TABLE_SCHEMA if f.name != partition_column])


def file_stats(rows: int, ledger_id: int, first_entry: int, last_entry: int, day: dt.date,
               partition_column: str) -> str:
    """Delta per-file statistics (JSON) for the non-partition columns readers can skip files by."""
    lo: dict[str, Any] = {"ledger_id": ledger_id, "entry_id": first_entry, "ctime_date": day.isoformat()}
    hi: dict[str, Any] = {"ledger_id": ledger_id, "entry_id": last_entry, "ctime_date": day.isoformat()}
    for d in (lo, hi):
        d.pop(partition_column, None)
    nulls = {f.name: 0 for f in data_schema(partition_column)}
    return json.dumps({"numRecords": rows, "minValues": lo, "maxValues": hi, "nullCount": nulls},
                      separators=(",", ":"))


# ---------------------------------------------------------------------------------- phase one: files


@dataclass(frozen=True)
class WrittenFile:
    """One parquet file written into the table directory, not yet committed (an add action to be)."""

    path: str                       # relative to the table root
    size_bytes: int
    partition_values: dict[str, str]
    modification_time_ms: int
    stats: str
    ledger_id: int
    rows: int


@dataclass(frozen=True)
class WriteSettings:
    """What a phase-one task needs (picklable; the password travels with the task)."""

    zk: str
    password: bytes
    table_path: str
    partition_column: str
    entries_per_read: int
    file_bytes_max: int
    client_conf: str | None = None   # the client TOML's path: the executor reads it (jobs/connect.py)


class _FileRoller:
    """Writes one ledger's batches into parquet files of at most ~file_bytes_max each."""

    def __init__(self, s: WriteSettings, info: LedgerInfo) -> None:
        self.s, self.info = s, info
        self.values = partition_values(s.partition_column, info)
        self.day = ctime_date(info.ctime_ms)
        self.schema = data_schema(s.partition_column)
        self.files: list[WrittenFile] = []
        self._writer: pq.ParquetWriter | None = None
        self._rel = ""
        self._rows = self._bytes = 0
        self._first = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._rel = f"{partition_dir(self.values)}/part-{uuid.uuid4().hex}.parquet"
            full = Path(self.s.table_path) / self._rel
            full.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(str(full), self.schema, compression="zstd")
            self._first = int(batch.column(1)[0].as_py())
        self._writer.write_batch(self._to_file_columns(batch))
        self._rows += batch.num_rows
        self._bytes += batch.nbytes
        if self._bytes >= self.s.file_bytes_max:
            self.finish()

    def _to_file_columns(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = {"ledger_id": batch.column(0), "entry_id": batch.column(1), "payload": batch.column(2)}
        if "ctime_date" in self.schema.names:   # the same day on every row of a ledger
            days = (self.day - dt.date(1970, 1, 1)).days
            cols["ctime_date"] = pa.array(np.full(batch.num_rows, days, dtype=np.int32)).view(pa.date32())
        return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in self.schema], schema=self.schema)

    def finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        st = os.stat(Path(self.s.table_path) / self._rel)
        last = self._first + self._rows - 1
        self.files.append(WrittenFile(
            self._rel, st.st_size, dict(self.values), int(st.st_mtime * 1000),
            file_stats(self._rows, self.info.ledger_id, self._first, last, self.day, self.s.partition_column),
            self.info.ledger_id, self._rows))
        self._rows = self._bytes = 0


def write_ledger_files(client: LedgerClient, s: WriteSettings, info: LedgerInfo) -> list[WrittenFile]:
    """Copy one closed ledger into parquet files under the table (no commit). Checks every row is there."""
    handle = client.open_ledger(info.ledger_id, password=s.password, recovery=False)
    invariant(handle.is_closed and handle.last_add_confirmed == info.last_entry_id,
              f"ledger {info.ledger_id} changed since planning (closed={handle.is_closed}, "
              f"last entry {handle.last_add_confirmed} != {info.last_entry_id})")
    roller = _FileRoller(s, info)
    expected = 0
    for first, last in entry_ranges(info.last_entry_id, s.entries_per_read):
        batch = handle.read_arrow(first, last)
        ids = batch.column(1)
        invariant(batch.num_rows == last - first + 1 and (batch.num_rows == 0 or (
            ids[0].as_py() == expected and ids[-1].as_py() == last)),
            f"ledger {info.ledger_id}: read_arrow({first}, {last}) gave {batch.num_rows} rows")
        expected = last + 1
        roller.add(batch)
    roller.finish()
    invariant(sum(f.rows for f in roller.files) == info.entries,
              f"ledger {info.ledger_id}: wrote {sum(f.rows for f in roller.files)} rows, expected {info.entries}")
    return roller.files


def write_group(s: WriteSettings, ledgers: Sequence[LedgerInfo]) -> list[WrittenFile]:
    """Phase one for a group of ledgers with one client (a Spark task, or the driver in local runs)."""
    client = connect(s.zk, s.client_conf)
    try:
        out: list[WrittenFile] = []
        for info in ledgers:
            out += write_ledger_files(client, s, info)
        return out
    finally:
        client.close()


def _spark_task(s: WriteSettings, groups: Iterator[list[LedgerInfo]]) -> Iterator[WrittenFile]:
    for group in groups:
        yield from write_group(s, group)


def write_files_with_spark(spark: Any, s: WriteSettings, groups: list[list[LedgerInfo]]) -> list[WrittenFile]:
    """Phase one in executors: one task per group; add actions come back to the driver."""
    if not groups:
        return []
    rdd = spark.sparkContext.parallelize(groups, len(groups))
    spark.sparkContext.setJobDescription(f"compact {sum(len(g) for g in groups)} ledgers into Delta")
    files: list[WrittenFile] = rdd.mapPartitions(functools.partial(_spark_task, s)).collect()
    return files


# ---------------------------------------------------------------------------------- phase two: commit


def open_table(path: str, partition_column: str) -> DeltaTable:
    """The Delta table at ``path``, created empty (version 0) if absent; checks its shape."""
    from deltalake import DeltaTable

    table = DeltaTable.create(path, TABLE_SCHEMA, mode="ignore", partition_by=[partition_column],
                              name="spark_bookie_ledgers")
    table = DeltaTable(path)
    have = table.metadata().partition_columns
    if list(have) != [partition_column]:
        raise TableMismatchError(f"table {path} is partitioned by {list(have)}, not [{partition_column!r}]; "
                                 "use the partitioning it was created with")
    names = [f.name for f in table.schema().fields]
    if names != TABLE_SCHEMA.names:
        raise TableMismatchError(f"table {path} has columns {names}, expected {TABLE_SCHEMA.names}")
    return table


def committed_ledgers(table: DeltaTable, ledger_ids: Iterable[int]) -> set[int]:
    """Which of ``ledger_ids`` the table's current snapshot records as compacted (~1 ms per id)."""
    return {i for i in ledger_ids if table.transaction_version(app_id(i)) is not None}


def commit_files(table: DeltaTable, files: Sequence[WrittenFile], ledgers: Sequence[LedgerInfo],
                 partition_column: str) -> int:
    """Phase two: every file and every ledger's txn record in ONE Delta commit. Returns the new version."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    invariant({f.ledger_id for f in files} <= {i.ledger_id for i in ledgers},
              "a written file belongs to a ledger outside this commit")
    adds: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size_bytes, f.partition_values, f.modification_time_ms, True, f.stats) for f in files]
    ids = [i.ledger_id for i in ledgers]
    now_ms = int(time.time() * 1000)
    props = CommitProperties(
        app_transactions=[Transaction(app_id(i), TXN_VERSION, now_ms) for i in ids],
        custom_metadata={"spark_bookie.compacted_ledgers": ids,
                         "spark_bookie.rows": sum(f.rows for f in files)})
    try:
        table.create_write_transaction(adds, "append", TABLE_SCHEMA, partition_by=[partition_column],
                                       commit_properties=props)
    except CommitFailedError as e:
        raise ConcurrentCompactionError(
            f"commit of ledgers {ids} failed ({e}); another compaction probably committed some of them. "
            "Nothing of this run is in the table; run again to compact what is left.") from e
    table.update_incremental()
    return table.version()


# ---------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class CompactionResult:
    table_version: int
    plan: CompactionPlan
    files: int = 0
    rows: int = 0
    deleted: tuple[int, ...] = ()
    seconds: float = 0.0
    committed: tuple[int, ...] = field(default=())

    def summary(self) -> dict[str, Any]:
        p = self.plan
        return {"table_version": self.table_version, "compacted": list(self.committed), "rows": self.rows,
                "files": self.files, "already_compacted": list(p.already_compacted),
                "skipped_not_closed": list(p.not_closed), "skipped_wrong_password": list(p.wrong_password),
                "missing": list(p.missing), "deleted": list(self.deleted), "seconds": round(self.seconds, 3)}


def _info(md: LedgerMetadata, password: bytes) -> LedgerInfo:
    from metadata import LedgerState
    from metadata.model import master_key

    return LedgerInfo(md.ledger_id, md.state is LedgerState.CLOSED, md.last_entry_id, md.ctime,
                      master_key(password) == md.password_hash)


def scan_ledgers(client: LedgerClient, wanted: tuple[int, ...] | None,
                 password: bytes) -> tuple[list[LedgerInfo], list[int]]:
    """(metadata of the ledgers in scope, requested ids that do not exist)."""
    from ledger_client import errors

    ids = sorted(client.list_ledgers()) if wanted is None else list(wanted)
    infos: list[LedgerInfo] = []
    missing: list[int] = []
    for lid in ids:
        try:
            infos.append(_info(client.ledger_metadata(lid), password))
        except errors.NoSuchLedgerError:
            missing.append(lid)  # deleted since listing, or never existed
    return infos, missing


def compact(cfg: CompactionConfig, spark: Any = None, hook: Callable[[str], None] | None = None) -> CompactionResult:
    """Compact the closed ledgers of ``cfg`` into its table; phase one in Spark executors if ``spark``.
    ``hook`` hears each step's name once it is done (scanned, written, committed, deleted).

    Idempotent: ledgers already recorded in the table are skipped, and a crash at any point leaves
    the table either without a ledger or with all of it, never half or twice.
    """
    step = hook or (lambda _name: None)
    t0 = time.monotonic()
    table = open_table(cfg.table_path, cfg.partition_column)
    client = connect(cfg.zk, cfg.client_conf)
    try:
        infos, missing = scan_ledgers(client, cfg.ledgers, cfg.password)
        step("scanned")
        closed = [i.ledger_id for i in infos if i.closed]
        plan = plan_compaction(infos, committed_ledgers(table, closed), missing)
        ours = [i.ledger_id for i in infos if i.closed and i.password_ok]   # deletable with this password
        version = table.version()
        files: list[WrittenFile] = []
        if plan.to_compact:
            settings = WriteSettings(cfg.zk, cfg.password, str(Path(cfg.table_path).absolute()),
                                     cfg.partition_column, cfg.entries_per_read, cfg.file_bytes_max,
                                     cfg.client_conf)
            groups = assign_tasks(plan.to_compact, cfg.tasks_max)
            files = (write_files_with_spark(spark, settings, groups) if spark is not None
                     else [f for g in groups for f in write_group(settings, g)])
            step("written")
            version = commit_files(table, files, plan.to_compact, cfg.partition_column)
        step("committed")
        deleted: list[int] = []
        if cfg.delete_after_commit:
            deleted = _delete_compacted(client, table, ours)
            step("deleted")
    finally:
        client.close()
    return CompactionResult(version, plan, len(files), sum(f.rows for f in files), tuple(deleted),
                            time.monotonic() - t0, tuple(i.ledger_id for i in plan.to_compact))


def _delete_compacted(client: LedgerClient, table: DeltaTable, closed_in_scope: Sequence[int]) -> list[int]:
    """Delete ledgers only when a fresh snapshot of the table (after the commit) records them."""
    from deltalake import DeltaTable

    fresh = DeltaTable(table.table_uri)
    victims = deletable_ledgers(closed_in_scope, committed_ledgers(fresh, closed_in_scope))
    for lid in victims:
        client.delete_ledger(lid)
        log.info("deleted ledger %d (compacted into %s at version %d)", lid, table.table_uri, fresh.version())
    return victims
