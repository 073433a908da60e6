"""Spark entry points and integration (bookie-cluster application, ledger source, Delta compaction)."""
