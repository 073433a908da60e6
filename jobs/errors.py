"""Every exception the Spark integration raises on purpose (compaction, Delta read-back).

The ledger source itself reports bad options as ledger_client errors or ValueError, which Spark
shows to the user unchanged.
"""

from __future__ import annotations


class CompactionError(Exception):
    """Compaction could not run or could not commit; nothing was committed by this run."""


class BadArgumentError(CompactionError):
    """Bad input: a malformed ledger list, an unknown partitioning, a non-positive limit."""


class TableMismatchError(BadArgumentError):
    """The table exists with another schema or partitioning than this compaction writes."""


class ConcurrentCompactionError(CompactionError):
    """Another run committed some of the same ledgers first; this run's files stay uncommitted."""


class DeltaReadError(Exception):
    """The table cannot be read correctly this way (a reader feature plain parquet cannot honour)."""
