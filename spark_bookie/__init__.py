"""The bookie (`server/`, `storage/`) and, above it, the tools: Spark hosting (`hosting/`), the local
sandbox and embedded ZooKeeper (`local/`), benchmarks (`bench/`), the Marathon renderer (`deploy/`)
and the command line (`cli/`). See the README's layout table for who may import whom."""

from ledger_client.protocol.grpc_setup import prepare_grpc

prepare_grpc()  # before the bookie loads grpc (ledger_client/protocol/grpc_setup.py)
