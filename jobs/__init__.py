"""Spark entry points and integration (bookie-cluster application, ledger source, Delta compaction)."""

from ledger_client.protocol.grpc_setup import prepare_grpc

prepare_grpc()  # before the jobs load grpc (ledger_client/protocol/grpc_setup.py)
