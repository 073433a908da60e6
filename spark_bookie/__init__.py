"""The bookie (`server/`, `storage/`) and, above it, the tools: Spark hosting (`hosting/`), the local
sandbox and embedded ZooKeeper (`local/`), benchmarks (`bench/`), the Marathon renderer (`deploy/`)
and the command line (`cli/`). See the README's layout table for who may import whom."""

import ledger_client.protocol  # noqa: F401  (first: sets gRPC's fork mode before grpc loads)
