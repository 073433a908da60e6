"""The admin server of each kind of long-running process, wired to what that process runs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from spark_bookie.http.routes import AdminContext, build_routes
from spark_bookie.http.server import AdminServer

if TYPE_CHECKING:
    from recovery import AutoRecovery
    from spark_bookie.server.bookie import Bookie


class ProcessAdmin:
    """An AdminServer and the context it answers from (closed together)."""

    def __init__(self, server: AdminServer, ctx: AdminContext) -> None:
        self.server = server
        self.ctx = ctx

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        self.ctx.close()


def serve_bookie(bookie: Bookie, port: int, autorecovery: AutoRecovery | None = None,
                 host: str | None = None) -> ProcessAdmin:
    """Serve a started bookie's /metrics and admin API (and its autorecovery daemon's metrics,
    when it runs one) on ``port`` of ``host`` (default: the bookie's own address). OSError when
    the port cannot be bound."""
    from recovery.metrics import autorecovery_registry

    registry = bookie.registry
    if autorecovery is not None:
        autorecovery_registry(autorecovery, registry)
    config = {f.name: getattr(bookie.config, f.name) for f in dataclasses.fields(bookie.config) if f.name != "extra"}
    ctx = AdminContext(bookie.config.zk_connect, registry, bookie=bookie, autorecovery=autorecovery, config=config)
    server = AdminServer(host or bookie.config.host, port, build_routes(ctx), registry)
    return ProcessAdmin(server.start(), ctx)


def serve_autorecovery(ar: AutoRecovery, port: int, host: str = "127.0.0.1") -> ProcessAdmin:
    """Serve an autorecovery process's /metrics and admin API."""
    from recovery.metrics import autorecovery_registry

    registry = autorecovery_registry(ar, CollectorRegistry(auto_describe=True))
    config = {f.name: getattr(ar.config, f.name) for f in dataclasses.fields(ar.config)}
    ctx = AdminContext(ar.zk_connect, registry, autorecovery=ar, config=config)
    server = AdminServer(host, port, build_routes(ctx), registry)
    return ProcessAdmin(server.start(), ctx)
