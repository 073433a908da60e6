"""jobs/pyspark_compat.py's assumptions about PySpark's internals hold for the installed (pinned)
pyspark, and its functions do what the source relies on. No JVM: PySpark's planner worker code
runs in this process on a hand-built input, as it would in its own worker process."""

from __future__ import annotations

import ast
import inspect
import io
import struct
import textwrap
from typing import Any

import pyarrow as pa
import pytest
from pyspark.serializers import write_int, write_with_length
from pyspark.sql import session as spark_session
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType
from pyspark.sql.worker import plan_data_source_read as planner

from jobs import pyspark_compat
from jobs.delta_read import delta_jars_available
from jobs.ledger_read import LedgerPushdownReader, LedgerReader
from jobs.ledger_source import LedgerDataSource
from jobs.stream_source import StreamBatchReader, StreamPushdownReader

pytestmark = pytest.mark.unit

LEDGER_SCHEMA = StructType([StructField("ledger_id", LongType()), StructField("entry_id", LongType()),
                            StructField("payload", BinaryType())])
STREAM_SCHEMA = StructType([StructField("stream", StringType()), StructField("segment", LongType()),
                            StructField("entry_id", LongType()), StructField("slot", IntegerType()),
                            StructField("txid", LongType()), StructField("payload", BinaryType())])


def _calls_reader(fn: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "reader"]


def test_the_planner_keeps_the_pushdown_flag_in_a_local_before_it_asks_for_the_reader():
    tree = ast.parse(inspect.getsource(planner))
    askers = [f for f in tree.body if isinstance(f, ast.FunctionDef) and _calls_reader(f)]
    assert [f.name for f in askers] == ["_main"], "PySpark's planner asks for the reader elsewhere now"
    main = askers[0]
    stores = [n for n in ast.walk(main) if isinstance(n, ast.Name) and n.id == pyspark_compat.PUSHDOWN_LOCAL
              and isinstance(n.ctx, ast.Store)]
    assert stores, f"_main no longer assigns {pyspark_compat.PUSHDOWN_LOCAL}"
    assert min(n.lineno for n in stores) < min(c.lineno for c in _calls_reader(main))
    # ... and it is the flag by which the planner refuses a reader that overrides pushFilters
    text = ast.unparse(main)
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in text and f"not {pyspark_compat.PUSHDOWN_LOCAL}" in text


def _planner_input(source: Any, schema: StructType, enable_pushdown: bool) -> io.BytesIO:
    """What the JVM sends plan_data_source_read._main for a batch read (pyspark 4.3's order)."""
    buf = io.BytesIO()
    write_with_length(planner.pickleSer.dumps(source), buf)
    write_with_length(StructType([StructField("value", BinaryType())]).json().encode(), buf)
    write_with_length(schema.json().encode(), buf)
    write_int(10_000, buf)                                   # max arrow batch size
    for flag in (enable_pushdown, False, False):             # pushdown, streaming, binary as bytes
        buf.write(struct.pack("!?", flag))
    buf.seek(0)
    return buf


@pytest.mark.parametrize("options, schema, plain, pushing", [
    ({"zk": "nowhere:1", "ledgers": "1"}, LEDGER_SCHEMA, LedgerReader, LedgerPushdownReader),
    ({"zk": "nowhere:1", "streams": "ns/s"}, STREAM_SCHEMA, StreamBatchReader, StreamPushdownReader),
])
def test_the_real_planner_gets_a_reader_it_accepts(monkeypatch, options, schema, plain, pushing):
    """PySpark's own _main, through its real call depth, with pushdown off and on: the source
    offers pushFilters exactly when pushdown is on, so the planner never refuses it."""
    monkeypatch.delenv("PYSPARK_SPARK_SESSION_UUID", raising=False)   # no worker log capture
    got: list[Any] = []
    monkeypatch.setattr(planner, "write_read_func_and_partitions", lambda outfile, **kw: got.append(kw["reader"]))
    for enabled, want in ((False, plain), (True, pushing)):
        planner._main(_planner_input(LedgerDataSource(options), schema, enabled), io.BytesIO())
        assert type(got[-1]) is want


def _reader() -> bool:
    """Stands in for DataSource.reader: calls pushdown_refused directly."""
    return pyspark_compat.pushdown_refused()


def _nested(depth: int) -> bool:
    return _reader() if depth == 0 else _nested(depth - 1)


def test_pushdown_refused_reads_the_callers_planner_frame():
    def planner_frame(flag: bool, wrappers: int) -> bool:
        enable_pushdown = flag  # noqa: F841 - read through the frame
        return _nested(wrappers)

    assert planner_frame(False, 0) is True
    assert planner_frame(True, 0) is False
    deepest = pyspark_compat.PUSHDOWN_SEARCH_DEPTH - 1    # frames between the reader and the planner
    assert planner_frame(False, deepest - 1) is True
    assert planner_frame(False, deepest) is False           # too far up: not this planner's
    assert _reader() is False                               # no planner local: the pushdown planner


def test_the_session_keeps_its_jvm_in_an_attribute():
    tree = ast.parse(textwrap.dedent(inspect.getsource(spark_session.SparkSession.__init__)))
    assigned = [t for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Attribute) and t.attr == "_jvm"]
    assert assigned, "SparkSession.__init__ no longer sets self._jvm"


class _Jvm:
    def __init__(self, has_delta: bool) -> None:
        self.has_delta = has_delta
        self.java = self
        self.lang = self
        self.Thread = self
        self.Class = self

    def currentThread(self) -> Any:  # noqa: N802 - Java's names
        return self

    def getContextClassLoader(self) -> Any:  # noqa: N802
        return None

    def forName(self, name: str, init: bool, loader: Any) -> Any:  # noqa: N802
        if not self.has_delta:
            raise RuntimeError(f"ClassNotFoundException: {name}")
        return name


def test_session_jvm_and_the_delta_jars_probe():
    class Session:
        def __init__(self, jvm: Any) -> None:
            self._jvm = jvm

    assert pyspark_compat.session_jvm(object()) is None        # Spark Connect: no JVM view
    assert delta_jars_available(Session(_Jvm(True))) is True   # type: ignore[arg-type]
    assert delta_jars_available(Session(_Jvm(False))) is False  # type: ignore[arg-type]
    assert delta_jars_available(Session(None)) is False        # type: ignore[arg-type]
    assert delta_jars_available(object()) is False              # type: ignore[arg-type]


def test_schema_conversions_give_the_types_spark_expects():
    got = pyspark_compat.arrow_schema_of(LEDGER_SCHEMA)
    assert got == pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary())])
    back = pyspark_compat.spark_schema_of(pa.schema([("t", pa.timestamp("us", "UTC")), *got]))
    assert back.simpleString() == "struct<t:timestamp,ledger_id:bigint,entry_id:bigint,payload:binary>"
