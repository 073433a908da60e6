"""How far each replicated stream is behind, and the source's truncation and end carried over
(DESIGN §4.12). Runs beside the replication query in the driver (jobs/replicate.py); no Spark here.

Each pass, per source stream the globs match:

- ``lag_records``: the backlog of the replicator's subscription on the source (exact, from segment
  metadata: ledger_client/stream/subscriptions.py); the source's records in all before the
  replicator's first batch commits it.
- ``lag_seconds``: how long the oldest record not yet replicated may have been there: the time since
  the last pass that found the source's end at or before the replicated position (so at most one
  pass more than the truth, never less; counted from the replicator's start for a backlog found
  there).
- truncation: once the replica holds a copy of the source's first kept record (or everything), it
  is truncated the same way (ledger_client/stream/replica.carry_truncation).
- end of stream: once the source ended and the replica holds all of it, the replica ends.

Published on ``/metrics`` (``replication_lag_records{stream}``, ``replication_lag_seconds{stream}``,
``replication_streams``) and in ``DIR/status.json``, which ``spark-bookie replicate status`` reads.
A failing pass (a cluster unreachable, say) is logged and the next one tries again: the gauges
keep their last values and ``replication_monitor_failures_total`` counts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from jobs.replication_config import STATUS_FILE, ReplicationConfig
from ledger_client.stream.dlsn import DLSN

if TYPE_CHECKING:
    from ledger_client import LedgerClient

log = logging.getLogger(__name__)

RECENT_BATCHES = 20   # the query's last batches in status.json (rows and time each)


@dataclass(frozen=True)
class StreamState:
    """One stream as a pass found it (positions as "segment/entry/slot" strings, for JSON)."""

    stream: str
    replicated_through: str | None     # the last source position the replica holds
    source_last: str | None            # the source's last record
    lag_records: int
    source_truncated_before: str | None
    replica_truncated_before: str | None
    source_ended: bool
    replica_ended: bool
    lag_seconds: float | None = None


def _s(pos: Any) -> str | None:
    return None if pos is None else str(DLSN(*pos))


def observe(cfg: ReplicationConfig, source: LedgerClient, target: LedgerClient, ns: str, name: str) -> StreamState:
    """One stream's state, read now from both clusters."""
    from ledger_client import errors
    from metadata.streams import linking

    src = source.namespace(ns)
    info = src.stream_info(name)
    sub = src.subscriptions(name).get(cfg.subscription)
    lag = sub.backlog_records if sub is not None else sum(s.record_count for s in info.segments)
    try:
        view = target.namespace(ns).view_if_any(name)
    except errors.NoSuchNamespaceError:
        view = None
    through = linking.replicated_through(view) if view is not None else None
    return StreamState(f"{ns}/{name}", _s(through), _s(info.last_dlsn), lag, _s(info.truncated_before),
                       _s(view.meta.truncated_before) if view is not None else None, info.end_of_stream,
                       bool(view is not None and view.meta.end_of_stream))


def matching_streams(cfg: ReplicationConfig, source: LedgerClient) -> list[tuple[str, str]]:
    from jobs.options import StreamSourceOptions
    from jobs.stream_source import resolve_streams

    return resolve_streams(source, StreamSourceOptions.parse({"zk": cfg.from_zk, "streams": cfg.streams}),
                           strict=False)


class LagClock:
    """``lag_seconds`` per stream: an upper bound on the age of the oldest record not yet replicated.

    Each pass notes the source's end. A record past what is replicated was written after the last
    pass that found the end at or before the replicated position, so its age is at most the time
    since that pass: one monitor interval over the true age at most, never under it (an alert on
    the gauge does not miss a lag). With no such pass (a backlog found at start) it counts from the
    first pass that found the end."""

    def __init__(self) -> None:
        self._seen: dict[str, list[list[Any]]] = {}   # per stream: [first seen, last seen, end], oldest first

    def lag(self, key: str, now: float, source_last: DLSN | None, lag_records: int,
            through: DLSN | None) -> float:
        seen = self._seen.setdefault(key, [])
        if source_last is not None:
            if seen and seen[-1][2] == source_last:
                seen[-1][1] = now
            else:
                seen.append([now, now, source_last])
        if lag_records == 0:
            seen[:] = seen[-1:]
            return 0.0
        copied = [i for i, (_f, _l, end) in enumerate(seen) if through is not None and end <= through]
        if copied:
            del seen[:copied[-1]]   # older ends than the newest one copied tell nothing more
        if not seen or (through is not None and seen[-1][2] <= through):
            return 0.0
        since = seen[0][1] if copied else seen[0][0]
        return round(now - since, 3)


class Monitor:
    """The monitor thread and its /metrics server (started by ``start``, ended by ``stop``)."""

    def __init__(self, cfg: ReplicationConfig, source: LedgerClient, target: LedgerClient, query: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.cfg, self.source, self.target, self.query = cfg, source, target, query
        self.registry = CollectorRegistry()
        self.lag_records = Gauge("replication_lag_records", "Source records not yet replicated", ["stream"],
                                 registry=self.registry)
        self.lag_seconds = Gauge("replication_lag_seconds", "Age of the oldest source record not yet replicated",
                                 ["stream"], registry=self.registry)
        self.streams = Gauge("replication_streams", "Source streams the replication copies", registry=self.registry)
        self.failures = Counter("replication_monitor_failures", "Monitor passes that failed", registry=self.registry)
        self.restarts = Counter("replication_query_restarts", "Times the query failed and was restarted on its "
                                "checkpoint", registry=self.registry)
        self.clock = LagClock()
        self.port: int | None = None
        self._server: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="replication-monitor", daemon=True)
        self._carried: dict[str, str] = {}

    def serve(self) -> None:
        """Serve /metrics (before the query starts: a port in use is a clear error, not a query
        left running)."""
        if self.cfg.metrics_port < 0:
            return
        from prometheus_client import start_http_server

        from ledger_client.errors import IncorrectParameterError

        try:
            self._server, _ = start_http_server(self.cfg.metrics_port, self.cfg.metrics_host, registry=self.registry)
        except OSError as e:
            raise IncorrectParameterError(f"cannot serve /metrics on {self.cfg.metrics_host}:{self.cfg.metrics_port} "
                                          f"({e.strerror or e}): give another --metrics-port, 0 for any") from e
        self.port = self._server.server_port
        log.info("replication metrics on http://%s:%d/metrics", self.cfg.metrics_host, self.port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._server is not None:
            self._server.shutdown()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.pass_once()
            except Exception as e:   # a cluster away for a while: the next pass tries again
                self.failures.inc()
                log.warning("replication monitor pass failed: %s", e)
            self._stop.wait(self.cfg.monitor_interval_ms / 1000)

    def pass_once(self) -> list[StreamState]:
        now = time.time()
        states = []
        for ns, name in matching_streams(self.cfg, self.source):
            st = observe(self.cfg, self.source, self.target, ns, name)
            self._carry(st, ns, name)
            through = DLSN.parse(st.replicated_through) if st.replicated_through else None
            last = DLSN.parse(st.source_last) if st.source_last else None
            st = StreamState(**{**asdict(st), "lag_seconds": self.clock.lag(st.stream, now, last, st.lag_records,
                                                                             through)})
            self.lag_records.labels(st.stream).set(st.lag_records)
            self.lag_seconds.labels(st.stream).set(st.lag_seconds or 0.0)
            states.append(st)
        self.streams.set(len(states))
        write_status(self.cfg, states, self._query_progress())
        return states

    def _carry(self, st: StreamState, ns: str, name: str) -> None:
        from ledger_client.stream.replica import carry_end, carry_truncation

        if st.replicated_through is None and st.lag_records:
            return   # no replica yet
        tb = st.source_truncated_before
        if tb is not None and self._carried.get(st.stream) != tb and (
                st.lag_records == 0 or (st.replicated_through is not None
                                        and DLSN.parse(st.replicated_through) >= DLSN.parse(tb))):
            carry_truncation(self.source.namespace(ns), self.target.namespace(ns), name, DLSN.parse(tb))
            self._carried[st.stream] = tb
        if st.source_ended and st.lag_records == 0 and not st.replica_ended and st.replicated_through is not None:
            carry_end(self.target.namespace(ns), name)

    def _query_progress(self) -> dict[str, Any]:
        try:
            p = self.query.lastProgress
            recent = [{"batch": r.get("batchId"), "rows": r.get("numInputRows"),
                       "trigger_ms": (r.get("durationMs") or {}).get("triggerExecution"),
                       "duration_ms": r.get("durationMs")}
                      for r in self.query.recentProgress[-RECENT_BATCHES:]]
            return {"id": str(self.query.id), "batch": p.get("batchId") if p else None,
                    "input_rows_per_second": p.get("inputRowsPerSecond") if p else None,
                    "rows": p.get("numInputRows") if p else None, "duration_ms": p.get("durationMs") if p else None,
                    "recent": recent}
        except Exception as e:   # the query is stopping
            return {"error": str(e)}


def write_status(cfg: ReplicationConfig, states: list[StreamState], query: dict[str, Any]) -> None:
    """``DIR/status.json``, replaced whole (a reader never sees half of it)."""
    doc = {"updated_ms": int(time.time() * 1000), "pid": os.getpid(), "query": query,
           "streams": {s.stream: asdict(s) for s in states}}
    tmp = cfg.dir / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, cfg.dir / STATUS_FILE)
