"""The admin server of each kind of long-running process, wired to what that process runs."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from spark_bookie.http.routes import AdminContext, build_routes
from spark_bookie.http.security import redacted, token_guard
from spark_bookie.http.server import AdminServer
from spark_bookie.server.tls import socket_context

if TYPE_CHECKING:
    from ledger_client import ClientConfig
    from recovery import AutoRecovery
    from spark_bookie.server.bookie import Bookie
    from spark_bookie.server.config import BookieConfig

log = logging.getLogger(__name__)


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
    cfg = bookie.config
    config = redacted({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra"})
    ctx = AdminContext(cfg.zk_connect, registry, bookie=bookie, autorecovery=autorecovery, config=config,
                       client_config=_client_config(cfg), verifier=bookie.token_verifier)
    guard = token_guard(bookie.token_verifier) if bookie.token_verifier is not None else None
    tls = socket_context(cfg)   # the gRPC port's certificate and rules serve the admin port too
    server = AdminServer(host or cfg.host, port, build_routes(ctx), registry, guard, tls)
    return ProcessAdmin(server.start(), ctx)


def _client_config(cfg: BookieConfig) -> ClientConfig | None:
    """The credentials the admin API's own ledger client presents: the bookie's client_conf, or
    its zk_auth alone (OSError-free: a bad file was refused when autorecovery or start read it)."""
    from ledger_client import ClientConfig

    if cfg.client_conf:
        return ClientConfig.from_toml(cfg.client_conf)
    return ClientConfig(zk_auth=cfg.zk_auth) if cfg.zk_auth else None


def serve_autorecovery(ar: AutoRecovery, port: int, host: str = "127.0.0.1") -> ProcessAdmin:
    """Serve an autorecovery process's /metrics and admin API."""
    from recovery.metrics import autorecovery_registry

    registry = autorecovery_registry(ar, CollectorRegistry(auto_describe=True))
    config = {f.name: getattr(ar.config, f.name) for f in dataclasses.fields(ar.config)}
    ctx = AdminContext(ar.zk_connect, registry, autorecovery=ar, config=config)
    server = AdminServer(host, port, build_routes(ctx), registry)
    return ProcessAdmin(server.start(), ctx)


class _DriverCollector(Collector):
    """The Spark-hosted cluster as its driver sees it (the health record `cluster status` prints),
    read from ZooKeeper at scrape time."""

    def __init__(self, health: Callable[[], dict[str, Any]]) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            h = self._health()
        except Exception as e:  # ZooKeeper away: this scrape has no cluster figures
            log.debug("cluster health unavailable: %s", e)
            return
        yield GaugeMetricFamily("bookie_cluster_BOOKIES_WANTED", "Bookie slots the application hosts",
                                value=float(h["bookies_wanted"]))
        yield GaugeMetricFamily("bookie_cluster_SLOTS_SERVING", "Slots whose bookie serves",
                                value=float(h["slots_serving"]))
        yield GaugeMetricFamily("bookie_cluster_WRITABLE_BOOKIES", "Bookies registered writable (whole cluster)",
                                value=float(len(h["writable"])))
        yield GaugeMetricFamily("bookie_cluster_READONLY_BOOKIES", "Bookies registered read-only (whole cluster)",
                                value=float(len(h["readonly"])))
        yield CounterMetricFamily("bookie_cluster_JOB_RESUBMITS", "Times the hosting job was resubmitted",
                                  value=float(h.get("resubmits", 0)))


def serve_driver(zk_connect: str, port: int, host: str, *, health: Callable[[], dict[str, Any]],
                 ready: Callable[[], bool], autorecovery: AutoRecovery | None,
                 config: Mapping[str, object]) -> ProcessAdmin:
    """Serve the Spark cluster driver's /metrics (cluster figures, its auditor's) and admin API;
    /api/v1/bookie/is_ready answers 200 while the hosting job runs (Marathon's health check)."""
    from recovery.metrics import autorecovery_registry

    registry = CollectorRegistry(auto_describe=True)
    registry.register(_DriverCollector(health))
    if autorecovery is not None:
        autorecovery_registry(autorecovery, registry)
    ctx = AdminContext(zk_connect, registry, autorecovery=autorecovery, config=config, ready=ready)
    server = AdminServer(host, port, build_routes(ctx), registry)
    return ProcessAdmin(server.start(), ctx)
