"""`spark-bookie bench`: one module per benchmark, each measured against a baseline in the same
run; the host's floors (round trips, fdatasync, steal) in `host`."""
