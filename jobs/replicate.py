"""Replication across clusters as one Structured Streaming query (DESIGN §4.12, invariant 13).

    spark-bookie replicate --from ZK_A --to ZK_B --streams "payments/*" --checkpoint DIR

The query reads cluster A's streams with the ``ledger`` source (records by DLSN, new streams that
match the glob picked up at each trigger) and writes them with the per-row ``ledger`` sink into
the streams of the same names on B (jobs/stream_fanout.py). The source plans each batch as spans
and the sink's tasks read and write the records themselves (jobs/stream_copy.py), so no record
crosses Spark's JVM. Each micro-batch is linked once per stream (the query id and batch id
recorded with the link), and each linked segment carries the source positions it copies, so a
replica is always a prefix of its source, whatever restarts, replays and failures happen. Spark's
checkpoint (``DIR/spark``) is where a restart resumes; a replicator given a new checkpoint resumes
each stream where its replica ends (ledger_client/stream/replica.replicated_through), and linking
would refuse a copy twice anyway.

The source moves a subscription per stream (``replicate-<id>``) with each batch: the lag in records
is that subscription's backlog, and a namespace with ``retain_until_consumed`` keeps what the
replicator has not copied. Beside the query, a monitor thread (jobs/replication_monitor.py)
publishes the lag on ``/metrics``, writes ``DIR/status.json`` for ``replicate status``, and
carries truncation and end-of-stream over.

What the replication is, and its checkpoint's layout: jobs/replication_config.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from jobs.replication_config import SPARK_DIR, ReplicationConfig, prepared

if TYPE_CHECKING:
    from ledger_client import LedgerClient

log = logging.getLogger(__name__)


def resume_offsets(cfg: ReplicationConfig, source: LedgerClient, target: LedgerClient) -> dict[str, str]:
    """A new checkpoint's starting offsets: each source stream whose replica already holds copies
    of it resumes just after the last one (the rest start at their beginning; a replica of a source
    stream deleted and created again since then is refused by linking, with what to do)."""
    from jobs.replication_monitor import matching_streams
    from ledger_client import errors
    from ledger_client.stream.replica import replicated_through

    out: dict[str, str] = {}
    for ns, name in matching_streams(cfg, source):
        try:
            ctime = source.namespace(ns).view(name).meta.ctime_ms
            through = replicated_through(target.namespace(ns), name, ctime)
        except (errors.NoSuchNamespaceError, errors.NoSuchStreamError):
            continue
        if through is not None:
            out[f"{ns}/{name}"] = f"{through.segment}/{through.entry_id}/{through.slot + 1}"
    return out


def spark_session(cfg: ReplicationConfig) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.master(cfg.master).appName("spark-bookie-replicate")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"]).getOrCreate())


def start_query(spark: Any, cfg: ReplicationConfig, starting: dict[str, str]) -> Any:
    """The replication query: A's records (with their positions) into B's streams of the same name."""
    reader = (spark.readStream.format("ledger").option("zk", cfg.from_zk).option("streams", cfg.streams)
              .option("subscription", cfg.subscription)
              .option("max_records_per_trigger", str(cfg.max_records_per_trigger))
              .option("min_partitions", str(cfg.min_partitions)).option("rows", "spans"))
    if starting:
        reader = reader.option("startingOffsets", json.dumps(starting))
    if cfg.from_client_conf:
        reader = reader.option("client_conf", cfg.from_client_conf)
    rows = reader.load()   # one row per span: the sink's tasks copy the records (jobs/stream_copy.py)
    writer = (rows.writeStream.format("ledger").option("zk", cfg.to_zk).option("source_zk", cfg.from_zk)
              .option("checkpointLocation", str(cfg.dir / SPARK_DIR)).queryName("replicate")
              .trigger(processingTime=f"{cfg.trigger_interval_ms} milliseconds"))
    if cfg.to_client_conf:
        writer = writer.option("client_conf", cfg.to_client_conf)
    if cfg.from_client_conf:
        writer = writer.option("source_client_conf", cfg.from_client_conf)
    return writer.start()


def _stop_on_signals() -> threading.Event:
    """SIGTERM and SIGINT end the replication between two checks (the query stops cleanly)."""
    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
    return stopping


PERMANENT_ERRORS = ("UnauthorizedAccessError", "IncorrectParameterError", "TransactionIdOutOfOrderError",
                    "NoSuchNamespaceError", "EndOfStreamError", "InvalidMetadataError", "PositionPastEndError")
"""Failures a restart cannot cure (credentials, input, a replica that is not a copy): the
replicator stops with them. Any other failure (a cluster unreachable, a bookie lost mid-batch,
a ZooKeeper session gone) restarts the query on its checkpoint after a back-off."""
RESTART_DELAY_S = (1.0, 30.0)   # back-off between restarts: from, up to (doubling)


_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+Error): ", re.M)   # a traceback's last line: "mod.NameError: message"


def permanent(error: BaseException) -> bool:
    """Whether the query's error (a Python traceback inside Spark's) was one of PERMANENT_ERRORS."""
    return any(m.group(1) in PERMANENT_ERRORS for m in _RAISED.finditer(str(error)))


def error_line(error: BaseException) -> str:
    """The query's error on one line: the last error a Python traceback inside Spark's raised
    ("IncorrectParameterError: stream pay/x: cannot link: ..."), else the error's first line."""
    text = str(error).strip()
    raised = [line.strip() for line in text.splitlines() if _RAISED.match(line.strip())]
    if raised:
        return re.sub(r"^(?:[\w.]+\.)?(\w+Error: )", r"\1", raised[-1])
    return text.splitlines()[0] if text else type(error).__name__


def run(cfg: ReplicationConfig, ready: Any = None) -> int:
    """Run the replication until SIGTERM/SIGINT, or until the query fails for a reason a restart
    cannot cure (then that error is raised). ``ready(port)`` is called once the query and the
    metrics run (the port /metrics is served on, or None)."""
    from jobs.replication_monitor import Monitor

    cfg = prepared(cfg)
    source, target = cfg.source(), cfg.target()
    try:
        fresh = not (cfg.dir / SPARK_DIR / "offsets").exists()
        starting = resume_offsets(cfg, source, target) if fresh else {}
        if starting:
            log.info("new checkpoint: streams resume where their replicas end: %s", starting)
        monitor = Monitor(cfg, source, target, None)
        monitor.serve()
        spark = spark_session(cfg)
        monitor.query = start_query(spark, cfg, starting)
        monitor.start()
        stopping = _stop_on_signals()
        try:
            if ready is not None:
                ready(monitor.port)
            _supervise(spark, cfg, monitor, stopping)
        finally:
            monitor.stop()
            if monitor.query.isActive:
                monitor.query.stop()
        return 0
    finally:
        source.close()
        target.close()


def _supervise(spark: Any, cfg: ReplicationConfig, monitor: Any, stopping: threading.Event) -> None:
    """Wait on the query; restart it on its checkpoint when it fails for a reason that may pass
    (back-off doubling from 1 s to 30 s, reset once a restarted query commits a batch)."""
    delay = RESTART_DELAY_S[0]
    while not stopping.is_set():
        query = monitor.query
        while query.isActive and not stopping.is_set():
            try:
                query.awaitTermination(1)
            except Exception:   # it failed: awaitTermination raises what query.exception() returns
                break
            if query.lastProgress is not None:
                delay = RESTART_DELAY_S[0]
        error = query.exception()
        if stopping.is_set() or error is None:
            return
        if permanent(error):
            raise error
        monitor.restarts.inc()
        log.warning("the replication query stopped (%s): restarting on its checkpoint in %.0f s", error_line(error),
                    delay)
        if stopping.wait(delay):
            return
        delay = min(RESTART_DELAY_S[1], delay * 2)
        monitor.query = start_query(spark, cfg, {})
