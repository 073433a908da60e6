"""Re-replication (auditor, replication workers, decommission): the autorecovery issue builds this."""
