"""The driver of the Spark-hosted bookie cluster (`spark-submit jobs/bookie_cluster.py`, DESIGN §4.4).

The driver

- configures Spark for a long-running service: speculation and dynamic allocation off (a second
  copy of a slot task would fight over the slot; a released executor would take its bookie along),
  ``spark.task.maxFailures`` high (every executor loss fails the slot's task once), Python workers
  never killed for being idle (``spark.python.worker.killOnIdleTimeout=false``), and the Python
  worker daemon kept (workers are forked from it; grpc is only imported in the task);
- submits the **hosting stage** in a background thread: one plain (non-barrier) task per slot, each
  running :func:`spark_bookie.hosting.slots.run_slot`. A barrier stage would abort the whole job when one
  executor dies; a plain task is retried on the next free executor and its bookie is back in
  seconds. When Spark gives up anyway (``maxFailures`` reached, job aborted), the driver resubmits;
- runs the **auditor** (``recovery.AutoRecovery(run_auditor=True, run_worker=False)``), elected
  like any other candidate, so a second driver or a standalone ``spark-bookie autorecovery`` takes
  over when this one goes; the executors run the replication workers;
- ships each executor host's **network location** (``--rack-map``/``--network-location``) to the
  slot tasks, which publish it in their bookie's registration for rack-aware placement;
- **reports health** (slots serving, bookies writable/read-only, under-replicated ledgers, who is
  auditor) every ``--health-interval-s`` in its log and in ZooKeeper, where
  ``spark-bookie cluster status`` reads it;
- **stops cleanly** on SIGTERM/SIGINT or on ``spark-bookie cluster stop``: it writes the stop
  request that every slot task watches, waits for the tasks to stop their bookies gracefully and
  return, then stops the auditor and Spark.

Coordination lives under ``<root>/apps/spark/<name>/`` (``driver``, ``stop``, ``health``,
``slots/<k>``), in the cluster's own ZooKeeper.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from functools import partial
from types import FrameType
from typing import Any

from metadata import MetadataError, MetadataStore
from metadata import connect as connect_metadata
from spark_bookie.errors import ConfigError, StartupError
from spark_bookie.hosting.config import ClusterAppConfig, add_arguments, config_from_args, spark_conf_pairs
from spark_bookie.hosting.health import cluster_health, health_line
from spark_bookie.hosting.slots import (
    STOPPED,
    app_key,
    decode_status,
    read_slot_statuses,
    request_stop,
    run_slot,
)

log = logging.getLogger(__name__)

JOB_GROUP = "spark-bookie-hosting"


# ---------------------------------------------------------------------- the application

class BookieClusterApp:
    """One driver run: `run()` blocks until stopped and returns the process exit code."""

    def __init__(self, cfg: ClusterAppConfig, tier_step: Any = None) -> None:
        self.cfg = cfg
        self._tier_step = tier_step  # recovery.TierStep: the auditor tiers old segments (jobs/stream_tiering.py)
        self.name = cfg.hosting.name
        self._stop = threading.Event()
        self._stop_reason = ""
        self._sc: Any = None
        self._app_id: str | None = None
        self._store: MetadataStore | None = None
        self._recovery: Any = None
        self._admin: Any = None  # spark_bookie.http's server when --http-port is given
        self._hosting_thread: threading.Thread | None = None
        self._job_running = threading.Event()
        self._claimed = False  # the driver node is ours (never overwrite a live rival's)
        self.resubmits = 0
        self._started_ms = int(time.time() * 1000)

    # -- public ---------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            log.info("stopping the bookie cluster: %s", reason)
        self._stop.set()

    def run(self) -> int:
        self._store = connect_metadata(self.cfg.hosting.zk_connect,
                                       session_timeout_ms=self.cfg.hosting.zk_session_timeout_ms,
                                       zk_auth=self.cfg.hosting.zk_auth(), zk_tls=self.cfg.hosting.zk_tls())
        try:
            self._store.cluster.init_cluster()
            self._claim_name()
            self._sc = self._make_spark_context()
            self._install_signal_handlers()  # after SparkContext: pyspark's SIGINT handler cancels jobs
            self._start_recovery()
            self._start_admin()
            self._hosting_thread = threading.Thread(target=self._host, name="bookie-hosting", daemon=True)
            self._hosting_thread.start()
            self._supervise()
        finally:
            self._shutdown()
        return 0

    # -- start ----------------------------------------------------------------------------
    def _claim_name(self) -> None:
        """Refuse to run beside a live driver of the same name; clear a stop request left over
        from the previous run (tasks must not see it)."""
        store = self._require_store()
        prev = decode_status(store.cluster.get_app_data(app_key(self.name, "driver")))
        age_ms = int(time.time() * 1000) - int(prev.get("heartbeat_ms", 0))
        if prev and prev.get("state") != STOPPED and age_ms < self.cfg.driver_stale_ms:
            raise StartupError(
                f"another driver of bookie cluster {self.name!r} is running ({prev.get('app_id')} on "
                f"{prev.get('host')}, pid {prev.get('pid')}, heartbeat {age_ms} ms ago): stop it first "
                f"(`spark-bookie cluster stop --name {self.name}`) or pick another --name")
        self._claimed = True
        store.cluster.delete_app_data(app_key(self.name, "stop"))
        store.cluster.delete_app_data(app_key(self.name, "slots"))
        self._write_driver_node("starting", app_id=None)

    def _make_spark_context(self) -> Any:
        from pyspark import SparkContext

        sc = SparkContext(conf=self._spark_conf())
        sc.setLogLevel("WARN")
        self._app_id = sc.applicationId
        log.info("Spark %s application %s on %s: hosting %d bookies (slots 0..%d, ports %d..%d)",
                 sc.version, sc.applicationId, sc.master, self.cfg.hosting.bookies, self.cfg.hosting.bookies - 1,
                 self.cfg.hosting.port(0), self.cfg.hosting.port(self.cfg.hosting.bookies - 1))
        return sc

    def _spark_conf(self) -> Any:
        """The application's SparkConf: what spark-submit (--master, --conf, spark-defaults) set
        wins, then the script's own --master and --conf; the hosting job's settings
        (spark_conf_pairs) fill in what nobody set, with a warning where someone set them otherwise.

        The JVM gateway must exist first: a SparkConf made before it is a plain Python dict that
        does not see spark-submit's properties, and the application ran in local mode whatever
        master spark-submit was given (all bookies in the driver's host). Under spark-submit the
        gateway is spark-submit's own JVM; under plain python this starts one, as PySpark would."""
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # attach to (or start) the JVM gateway
        conf = SparkConf()
        # spark-submit names an application after its script unless given --name: keep ours then.
        if conf.get("spark.app.name", None) in (None, os.path.basename(sys.argv[0])):
            conf.setAppName(self.cfg.app_name)
        if self.cfg.master:
            conf.setMaster(self.cfg.master)
        elif not conf.contains("spark.master"):
            conf.setMaster(f"local[{self.cfg.hosting.bookies}]")
        if conf.get("spark.master", "").startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            os.environ["PYSPARK_PYTHON"] = sys.executable  # executors on this machine: this interpreter
        for k, v in self.cfg.spark_conf:
            conf.set(k, v)
        for k, v in spark_conf_pairs(self.cfg).items():
            if not conf.contains(k):
                conf.set(k, v)
            elif conf.get(k) != v:
                log.warning("Spark setting %s=%s overrides the hosting job's %s: bookies may not survive "
                            "executor failures as documented", k, conf.get(k), v)
        cores = conf.get("spark.executor.cores", None)
        if cores and not conf.contains("spark.task.cpus"):
            conf.set("spark.task.cpus", cores)  # one slot task per executor: one bookie per executor
        return conf

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.request_stop(f"signal {signal.Signals(signum).name}")

        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, handler)

    def _start_recovery(self) -> None:
        if not self.cfg.hosting.autorecovery:
            log.warning("autorecovery is off (--no-autorecovery): lost bookies' ledgers are NOT re-replicated")
            return
        from recovery import AutoRecovery, AutoRecoveryConfig

        settings = dict(self.cfg.hosting.autorecovery_settings)
        self._recovery = AutoRecovery(
            self.cfg.hosting.zk_connect, AutoRecoveryConfig(**settings) if settings else None,
            candidate_id=f"driver:{self.name}@{socket.gethostname()}:{os.getpid()}",
            run_auditor=True, run_worker=False, tier_step=self._tier_step,
            client_config=self.cfg.hosting.client_config())
        self._recovery.start()

    def _start_admin(self) -> None:
        """/metrics and the admin API (is_ready: the hosting job runs), for Prometheus and Marathon."""
        if not self.cfg.http_port:
            return
        import dataclasses

        from spark_bookie.http.process import serve_driver

        config = {f.name: getattr(self.cfg.hosting, f.name) for f in dataclasses.fields(self.cfg.hosting)}
        self._admin = serve_driver(self.cfg.hosting.zk_connect, self.cfg.http_port, self.cfg.http_host,
                                   health=self.health, ready=self._job_running.is_set,
                                   autorecovery=self._recovery, config=config)
        log.info("driver http admin on %s (/metrics, /api/v1/)", self._admin.url)

    # -- the hosting stage ----------------------------------------------------------------
    def _host(self) -> None:
        """Background thread: run the hosting job; resubmit it whenever Spark gives up on it."""
        n = self.cfg.hosting.bookies
        task = partial(run_slot, self.cfg.hosting)
        while not self._stop.is_set():
            try:
                self._sc.setJobGroup(JOB_GROUP, f"spark-bookie: {n} bookies ({self.name})", interruptOnCancel=False)
                rdd = self._sc.parallelize(range(n), n).mapPartitionsWithIndex(task)
                self._job_running.set()
                results = rdd.collect()
                if self._stop.is_set():
                    log.info("hosting job finished: %s", results)
                    return
                log.error("hosting job ended without a stop request (%s); resubmitting", results)
            except Exception as e:
                if self._stop.is_set():
                    return
                log.error("hosting job failed (%s); resubmitting in %g s", _first_line(e),
                          self.cfg.resubmit_delay_ms / 1000)
            finally:
                self._job_running.clear()
            self.resubmits += 1
            self._stop.wait(self.cfg.resubmit_delay_ms / 1000)

    # -- supervision ----------------------------------------------------------------------
    def _supervise(self) -> None:
        """Main thread: poll the stop request, beat, log health, until stopped."""
        next_health = time.monotonic() + min(self.cfg.health_interval_ms / 1000, 5.0)
        next_beat = 0.0
        store = self._require_store()
        while not self._stop.wait(0.5):
            try:
                stop = store.cluster.get_app_data(app_key(self.name, "stop"))
                if stop is not None:
                    req = decode_status(stop)
                    self.request_stop(f"stop requested in ZooKeeper: {req.get('reason')} (by {req.get('by')})")
                    break
                now = time.monotonic()
                if now >= next_beat:
                    self._write_driver_node("running", app_id=self._sc.applicationId)
                    next_beat = now + self.cfg.driver_heartbeat_ms / 1000
                if now >= next_health:
                    self._report_health()
                    next_health = now + self.cfg.health_interval_ms / 1000
            except MetadataError as e:
                log.warning("ZooKeeper unavailable to the driver: %s", e)

    def health(self) -> dict[str, Any]:
        store = self._require_store()
        return cluster_health(store, self.name, self.cfg.hosting.bookies,
                              is_auditor=bool(getattr(self._recovery, "is_auditor", False)),
                              resubmits=self.resubmits)

    def _report_health(self) -> None:
        h = self.health()
        log.info("health: %s", health_line(h))
        self._require_store().cluster.put_app_data(app_key(self.name, "health"), json.dumps(h, sort_keys=True).encode())

    def _write_driver_node(self, state: str, app_id: str | None) -> None:
        node = {"app_id": app_id, "host": socket.gethostname(), "pid": os.getpid(), "state": state,
                "started_ms": self._started_ms, "heartbeat_ms": int(time.time() * 1000),
                "bookies": self.cfg.hosting.bookies, "resubmits": self.resubmits}
        self._require_store().cluster.put_app_data(app_key(self.name, "driver"), json.dumps(node).encode())

    def _require_store(self) -> MetadataStore:
        if self._store is None:
            raise StartupError("the driver's metadata store is not open")
        return self._store

    # -- stop -----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Ask every slot to stop (gracefully), wait for the job to end, then stop the rest."""
        self._stop.set()
        if self._admin is not None:
            self._admin.stop()
        store = self._store
        if store is not None and self._sc is not None:
            try:
                request_stop(store, self.name, self._stop_reason or "driver stopping")
                self._write_driver_node("stopping", app_id=self._sc.applicationId)
            except MetadataError as e:
                log.error("could not publish the stop request (%s): bookies will be killed, not stopped", e)
            self._wait_for_slots(store)
        if self._recovery is not None:
            try:
                self._recovery.stop()
            except Exception:
                log.exception("stopping autorecovery failed")
        if self._sc is not None:
            self._sc.stop()
        if store is not None:
            if self._claimed:
                try:
                    self._write_driver_node(STOPPED, app_id=self._app_id)
                except MetadataError:
                    pass
            store.close()
        log.info("bookie cluster %s stopped", self.name)

    def _wait_for_slots(self, store: MetadataStore) -> None:
        """Wait for the hosting job to end by itself (every task saw the stop request); cancel it
        when only tasks that never started are left, or after ``stop_timeout_ms``."""
        deadline = time.monotonic() + self.cfg.stop_timeout_ms / 1000
        quiet_since: float | None = None
        thread = self._hosting_thread
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.5)
            try:
                statuses = read_slot_statuses(store, self.name).values()
            except MetadataError:
                continue
            # A status that stopped beating belongs to a task that died with its executor; its
            # retry (if any) is pending and will see the stop request if it ever starts.
            stale_ms = int(time.time() * 1000) - 3 * self.cfg.hosting.heartbeat_interval_ms - 2_000
            if all(s.get("state") == STOPPED or int(s.get("heartbeat_ms", 0)) < stale_ms for s in statuses):
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3.0:
                    break  # what is left are tasks still pending on no executor
            else:
                quiet_since = None
        if thread is not None and thread.is_alive():
            log.warning("cancelling the hosting job (tasks left after the stop request)")
            self._sc.cancelJobGroup(JOB_GROUP)
            thread.join(10)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def main(argv: Sequence[str] | None = None, tier_step: Any = None) -> int:
    """``tier_step``: given by jobs/bookie_cluster.py (jobs.stream_tiering.tier_step)."""
    ap = argparse.ArgumentParser(prog="bookie_cluster.py", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        cfg = config_from_args(args)
        return BookieClusterApp(cfg, tier_step).run()
    except (StartupError, ConfigError, MetadataError) as e:
        print(f"bookie_cluster: error: {e}", file=sys.stderr)
        return 2



__all__ = ["BookieClusterApp", "main"]
