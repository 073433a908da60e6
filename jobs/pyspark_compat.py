"""Every reliance of jobs/ on PySpark beyond its public API, with why no public API does it.

Nothing else in jobs/ touches PySpark's private names; tests/unit/test_pyspark_compat.py checks
each assumption below against the pinned pyspark (4.3.0), so an upgrade that breaks one fails a
fast unit test instead of a Spark job.

1. ``pushdown_refused()``: whether PySpark plans the read being built with filter pushdown off.
   With ``spark.sql.python.filterPushdown.enabled`` false (the default) PySpark refuses any
   reader whose class overrides ``pushFilters`` (DATA_SOURCE_PUSHDOWN_DISABLED) instead of just
   not calling it, so ``DataSource.reader()`` must know the flag to offer pushdown only when it
   is on. No public API tells it: ``reader()`` gets only the schema, the options carry no confs,
   and it runs in PySpark's planner worker (pyspark/sql/worker/plan_data_source_read.py,
   ``_main``), a Python process with no SparkSession or JVM gateway to ask for the conf. That
   planner reads the flag into its local ``enable_pushdown`` before it calls ``reader()``; this
   walks up from the caller to the first frame with that local. PySpark's pushdown planner
   (data_source_pushdown_filters.py) has no such local and runs only when pushdown is on, so no
   local found means "not refused". Were an upgrade to drop or rename the local, every read in
   a default session would fail with DATA_SOURCE_PUSHDOWN_DISABLED; the unit test fails first.

2. ``session_jvm(spark)``: the Py4J view of the driver's JVM (``SparkSession._jvm``), used only
   to ask whether the Delta Lake jars are on the classpath (jobs/delta_read.py). Spark has no
   public call for "can this session load class X"; probing ``format("delta").load()`` would
   have to tell a missing source from every other failure by its error text. Absent (Spark
   Connect, a renamed attribute) means "no jars", and reads fall back to the snapshot's file
   list, which is always correct.

3. ``arrow_schema_of`` / ``spark_schema_of``: Spark <-> Arrow schema conversion from
   ``pyspark.sql.pandas.types``, public names but not in PySpark's API reference. A Python data
   source must yield batches in exactly the Arrow schema Spark derives from the declared one, and
   these are the functions PySpark itself derives it with.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

PUSHDOWN_LOCAL = "enable_pushdown"   # plan_data_source_read._main's local holding the conf
PUSHDOWN_SEARCH_DEPTH = 4            # frames above the caller searched for it


def pushdown_refused() -> bool:
    """Whether the planner that called our caller (a ``DataSource.reader``) has pushdown off."""
    frame = sys._getframe(1)
    for _ in range(PUSHDOWN_SEARCH_DEPTH):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return False
        if PUSHDOWN_LOCAL in frame.f_locals:
            return frame.f_locals[PUSHDOWN_LOCAL] is False
    return False


def session_jvm(spark: SparkSession) -> Any:
    """The session's Py4J JVM view, or None where there is none (Spark Connect)."""
    return getattr(spark, "_jvm", None)


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of batches declared as ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def spark_schema_of(schema: pa.Schema) -> StructType:
    """A Spark schema for Arrow ``schema`` (timestamps as TIMESTAMP, not TIMESTAMP_NTZ)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)
