"""Tiering sealed stream segments into one Delta table (DESIGN §4.6), crash-safe at every step.

    spark-submit jobs/compact_to_delta.py --zk Z --stream payments/orders --table PATH --tier

One run, per matching stream (``ns/*`` for all streams of a namespace):

1. **write**: every SEALED segment not yet in the table is copied into parquet files under the
   table (executors when a Spark session is given, else this process), rows in the stream columns
   (stream, segment, entry_id, slot, txid, payload), each count checked against the metadata;
2. **commit**: all files of the run in ONE Delta commit (delta-rs) that also records one
   application transaction per segment, app id ``spark-bookie/stream/<ns>/<name>/<seq>/<ledger>``;
   a rerun finds those and writes nothing again (the ledger id in the id keeps a recreated stream's
   segment 1 apart from the old one's);
3. **mark** (``--tier``): the committed segments become TIERED in the stream's metadata, with the
   table and a Delta version that holds them (metadata/streams/tiering.py, one CAS per stream);
4. **delete** (``--tier``): their ledgers are deleted, then the segments stop naming them.

A crash between any two steps loses and duplicates nothing on rerun: files written but not
committed are in no Delta snapshot (readers list files from the log) and the segment is written
again; committed but not marked, the rerun sees the app transaction and only marks; marked but
not deleted, the rerun finds TIERED segments that still name a ledger and deletes it (deleting is
idempotent). Readers read a segment from its ledger until it is marked and from Delta after, so
every record is readable at every moment. ``hook(step)`` is called after each step (tests crash
the run there).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.connect import connect
from jobs.errors import BadArgumentError, ConcurrentCompactionError, TableMismatchError
from jobs.options import matches, parse_stream_patterns
from ledger_client.protocol.checks import invariant
from ledger_client.stream.tiered import table_schema

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from ledger_client import LedgerClient
    from ledger_client.stream import Namespace
    from metadata.streams import SegmentMeta

log = logging.getLogger(__name__)

APP_ID_PREFIX = "spark-bookie/stream/"
TXN_VERSION = 1
STEPS = ("written", "committed", "marked", "deleted")
# Row groups carry min/max statistics of entry_id: a reader of a few entries (a stream reader's
# tiered step) decodes only the groups that hold them, not a whole segment's one group.
ROW_GROUP_ROWS = 65_536
TABLE_SCHEMA = table_schema()


@dataclass(frozen=True)
class TieringConfig:
    """One tiering run. ``streams``: "ns/name" items, globs allowed ("payments/*")."""

    zk: str
    table_path: str
    streams: str
    tier: bool = True                         # False: copy into Delta only (no marking, no deleting)
    entries_per_read: int = 64                # record sets per range read
    file_bytes_max: int = 128 * 1024 * 1024   # a segment's rows roll into a new parquet file past this
    tasks_max: int = 64                       # Spark tasks that write files (at most)
    sealed_before_ms: int | None = None       # only segments sealed at or before this time (ms since epoch)
    client_conf: str | None = None            # client TOML of a secured cluster (jobs/connect.py), on every executor

    def __post_init__(self) -> None:
        parse_stream_patterns(self.streams)
        for name in ("entries_per_read", "file_bytes_max", "tasks_max"):
            if getattr(self, name) < 1:
                raise BadArgumentError(f"{name} must be >= 1, not {getattr(self, name)}")
        if not self.table_path or "://" in self.table_path:
            raise BadArgumentError(f"table {self.table_path!r}: give a filesystem path every executor shares")


@dataclass(frozen=True)
class SegmentTask:
    """One sealed segment to copy (picklable: it travels to executors)."""

    stream: str
    sequence: int
    ledger_id: int
    last_entry_id: int
    record_count: int
    first_txid: int
    password: bytes

    @property
    def app_id(self) -> str:
        return app_id(self.stream, self.sequence, self.ledger_id)


def app_id(stream: str, sequence: int, ledger_id: int) -> str:
    """The Delta application-transaction id that says this segment (and ledger) is in the table."""
    return f"{APP_ID_PREFIX}{stream}/{sequence}/{ledger_id}"


@dataclass(frozen=True)
class TierFile:
    """A parquet file written under the table, not yet committed (an add action to be)."""

    path: str                 # relative to the table root
    size_bytes: int
    modification_time_ms: int
    stats: str
    rows: int
    app_id: str


@dataclass(frozen=True)
class TieringResult:
    table_version: int
    written: tuple[str, ...] = ()             # app ids of segments copied by this run
    already_in_table: tuple[str, ...] = ()
    marked: dict[str, list[int]] = field(default_factory=dict)       # stream -> sequences marked TIERED
    deleted_ledgers: tuple[int, ...] = ()
    rows: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"table_version": self.table_version, "segments_written": len(self.written),
                "already_in_table": len(self.already_in_table), "rows": self.rows,
                "marked_tiered": self.marked, "deleted_ledgers": list(self.deleted_ledgers),
                "seconds": round(self.seconds, 3)}


# ---------------------------------------------------------------------------------- step 1: files


def _stats(rows: pa.Table) -> str:
    cols = ("stream", "segment", "entry_id", "slot", "txid")
    lo = {c: pc.min(rows.column(c)).as_py() for c in cols}
    hi = {c: pc.max(rows.column(c)).as_py() for c in cols}
    return json.dumps({"numRecords": rows.num_rows, "minValues": lo, "maxValues": hi,
                       "nullCount": {f.name: 0 for f in TABLE_SCHEMA}}, separators=(",", ":"))


def write_segment_files(client: LedgerClient, table_path: str, t: SegmentTask, entries_per_read: int,
                        file_bytes_max: int) -> list[TierFile]:
    """Copy one sealed segment's records into parquet files under the table (no commit)."""
    from jobs.stream_source import segment_rows

    h = client.open_ledger(t.ledger_id, t.password, recovery=False)
    # a sealed segment ends at its last entry with records; control entries (no records) may follow
    invariant(h.is_closed and h.last_add_confirmed >= t.last_entry_id,
              f"{t.stream} segment {t.sequence}: ledger {t.ledger_id} is not closed past entry {t.last_entry_id}")
    files: list[TierFile] = []
    pending: list[pa.Table] = []
    size = 0

    def flush() -> None:
        nonlocal pending, size
        rows = pa.concat_tables(pending)
        rel = f"stream-part-{uuid.uuid4().hex}.parquet"
        pq.write_table(rows, str(Path(table_path) / rel), compression="zstd", row_group_size=ROW_GROUP_ROWS)
        st = os.stat(Path(table_path) / rel)
        files.append(TierFile(rel, st.st_size, int(st.st_mtime * 1000), _stats(rows), rows.num_rows, t.app_id))
        pending, size = [], 0

    for a in range(0, t.last_entry_id + 1, entries_per_read):
        entries = h.read(a, min(t.last_entry_id, a + entries_per_read - 1))
        rows = segment_rows(t.stream, t.sequence, [(e.entry_id, e.data) for e in entries], t.first_txid)
        if rows.num_rows:
            pending.append(rows)
            size += rows.nbytes
        if size >= file_bytes_max:
            flush()
    if pending:
        flush()
    got = sum(f.rows for f in files)
    invariant(got == t.record_count, f"{t.stream} segment {t.sequence}: read {got} records, "
                                     f"the metadata says {t.record_count}")
    return files


def write_tasks(zk: str, table_path: str, tasks: Sequence[SegmentTask], entries_per_read: int,
                file_bytes_max: int, client_conf: str | None = None) -> list[TierFile]:
    """Step 1 for a group of segments with one client (a Spark task, or this process); with the
    credentials of the client TOML ``client_conf`` on a secured cluster."""
    client = connect(zk, client_conf)
    try:
        return [f for t in tasks for f in write_segment_files(client, table_path, t, entries_per_read, file_bytes_max)]
    finally:
        client.close()


def _spark_task(args: tuple[str, str, int, int, str | None],
                groups: Iterator[list[SegmentTask]]) -> Iterator[TierFile]:
    zk, table_path, entries_per_read, file_bytes_max, client_conf = args
    for group in groups:
        yield from write_tasks(zk, table_path, group, entries_per_read, file_bytes_max, client_conf)


def write_files(cfg: TieringConfig, table_path: str, tasks: Sequence[SegmentTask], spark: Any) -> list[TierFile]:
    """Step 1 in Spark executors: groups of segments, one task each; add actions come back."""
    if not tasks:
        return []
    n = min(cfg.tasks_max, len(tasks))
    groups = [list(tasks[i::n]) for i in range(n)]
    spark.sparkContext.setJobDescription(f"tier {len(tasks)} stream segments into Delta")
    task = functools.partial(_spark_task, (cfg.zk, table_path, cfg.entries_per_read, cfg.file_bytes_max,
                                           cfg.client_conf))
    files: list[TierFile] = spark.sparkContext.parallelize(groups, n).mapPartitions(task).collect()
    return files


# ---------------------------------------------------------------------------------- step 2: commit


def open_table(path: str) -> DeltaTable:
    """The Delta table at ``path``, created empty if absent; refuses one of another shape."""
    from deltalake import DeltaTable

    DeltaTable.create(path, TABLE_SCHEMA, mode="ignore", name="spark_bookie_streams")
    table = DeltaTable(path)
    names = [f.name for f in table.schema().fields]
    if names != TABLE_SCHEMA.names or table.metadata().partition_columns:
        raise TableMismatchError(f"table {path} has columns {names} (partitioned by "
                                 f"{table.metadata().partition_columns}), not a stream table {TABLE_SCHEMA.names}")
    return table


def commit_files(table: DeltaTable, files: Sequence[TierFile], tasks: Sequence[SegmentTask]) -> int:
    """Every file and every segment's app transaction in ONE Delta commit; the new version."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    ids = [t.app_id for t in tasks]
    invariant({f.app_id for f in files} <= set(ids), "a written file belongs to a segment outside this commit")
    adds: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size_bytes, {}, f.modification_time_ms, True, f.stats) for f in files]
    now_ms = int(time.time() * 1000)
    props = CommitProperties(app_transactions=[Transaction(i, TXN_VERSION, now_ms) for i in ids],
                             custom_metadata={"spark_bookie.tiered_segments": ids,
                                              "spark_bookie.rows": sum(f.rows for f in files)})
    try:
        table.create_write_transaction(adds, "append", TABLE_SCHEMA, commit_properties=props)
    except CommitFailedError as e:
        raise ConcurrentCompactionError(f"commit of {len(ids)} segments failed ({e}); another run probably "
                                        "committed some of them. Nothing of this run is in the table: run again.") \
            from e
    table.update_incremental()
    return table.version()


# ---------------------------------------------------------------------------------- steps 3 and 4


def resolve_streams(client: LedgerClient, patterns: str) -> list[tuple[str, str]]:
    """(namespace, stream) of every existing stream the items match; a plain name that matches no
    stream is BadArgumentError (tiering nothing because of a typo should not look like success)."""
    from ledger_client import errors

    pats = parse_stream_patterns(patterns)
    found: set[tuple[str, str]] = set()
    for ns in client.list_namespaces():
        if any(matches([(a, "*")], ns, "x") for a, _ in pats):
            try:
                found |= {(ns, s) for s in client.namespace(ns).list_streams() if matches(pats, ns, s)}
            except errors.NoSuchNamespaceError:
                continue
    for a, b in pats:
        if not any(c in a + b for c in "*?[") and (a, b) not in found:
            raise BadArgumentError(f"stream {a}/{b} does not exist")
    return sorted(found)


def scan(client: LedgerClient, streams: Sequence[tuple[str, str]],
         sealed_before_ms: int | None = None) -> tuple[dict[str, Namespace], list[SegmentTask]]:
    """The namespaces and the sealed segments (with a ledger) of the streams, oldest first."""
    from metadata.streams.tiering import tierable

    spaces: dict[str, Namespace] = {}
    tasks: list[SegmentTask] = []
    for ns_name, name in streams:
        ns = spaces.get(ns_name) or spaces.setdefault(ns_name, client.namespace(ns_name))
        for s in due(tierable(ns.view(name)), sealed_before_ms):
            invariant(s.ledger_id is not None, "tierable segments have a ledger")
            tasks.append(SegmentTask(f"{ns_name}/{name}", s.sequence, int(s.ledger_id or 0), s.last_entry_id,
                                     s.record_count, s.first_txid, ns.settings.ledger_password))
    return spaces, tasks


def due(segments: Sequence[SegmentMeta], sealed_before_ms: int | None) -> list[SegmentMeta]:
    if sealed_before_ms is None:
        return list(segments)
    return [s for s in segments if s.sealed_ms is not None and s.sealed_ms <= sealed_before_ms]


def mark(ns: Namespace, name: str, tasks: Sequence[SegmentTask], table_path: str, version: int) -> list[int]:
    """Step 3 for one stream: its committed segments become TIERED (one CAS, retried on a race)."""
    from ledger_client.stream.segments import commit
    from metadata.streams import TierInfo
    from metadata.streams.tiering import mark_tiered

    tiers = {t.sequence: (t.ledger_id, TierInfo(table_path, version)) for t in tasks}
    _view, change = commit(ns, name, lambda v: mark_tiered(v, tiers), None)
    return [] if change is None else [s.sequence for s, _ in change.update]


def release(ns: Namespace, name: str, hook: Callable[[str], None]) -> list[int]:
    """Step 4 for one stream: delete the ledgers of TIERED segments, then forget them."""
    from ledger_client.stream.segments import commit
    from metadata.streams.tiering import forget_ledgers, ledgers_to_release

    lids = sorted(ledgers_to_release(ns.view(name)).values())
    for lid in lids:
        ns.client.delete_ledger(lid)
        log.info("deleted ledger %d of %s/%s (tiered)", lid, ns.name, name)
    hook("deleted")
    commit(ns, name, lambda v: forget_ledgers(v, lids), None)
    return lids


def tier_streams(cfg: TieringConfig, spark: Any = None, hook: Callable[[str], None] | None = None,
                 client: LedgerClient | None = None) -> TieringResult:
    """Run the steps (module doc) for every stream ``cfg.streams`` matches; with ``client``, on
    that client (not closed here) instead of one of its own."""
    from deltalake import DeltaTable

    step = hook or (lambda _name: None)
    t0 = time.monotonic()
    path = str(Path(cfg.table_path).absolute())
    table = open_table(path)
    own = client is None
    client = connect(cfg.zk, cfg.client_conf) if client is None else client
    try:
        streams = resolve_streams(client, cfg.streams)
        spaces, tasks = scan(client, streams, cfg.sealed_before_ms)
        done = {t.app_id for t in tasks if table.transaction_version(t.app_id) is not None}
        todo = [t for t in tasks if t.app_id not in done]
        if spark is None:
            files = [f for t in todo for f in write_segment_files(client, path, t, cfg.entries_per_read,
                                                                  cfg.file_bytes_max)]
        else:
            files = write_files(cfg, path, todo, spark)
        step("written")
        version = commit_files(table, files, todo) if todo else table.version()
        step("committed")
        marked: dict[str, list[int]] = {}
        deleted: list[int] = []
        if cfg.tier:
            fresh = DeltaTable(path)
            in_table = [t for t in tasks if fresh.transaction_version(t.app_id) is not None]
            for ns_name, name in streams:
                mine = [t for t in in_table if t.stream == f"{ns_name}/{name}"]
                got = mark(spaces[ns_name], name, mine, path, fresh.version()) if mine else []
                if got:
                    marked[f"{ns_name}/{name}"] = got
            step("marked")
            for ns_name, name in streams:
                deleted += release(spaces[ns_name], name, step)
    finally:
        if own:
            client.close()
    return TieringResult(version, tuple(t.app_id for t in todo), tuple(sorted(done)), marked, tuple(deleted),
                         sum(f.rows for f in files), time.monotonic() - t0)


def tier_step(ns: Namespace, stream: str, now_ms: int | None = None) -> int:
    """recovery/stream_maintenance.py's TierStep: tier the segments of ``stream`` sealed more than
    the namespace's ``tier_after_ms`` ago into ``<tier_table>/<stream>``; how many were marked.
    Does nothing (and touches no table) when the namespace does not tier or nothing is due.
    Runs on the namespace's own client, so with its credentials: the auditor's, which the hosting
    driver and `spark-bookie autorecovery --client-conf` give the client TOML of a secured cluster."""
    from metadata.streams.tiering import ledgers_to_release, tierable

    st = ns.settings
    if st.tier_after_ms is None or not st.tier_table:
        return 0
    cutoff = (now_ms if now_ms is not None else int(time.time() * 1000)) - st.tier_after_ms
    view = ns.view(stream)
    if not due(tierable(view), cutoff) and not ledgers_to_release(view):
        return 0
    cfg = TieringConfig(zk="", table_path=f"{st.tier_table}/{stream}", streams=f"{ns.name}/{stream}",
                        sealed_before_ms=cutoff)
    result = tier_streams(cfg, client=ns.client)
    return sum(len(v) for v in result.marked.values())
