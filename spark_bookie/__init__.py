"""The bookie: storage server, journal, storage, ZooKeeper registration, CLI and Spark hosting."""

import ledger_client as _ledger_client  # noqa: F401  (first: sets gRPC's fork mode before grpc loads)
