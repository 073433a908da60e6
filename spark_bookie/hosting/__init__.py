"""Bookies inside Spark executors: the long-running application's driver (`driver`) and the slot
task each executor runs (`slots`). `jobs/bookie_cluster.py` is the spark-submit entry."""
