"""The HTTP admin server of long-running processes (bookie, autorecovery): Prometheus' /metrics,
/heartbeat and BookKeeper's admin API under /api/v1/ (DESIGN.md §4.7, docs/operations.md)."""

from spark_bookie.http.params import ApiError
from spark_bookie.http.routes import AdminContext
from spark_bookie.http.server import AdminServer, start_admin_server

__all__ = ["AdminContext", "AdminServer", "ApiError", "start_admin_server"]
