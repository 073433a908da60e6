"""The driver of the Spark-hosted bookie cluster (`spark-submit jobs/bookie_cluster.py`, DESIGN §4.4).

The driver

- configures Spark for a long-running service: speculation and dynamic allocation off (a second
  copy of a slot task would fight over the slot; a released executor would take its bookie along),
  ``spark.task.maxFailures`` high (every executor loss fails the slot's task once), Python workers
  never killed for being idle (``spark.python.worker.killOnIdleTimeout=false``), and the Python
  worker daemon kept (workers are forked from it; grpc is only imported in the task);
- submits the **hosting stage** in a background thread: one plain (non-barrier) task per slot, each
  running :func:`spark_bookie.hosting.run_slot`. A barrier stage would abort the whole job when one
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from metadata import MetadataError, MetadataStore
from metadata import connect as connect_metadata

from .config import read_toml_table
from .errors import ConfigError, StartupError
from .hosting import (
    DEFAULT_BASE_PORT,
    DEFAULT_LOCATION_TEMPLATE,
    DEFAULT_NAME,
    SERVING,
    STOPPED,
    HostingConfig,
    app_key,
    decode_status,
    read_slot_statuses,
    request_stop,
    run_slot,
)

log = logging.getLogger(__name__)

JOB_GROUP = "spark-bookie-hosting"


@dataclass(frozen=True)
class ClusterAppConfig:
    hosting: HostingConfig
    master: str | None = None  # None: what spark-submit / spark-defaults say, else local[N]
    app_name: str = "spark-bookie cluster"
    spark_conf: tuple[tuple[str, str], ...] = ()  # the script's --conf k=v (spark-submit's --conf works too)
    task_max_failures: int = 1_000
    resubmit_delay_ms: int = 5_000
    health_interval_ms: int = 10_000
    driver_heartbeat_ms: int = 2_000
    stop_timeout_ms: int = 60_000
    driver_stale_ms: int = 15_000  # another driver of this name counts as alive if it beat this recently


def spark_conf_pairs(cfg: ClusterAppConfig) -> dict[str, str]:
    """The Spark settings of the hosting application (user's ``--conf`` pairs are applied after)."""
    return {
        "spark.speculation": "false",
        "spark.dynamicAllocation.enabled": "false",
        "spark.task.maxFailures": str(cfg.task_max_failures),
        # Spark 4.1+: an idle-timeout kill would take a blocking service task down (FACTS.md).
        "spark.python.worker.killOnIdleTimeout": "false",
        "spark.python.worker.reuse": "true",
        "spark.python.use.daemon": "true",
        # A host that saw executor failures must stay eligible: its slot directories live there.
        "spark.excludeOnFailure.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


# ---------------------------------------------------------------------- the application

class BookieClusterApp:
    """One driver run: `run()` blocks until stopped and returns the process exit code."""

    def __init__(self, cfg: ClusterAppConfig) -> None:
        self.cfg = cfg
        self.name = cfg.hosting.name
        self._stop = threading.Event()
        self._stop_reason = ""
        self._sc: Any = None
        self._app_id: str | None = None
        self._store: MetadataStore | None = None
        self._recovery: Any = None
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
                                       session_timeout_ms=self.cfg.hosting.zk_session_timeout_ms)
        try:
            self._store.init_cluster()
            self._claim_name()
            self._sc = self._make_spark_context()
            self._install_signal_handlers()  # after SparkContext: pyspark's SIGINT handler cancels jobs
            self._start_recovery()
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
        prev = decode_status(store.get_app_data(app_key(self.name, "driver")))
        age_ms = int(time.time() * 1000) - int(prev.get("heartbeat_ms", 0))
        if prev and prev.get("state") != STOPPED and age_ms < self.cfg.driver_stale_ms:
            raise StartupError(
                f"another driver of bookie cluster {self.name!r} is running ({prev.get('app_id')} on "
                f"{prev.get('host')}, pid {prev.get('pid')}, heartbeat {age_ms} ms ago): stop it first "
                f"(`spark-bookie cluster stop --name {self.name}`) or pick another --name")
        self._claimed = True
        store.delete_app_data(app_key(self.name, "stop"))
        store.delete_app_data(app_key(self.name, "slots"))
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
            run_auditor=True, run_worker=False)
        self._recovery.start()

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
                stop = store.get_app_data(app_key(self.name, "stop"))
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
        self._require_store().put_app_data(app_key(self.name, "health"), json.dumps(h, sort_keys=True).encode())

    def _write_driver_node(self, state: str, app_id: str | None) -> None:
        node = {"app_id": app_id, "host": socket.gethostname(), "pid": os.getpid(), "state": state,
                "started_ms": self._started_ms, "heartbeat_ms": int(time.time() * 1000),
                "bookies": self.cfg.hosting.bookies, "resubmits": self.resubmits}
        self._require_store().put_app_data(app_key(self.name, "driver"), json.dumps(node).encode())

    def _require_store(self) -> MetadataStore:
        if self._store is None:
            raise StartupError("the driver's metadata store is not open")
        return self._store

    # -- stop -----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Ask every slot to stop (gracefully), wait for the job to end, then stop the rest."""
        self._stop.set()
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


# ---------------------------------------------------------------------- health

def _underreplication_view(store: MetadataStore) -> tuple[int | None, str | None]:
    """(number of under-replicated ledgers, current auditor); None where it cannot be read."""
    try:
        return len(store.list_underreplicated()), store.current_auditor()
    except MetadataError as e:  # health reporting must never take the driver down
        log.debug("under-replication view unavailable: %s", e)
        return None, None


def cluster_health(store: MetadataStore, name: str, wanted: int, *, is_auditor: bool | None = None,
                   resubmits: int = 0) -> dict[str, Any]:
    """The cluster as the driver sees it (also what `spark-bookie cluster status` prints)."""
    slots = read_slot_statuses(store, name)
    ur, auditor = _underreplication_view(store)
    return {
        "time_ms": int(time.time() * 1000),
        "bookies_wanted": wanted,
        "slots_serving": sum(1 for s in slots.values() if s.get("state") == SERVING),
        "slots": {str(k): {"state": s.get("state"), "bookie_id": s.get("bookie_id"), "error": s.get("error", "")}
                  for k, s in sorted(slots.items())},
        "writable": store.list_bookies(),
        "readonly": store.list_bookies(readonly=True),
        "under_replicated": ur,
        "auditor": auditor,
        "driver_is_auditor": is_auditor,
        "resubmits": resubmits,
    }


def health_line(h: dict[str, Any]) -> str:
    failed = {k: s["error"] for k, s in h["slots"].items() if s.get("error")}
    ur = "?" if h.get("under_replicated") is None else h["under_replicated"]
    line = (f"{h['slots_serving']}/{h['bookies_wanted']} slots serving; bookies {len(h['writable'])} writable, "
            f"{len(h['readonly'])} read-only; under-replicated ledgers {ur}; auditor {h.get('auditor')} "
            f"(the driver: {h.get('driver_is_auditor')}); job resubmits {h.get('resubmits', 0)}")
    if failed:
        line += "; failing slots: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
    return line


# ---------------------------------------------------------------------- command line

def _read_toml_table(path: str | None, table: str) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(read_toml_table(path, table).items()))


def _read_rack_map(path: str | None) -> tuple[tuple[str, str], ...]:
    """``host location`` per line (``#`` comments), or a JSON object host → location."""
    if path is None:
        return ()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"rack map {path}: {e.strerror}") from e
    if text.lstrip().startswith("{"):
        try:
            return tuple(sorted((str(k), str(v)) for k, v in json.loads(text).items()))
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"rack map {path} is not a JSON object of host → location: {e}") from e
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or not words[1].startswith("/"):
            raise ConfigError(f"rack map {path}:{n}: want 'host /location', got {line!r}")
        pairs.append((words[0], words[1]))
    return tuple(sorted(pairs))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The job's arguments (stable: deploy/mesos renders them)."""
    ap.add_argument("--zk", required=True, help="ZooKeeper connect string host:port[,...][/root]")
    ap.add_argument("--bookies", type=int, required=True, help="number of bookie slots (one per executor)")
    ap.add_argument("--data-root", default=os.environ.get("SPARK_BOOKIE_DATA_ROOT", "/var/lib/spark-bookie"),
                    help="persistent directory on every executor host; slot k lives in <data-root>/<name>/slot-<k>")
    ap.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, help="slot k's bookie listens on base+k")
    ap.add_argument("--name", default=DEFAULT_NAME, help="application name in ZooKeeper (one driver per name)")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[N])")
    ap.add_argument("--bookie-conf", default=None, help="TOML [bookie] settings for every bookie (read here)")
    ap.add_argument("--autorecovery-conf", default=None, help="TOML [autorecovery] settings (read here)")
    ap.add_argument("--no-autorecovery", dest="autorecovery", action="store_false",
                    help="run no auditor or replication workers")
    ap.add_argument("--network-location", default=DEFAULT_LOCATION_TEMPLATE,
                    help="bookie network location template ({host}, {slot}) for hosts not in --rack-map")
    ap.add_argument("--rack-map", default=None, help="file of 'host /location' lines (or a JSON object)")
    ap.add_argument("--heartbeat-interval-s", type=float, default=2.0, help="slot status and stop-check period")
    ap.add_argument("--health-interval-s", type=float, default=10.0, help="driver health log period")
    ap.add_argument("--zk-session-timeout-ms", type=int, default=10_000)
    ap.add_argument("--task-max-failures", type=int, default=1_000)
    ap.add_argument("--stop-timeout-s", type=float, default=60.0)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")


def config_from_args(args: argparse.Namespace) -> ClusterAppConfig:
    confs = []
    for kv in args.conf:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise ConfigError(f"--conf wants KEY=VALUE, got {kv!r}")
        confs.append((k, v))
    hosting = HostingConfig(
        zk_connect=args.zk, bookies=args.bookies, data_root=os.path.abspath(args.data_root), name=args.name,
        base_port=args.base_port, network_location_template=args.network_location,
        rack_map=_read_rack_map(args.rack_map), bookie_settings=_read_toml_table(args.bookie_conf, "bookie"),
        autorecovery=args.autorecovery,
        autorecovery_settings=_read_toml_table(args.autorecovery_conf, "autorecovery"),
        heartbeat_interval_ms=int(args.heartbeat_interval_s * 1000),
        zk_session_timeout_ms=args.zk_session_timeout_ms).validate()
    _check_bookie_settings(hosting)
    return ClusterAppConfig(hosting=hosting, master=args.master, spark_conf=tuple(confs),
                            task_max_failures=args.task_max_failures,
                            health_interval_ms=int(args.health_interval_s * 1000),
                            stop_timeout_ms=int(args.stop_timeout_s * 1000))


def _check_bookie_settings(hosting: HostingConfig) -> None:
    """Validate the bookie and autorecovery settings here, once, rather than in every task."""
    from .config import load_config

    load_config(None, **{**dict(hosting.bookie_settings), "journal_dirs": ["/j"], "ledger_dirs": ["/l"]})
    if hosting.autorecovery:
        try:
            from recovery import AutoRecovery, AutoRecoveryConfig  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"autorecovery is on but recovery.AutoRecovery is unavailable ({e}); "
                              "pass --no-autorecovery to run without re-replication") from e
        try:
            AutoRecoveryConfig(**dict(hosting.autorecovery_settings))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"bad autorecovery settings: {e}") from e


# ---------------------------------------------------------------------- `spark-bookie cluster ...`

def add_cluster_parser(p: argparse.ArgumentParser, zk_default: str) -> None:
    sub = p.add_subparsers(dest="cluster_command", required=True)
    stop = sub.add_parser("stop", help="ask the running bookie-cluster application to stop gracefully")
    status = sub.add_parser("status", help="the hosting application's driver, slots and health")
    for q in (stop, status):
        q.add_argument("--zk", default=zk_default)
        q.add_argument("--name", default=DEFAULT_NAME, help="the application's --name")
    stop.add_argument("--wait-s", type=float, default=120.0, help="wait this long for the driver to stop (0: don't)")
    status.add_argument("--json", action="store_true")


def run_cluster(args: argparse.Namespace) -> int:
    from metadata import connect as connect_md

    try:
        store = connect_md(args.zk)
    except MetadataError as e:
        print(f"spark-bookie: error: cannot reach ZooKeeper at {args.zk}: {e}", file=sys.stderr)
        return 2
    try:
        if args.cluster_command == "stop":
            return _cluster_stop(store, args.name, args.wait_s)
        return _cluster_status(store, args.name, args.json)
    except MetadataError as e:
        print(f"spark-bookie: error: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()


def _cluster_stop(store: MetadataStore, name: str, wait_s: float) -> int:
    driver = decode_status(store.get_app_data(app_key(name, "driver")))
    if not driver or driver.get("state") == STOPPED:
        print(f"spark-bookie: bookie cluster {name!r} is not running", file=sys.stderr)
        return 1
    request_stop(store, name, "spark-bookie cluster stop")
    print(f"stop requested for bookie cluster {name!r} ({driver.get('app_id')})", flush=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if decode_status(store.get_app_data(app_key(name, "driver"))).get("state") == STOPPED:
            print("stopped")
            return 0
        time.sleep(0.5)
    if wait_s > 0:
        print(f"spark-bookie: the driver did not report stopped within {wait_s:g} s", file=sys.stderr)
        return 1
    return 0


def _cluster_status(store: MetadataStore, name: str, as_json: bool) -> int:
    driver = decode_status(store.get_app_data(app_key(name, "driver")))
    wanted = int(driver.get("bookies", 0) or 0)
    h = cluster_health(store, name, wanted)
    last = decode_status(store.get_app_data(app_key(name, "health")))
    h["driver"] = driver
    h["driver_is_auditor"] = last.get("driver_is_auditor")
    h["resubmits"] = driver.get("resubmits", 0)
    if as_json:
        print(json.dumps(h, indent=2, sort_keys=True))
        return 0 if driver else 1
    if not driver:
        print(f"no bookie cluster {name!r} has run on this ZooKeeper root")
        return 1
    age = (h["time_ms"] - int(driver.get("heartbeat_ms", 0))) / 1000
    print(f"driver: {driver.get('state')} ({driver.get('app_id')} on {driver.get('host')}, pid "
          f"{driver.get('pid')}, last heartbeat {age:.0f} s ago)")
    for k, slot in h["slots"].items():
        print(f"slot {k}: {slot['state']} {slot['bookie_id']}" + (f" ({slot['error']})" if slot["error"] else ""))
    print(f"health: {health_line(h)}")
    return 0


def run_spark_sandbox(root: str, bookies: int, zk_port: int | None, wait: Callable[[], object]) -> int:
    """`spark-bookie sandbox --spark`: ZooKeeper + this application on local-cluster[N,1,1024]."""
    from .sandbox import SparkSandbox

    with SparkSandbox(root, bookies, zk_port=zk_port) as sb:
        print(f"sandbox up (Spark local-cluster[{bookies},1,1024]): ZooKeeper at {sb.connect_string}, "
              f"bookies {', '.join(sb.bookie_ids)}; driver log {sb.driver_log}", flush=True)
        print(f"export SPARK_BOOKIE_ZK={sb.connect_string}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        wait()
        print("stopping the bookie cluster (graceful)...", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
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
        return BookieClusterApp(cfg).run()
    except (StartupError, ConfigError, MetadataError) as e:
        print(f"bookie_cluster: error: {e}", file=sys.stderr)
        return 2


__all__ = ["BookieClusterApp", "ClusterAppConfig", "add_arguments", "add_cluster_parser", "cluster_health",
           "config_from_args", "health_line", "main", "run_cluster", "run_spark_sandbox", "spark_conf_pairs"]
