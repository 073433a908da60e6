"""Connections to single bookies (the per-bookie transport under the ledger client)."""

from .bookie_client import AddCallback, BookieClient, status_error

__all__ = ["AddCallback", "BookieClient", "status_error"]
