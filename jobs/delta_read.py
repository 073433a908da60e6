"""Reading a Delta table (e.g. the one ``jobs/compact_to_delta.py`` writes) back into Spark.

Two ways, chosen by :func:`read_delta` (``how="auto"``):

1. **The real Delta source** — ``spark.read.format("delta").load(path)`` — when the Delta Lake jars
   (``delta-spark``) are on the session's classpath. It understands everything in the Delta
   protocol (deletion vectors, column mapping, time travel). Preferred wherever it is available.
2. **The current snapshot's file list** otherwise (the jars cannot be downloaded on machines
   without Maven access): delta-rs reads the log and lists exactly the files of the current
   snapshot (``DeltaTable(path).file_uris()`` / its add actions); Spark reads those files with an
   explicit schema (from the Delta schema, view types cast to plain ``binary``/``string``), and
   partition columns come from the files' hive-style directories (``ledger_id=7/``) via
   ``basePath`` — or, for tables whose paths do not encode their partitions, from the add
   actions' partition values as literal columns.

Never ``spark.read.parquet(table_dir)``: it lists the directory, so it also returns files the log
has removed (after an overwrite, delete or optimize) and files a crashed writer left uncommitted —
duplicates and resurrected rows. A snapshot read sees neither.

The file-list path refuses tables whose readers need more than plain parquet (deletion vectors,
column mapping) instead of returning wrong rows.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlparse

import pyarrow as pa

from jobs.errors import DeltaReadError
from jobs.pyspark_compat import session_jvm, spark_schema_of

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DELTA_SOURCE_CLASS = "org.apache.spark.sql.delta.sources.DeltaDataSource"
_UNSUPPORTED_READER_FEATURES = {"deletionVectors", "columnMapping"}
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def delta_jars_available(spark: SparkSession) -> bool:
    """True when the session's JVM can load the Delta data source (delta-spark jars present)."""
    try:
        jvm = session_jvm(spark)  # None in Spark Connect: no jars to ask
        if jvm is None:
            return False
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_SOURCE_CLASS, False, loader)
        return True
    except Exception:
        return False


def read_delta(spark: SparkSession, path: str | Path, how: Literal["auto", "delta", "files"] = "auto") -> DataFrame:
    """The current snapshot of the Delta table at ``path`` as a DataFrame (columns in table order)."""
    if how not in ("auto", "delta", "files"):
        raise ValueError(f"how must be 'auto', 'delta' or 'files', not {how!r}")
    if how == "delta" or (how == "auto" and delta_jars_available(spark)):
        return spark.read.format("delta").load(str(path))
    return read_snapshot_files(spark, path)


def plain_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with view types replaced by plain ones (Spark knows ``binary``, not ``binary_view``)."""
    return pa.schema([f.with_type(plain_arrow_type(f.type)) for f in schema], metadata=schema.metadata)


def plain_arrow_type(t: pa.DataType) -> pa.DataType:
    if t == pa.binary_view():
        return pa.binary()
    if t == pa.string_view():
        return pa.string()
    return t


def to_plain_arrow(table: pa.Table) -> pa.Table:
    """Cast a delta-rs Arrow result to types Spark's ``createDataFrame`` accepts (no view types)."""
    return table.cast(plain_arrow_schema(table.schema))


def spark_schema(table: DeltaTable) -> StructType:
    return spark_schema_of(plain_arrow_schema(pa.schema(table.schema().to_arrow())))


def _check_readable(table: DeltaTable) -> None:
    proto = table.protocol()
    features = set(proto.reader_features or ())
    bad = features & _UNSUPPORTED_READER_FEATURES
    if bad:
        raise DeltaReadError(f"{table.table_uri} uses {sorted(bad)}: reading its files directly would return "
                             "wrong rows; read it with the Delta jars (how='delta')")
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode not in (None, "none"):
        raise DeltaReadError(f"{table.table_uri} uses column mapping ({mode}); read it with the Delta jars")


def _local_root(table: DeltaTable) -> str:
    uri = table.table_uri
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path).rstrip("/")
    return uri.rstrip("/")


def _value_text(v: Any) -> str:
    return _HIVE_NULL if v is None else str(v)


def read_snapshot_files(spark: SparkSession, path: str | Path, version: int | None = None) -> DataFrame:
    """The snapshot's files read by Spark's parquet reader (no Delta jars needed); see the module doc."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    _check_readable(table)
    schema = spark_schema(table)
    columns = [f.name for f in schema.fields]
    parts = list(table.metadata().partition_columns)
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return spark.createDataFrame([], schema)
    root = _local_root(table)
    rel = [unquote(p) for p in actions.column("path").to_pylist()]
    values = [{c: _value_text(v) for c, v in zip(parts, row, strict=True)}
              for row in zip(*[actions.column(f"partition.{c}").to_pylist() for c in parts], strict=True)] \
        if parts else [{} for _ in rel]
    files = [p if "://" in p or p.startswith("/") else f"{root}/{p}" for p in rel]
    if all(_hive_encoded(p, v) for p, v in zip(rel, values, strict=True)):
        df = spark.read.schema(schema).option("basePath", root).parquet(*files)
        return df.select(*columns)
    return _union_by_partition(spark, schema, parts, files, values)


def _hive_encoded(rel_path: str, values: dict[str, str]) -> bool:
    """Does the file's directory say exactly its partition values (so Spark can parse them)?"""
    dirs = rel_path.split("/")[:-1]
    return dirs == [f"{k}={v}" for k, v in values.items()] and "://" not in rel_path


def _union_by_partition(spark: SparkSession, schema: StructType, parts: list[str], files: list[str],
                        values: list[dict[str, str]]) -> DataFrame:
    """Files grouped by partition values; each group read with its values as literal columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    data_schema = StructType([f for f in schema.fields if f.name not in parts])
    types = {f.name: f.dataType for f in schema.fields}
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for f, v in zip(files, values, strict=True):
        groups.setdefault(tuple(sorted(v.items())), []).append(f)
    frames: list[DataFrame] = []
    for key, group in groups.items():
        df = spark.read.schema(data_schema).parquet(*group)
        for col, text in key:
            lit = F.lit(None) if text == _HIVE_NULL else F.lit(text)
            df = df.withColumn(col, lit.cast(types[col]))
        frames.append(df.select(*[f.name for f in schema.fields]))
    log.info("read %d files in %d partition groups (paths not hive-style)", len(files), len(groups))
    return functools.reduce(lambda a, b: a.unionByName(b), frames)
