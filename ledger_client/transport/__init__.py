"""Connections to single bookies (the per-bookie transport under the ledger client)."""

from .bookie_client import TRANSPORT_FAILURE, AddSink, BookieClient, StreamLimits, rpc_error, status_error

__all__ = ["TRANSPORT_FAILURE", "AddSink", "BookieClient", "StreamLimits", "rpc_error", "status_error"]
