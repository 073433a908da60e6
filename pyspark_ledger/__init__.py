"""The ``ledger`` Spark data source, found by PySpark 4 without a registration call.

PySpark discovers installed ``pyspark_*`` modules that define ``DefaultSource`` when a session
starts; this module only re-exports the real source from :mod:`jobs`.
"""

from jobs.ledger_source import LedgerDataSource as DefaultSource

__all__ = ["DefaultSource"]
