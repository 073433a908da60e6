"""Connections to single bookies (the per-bookie transport under the ledger client)."""

from .add_stream import TRANSPORT_FAILURE, AddSink, StreamLimits
from .bookie_client import BookieClient, rpc_error, status_error

__all__ = ["TRANSPORT_FAILURE", "AddSink", "BookieClient", "StreamLimits", "rpc_error", "status_error"]
