"""A tiered segment's files read by pyarrow itself, when its Delta table is on a local file system.

delta-rs scans a local table through a file system written in Python, which takes the GIL for each
read. A stream reader's own thread, building records from the previous step meanwhile, holds the
GIL for a few milliseconds at a time, and the scan waited out the switch interval each time it
needed it back: a 256-entry step (380,000-480,000 rows) took 0.24-0.45 s beside a thread building
records, against 0.03-0.06 s alone. Here the snapshot's files are listed once per segment (pruned
by the segment numbers in the Delta log's file statistics) and kept as a pyarrow dataset; each step
is then one scan in C++ with the GIL released: 0.05-0.09 s beside that thread, 0.02-0.04 s alone.

Only plain tables (reader protocol 1: no deletion vectors, no column mapping) on local paths are
read this way; anything else goes through delta-rs (``None`` here). A snapshot's files never
change, so the dataset is kept per (table, version, segment) and the version's commit
file's mtime: a table deleted and written again at the same path is listed again.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds

DATASETS_CACHED = 64   # segments whose file lists are kept (a reader moves through them in order)


def table_schema() -> pa.Schema:
    """The tiered table's columns. A function, not a constant: pyarrow is imported only when
    tiered data is read (the client also runs where pyarrow is not installed, e.g. Spark 3.5)."""
    import pyarrow as pa

    return pa.schema([("stream", pa.string()), ("segment", pa.int64()), ("entry_id", pa.int64()),
                      ("slot", pa.int32()), ("txid", pa.int64()), ("payload", pa.binary())])


def local_root(table: str) -> str | None:
    """The table's directory when it is a local path (or a file:// URI), else None."""
    if "://" in table and not table.startswith("file://"):
        return None
    root = urllib.parse.unquote(table.removeprefix("file://")) if table.startswith("file://") else table
    return root.rstrip("/") if os.path.isabs(root) else os.path.abspath(root)


def segment_dataset(table: str, version: int, segment: int) -> ds.Dataset | None:
    """The segment's files at ``version`` as a pyarrow dataset; None: read through delta-rs."""
    root = local_root(table)
    if root is None:
        return None
    try:
        stamp = os.stat(f"{root}/_delta_log/{version:020d}.json").st_mtime_ns
    except OSError:
        stamp = None   # the commit file went with a log cleanup (a checkpoint holds the version)
    return _dataset(table, version, segment, stamp)


@functools.lru_cache(maxsize=DATASETS_CACHED)
def _dataset(table: str, version: int, segment: int, _stamp: int | None) -> ds.Dataset | None:
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

    files = local_files(DeltaTable(table, version=version), segment)
    if files is None:
        return None
    # The stream column read as a dictionary: one name over a file's rows is then decoded once, not
    # once a row (a step of 51,200 rows: 10.6 ms against 15.8 ms with the names as strings).
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=["stream"]))
    return ds.dataset(files, schema=scan_schema(), format=fmt, filesystem=pafs.LocalFileSystem())


def scan_schema() -> pa.Schema:
    """table_schema() with the stream's name as a dictionary (see _dataset)."""
    import pyarrow as pa

    plain = table_schema()
    return plain.set(plain.get_field_index("stream"), pa.field("stream", pa.dictionary(pa.int32(), pa.string())))


def local_files(dt: Any, segment: int) -> list[str] | None:
    """The snapshot's files whose statistics leave room for the segment's rows (a statistic
    missing leaves room); None unless the table is plain and every file a local path."""
    import pyarrow as pa

    if dt.protocol().min_reader_version > 1:
        return None
    paths = [u.removeprefix("file://") for u in dt.file_uris()]
    if any("://" in p or not os.path.isabs(p) for p in paths):
        return None
    root = local_root(dt.table_uri)
    kept = []
    for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist():
        path = urllib.parse.unquote(a["path"].removeprefix("file://"))
        if _may_hold(a, segment):
            kept.append(path if os.path.isabs(path) else f"{root}/{path}")
    known = set(paths)
    return kept if all(p in known for p in kept) else paths   # paths not matched: no pruning


def _may_hold(a: dict[str, Any], segment: int) -> bool:
    """By the segment's statistics only: a string's may be cut short by the writer (delta-rs cuts
    them at 32 characters), and a maximum cut short is below the longer names it stands for."""
    lo, hi = a.get("min.segment"), a.get("max.segment")
    return (lo is None or lo <= segment) and (hi is None or hi >= segment)
