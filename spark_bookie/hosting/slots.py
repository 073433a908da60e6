"""The executor side of the Spark-hosted bookie cluster: one long-running task per bookie slot.

The driver (:mod:`spark_bookie.hosting.driver`) runs one plain ``mapPartitionsWithIndex`` task per slot
k = 0..N-1 (the partition index). The task, in :func:`run_slot`:

1. **claims the slot on this host**: ``<data-root>/<name>/slot-<k>`` on the executor host's
   persistent volume, locked with ``flock`` for the task's life. Two executors on one host never
   share a slot (the second waits for the lock), and a retried task of slot k on the same host
   reopens the same journal, ledgers and cookie;
2. **starts the bookie** with a stable identity: port ``base_port + k`` and the executor host as the
   advertised host, so the bookie id ``host:port`` is the same after every restart on that host
   (and the cookie matches). A task of slot k that lands on another host finds that host's own
   slot-k directory and becomes a different bookie (new, or that host's old one coming back); the
   bookie it left behind stays unregistered and the auditor re-replicates its ledgers;
3. **runs a replication worker** (``recovery.AutoRecovery(run_auditor=False, run_worker=True)``)
   beside the bookie. Not an auditor candidate (BookKeeper's autorecovery daemons all are): the
   driver stands for auditor, and when the driver goes the executors go with it, so N more
   candidates would buy nothing but N election votes and whole-cluster audit scans competing with
   the bookie for the executor's core. A second application's driver or a standalone
   ``spark-bookie autorecovery`` are the fallback candidates;
4. **heartbeats** its status into ZooKeeper (``<root>/apps/spark/<name>/slots/<k>``: state, bookie
   id, executor id and pid, task attempt, read-only, last error) and **blocks until told to stop**:
   the stop request is the node ``<root>/apps/spark/<name>/stop`` (written by the driver on SIGTERM
   or by ``spark-bookie cluster stop``). It then stops the worker and the bookie gracefully
   (unregister, drain, checkpoint) and returns, which ends the task and, for all slots, the job.

A bookie that cannot start (cookie mismatch after a lost disk, a port held by a zombie, ZooKeeper
down) does not fail the task: failing it would, after ``spark.task.maxFailures``, abort the job and
take every healthy bookie down with it. The task reports ``failed`` with the reason and retries with
backoff until it starts or is told to stop. Cancelling the job is *not* a graceful stop: Spark kills
the Python worker with SIGKILL after ``spark.python.task.killTimeout``; nothing acknowledged is lost
(every acknowledged add is in an fsynced journal), but the bookies leave as if crashed.

Python-worker rules (FACTS.md): grpc and the bookie are imported inside the task only (the pyspark
daemon forks workers and must never have loaded grpc); workers are reused, so everything started
here (server, ZooKeeper sessions, threads) is stopped in ``finally``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from ledger_client.protocol.checks import invariant
from metadata import MetadataError, MetadataStore, ZkTls
from metadata import connect as connect_metadata
from spark_bookie.errors import SlotBusyError
from spark_bookie.server.process_identity import stat_fields

log = logging.getLogger(__name__)

APP_PREFIX = "spark"  # application data of hosting applications: <root>/apps/spark/<name>/...
DEFAULT_NAME = "bookie-cluster"
DEFAULT_BASE_PORT = 3181
DEFAULT_LOCATION_TEMPLATE = "/{host}"

# Slot states, as written in the status node (and shown by `spark-bookie cluster status`).
STARTING = "starting"
SERVING = "serving"
FAILED = "failed"  # the bookie could not start; retrying with backoff (see "error")
STOPPING = "stopping"
STOPPED = "stopped"


def app_key(name: str, *parts: str) -> str:
    """The application-data key of a hosting application's node (see the module docstring)."""
    return "/".join((APP_PREFIX, name, *parts))


@dataclass(frozen=True)
class HostingConfig:
    """Everything a slot task needs; built by the driver and shipped (pickled) to every task.

    ``bookie_settings`` are extra BookieConfig keys (a TOML ``[bookie]`` table read on the driver),
    as sorted (key, value) pairs so the dataclass stays hashable and frozen. ``rack_map`` maps an
    executor host to its network location; hosts not in it get ``network_location_template`` with
    ``{host}`` and ``{slot}`` filled in. ``group_map`` and ``bookie_group_template`` give each
    host's bookies their placement group (DESIGN §4.10) the same way ("" = none).
    """

    zk_connect: str
    bookies: int
    data_root: str
    name: str = DEFAULT_NAME
    base_port: int = DEFAULT_BASE_PORT
    bind_host: str = ""  # "" = the executor's SPARK_LOCAL_IP, else 0.0.0.0
    advertised_host: str = ""  # "" = the executor's host (see executor_host())
    network_location_template: str = DEFAULT_LOCATION_TEMPLATE
    rack_map: tuple[tuple[str, str], ...] = ()
    bookie_group_template: str = ""
    group_map: tuple[tuple[str, str], ...] = ()
    bookie_settings: tuple[tuple[str, Any], ...] = ()
    autorecovery: bool = True
    autorecovery_settings: tuple[tuple[str, Any], ...] = ()
    heartbeat_interval_ms: int = 2_000
    slot_claim_timeout_ms: int = 120_000
    start_retry_delay_ms_max: int = 30_000
    stop_grace_ms: int = 5_000
    zk_session_timeout_ms: int = 10_000
    http_base_port: int = 0  # slot k's bookie serves /metrics and the admin API on base + k; 0 = off

    def zk_auth(self) -> str | None:
        """The ZooKeeper credentials of a secured cluster (the bookie settings' zk_auth), or None."""
        return dict(self.bookie_settings).get("zk_auth") or None

    def zk_tls(self) -> ZkTls | None:
        """The TLS to ZooKeeper of a cluster whose bookie settings turn zk_tls on, or None."""
        from spark_bookie.server.config import zk_tls_from

        return zk_tls_from(dict(self.bookie_settings))

    def client_config(self) -> Any:
        """The ClientConfig of the job's own clients (replication workers, the auditor) on a secured
        cluster: the bookie settings' client_conf (a path readable everywhere), else their zk_auth
        alone, else None (docs/security.md)."""
        from ledger_client import ClientConfig

        bookie = dict(self.bookie_settings)
        if bookie.get("client_conf"):
            return ClientConfig.from_toml(bookie["client_conf"])
        return ClientConfig(zk_auth=bookie["zk_auth"]) if bookie.get("zk_auth") else None

    def validate(self) -> HostingConfig:
        from spark_bookie.errors import ConfigError

        problems = []
        if self.bookies < 1:
            problems.append(f"bookies must be >= 1, not {self.bookies}")
        if not (0 < self.base_port and self.base_port + self.bookies - 1 < 65536):
            problems.append(f"ports {self.base_port}..{self.base_port + self.bookies - 1} are not all in 1..65535")
        if self.http_base_port and not (0 < self.http_base_port and self.http_base_port + self.bookies - 1 < 65536):
            problems.append(f"http ports {self.http_base_port}..{self.http_base_port + self.bookies - 1} are not "
                            "all in 1..65535")
        if not self.data_root:
            problems.append("data_root is empty")
        if not self.name or "/" in self.name or self.name in (".", ".."):
            problems.append(f"bad application name {self.name!r}")
        try:
            self.network_location_template.format(host="h", slot=0)
        except (KeyError, IndexError, ValueError) as e:
            problems.append(f"network location template {self.network_location_template!r}: {e!r}")
        try:
            self.bookie_group_template.format(host="h", slot=0)
        except (KeyError, IndexError, ValueError) as e:
            problems.append(f"bookie group template {self.bookie_group_template!r}: {e!r}")
        for name in ("heartbeat_interval_ms", "slot_claim_timeout_ms", "start_retry_delay_ms_max"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive")
        bookie = dict(self.bookie_settings)
        if self.autorecovery and bookie.get("zk_tls") and not bookie.get("client_conf"):
            problems.append("bookie settings with zk_tls need client_conf (a client TOML with zk_tls = true) for the "
                            "replication workers' and the auditor's ZooKeeper sessions")
        if problems:
            raise ConfigError("invalid hosting configuration: " + "; ".join(problems))
        return self

    def slot_dir(self, slot: int) -> Path:
        return Path(self.data_root) / self.name / f"slot-{slot}"

    def port(self, slot: int) -> int:
        return self.base_port + slot

    def network_location(self, host: str, slot: int) -> str:
        mapped = dict(self.rack_map).get(host)
        return mapped if mapped is not None else self.network_location_template.format(host=host, slot=slot)

    def bookie_group(self, host: str, slot: int) -> str:
        mapped = dict(self.group_map).get(host)
        return mapped if mapped is not None else self.bookie_group_template.format(host=host, slot=slot)


# ---------------------------------------------------------------------- where we run

def executor_host() -> str:
    """The host part of this executor's bookie ids: how clients reach it.

    ``SPARK_BOOKIE_ADVERTISED_HOST`` (set per cluster through ``spark.executorEnv``) wins, then
    what Spark itself uses for the executor (``SPARK_LOCAL_HOSTNAME``, ``SPARK_LOCAL_IP``), then
    the fully qualified host name.
    """
    for var in ("SPARK_BOOKIE_ADVERTISED_HOST", "SPARK_LOCAL_HOSTNAME", "SPARK_LOCAL_IP"):
        if os.environ.get(var):
            return os.environ[var]
    return socket.getfqdn()


def bind_host() -> str:
    return os.environ.get("SPARK_BOOKIE_BIND_HOST") or os.environ.get("SPARK_LOCAL_IP") or "0.0.0.0"


def _parent_pid(pid: int) -> int | None:
    fields = stat_fields(pid)   # "state ppid ..."
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass(frozen=True)
class ExecutorInfo:
    """The executor JVM this Python worker belongs to (from /proc; None off Linux or if not found)."""

    pid: int | None
    executor_id: str | None
    app_id: str | None


def executor_info() -> ExecutorInfo:
    """Walk up from this Python worker (worker → pyspark daemon → executor JVM) to the JVM whose
    command line runs an ``*ExecutorBackend``: operators and fault tests kill *that* process."""
    pid: int | None = os.getpid()
    for _ in range(4):
        pid = _parent_pid(pid) if pid is not None else None
        if pid is None or pid <= 1:
            break
        args = _cmdline(pid)
        if any("ExecutorBackend" in a for a in args):
            def arg(flag: str, args: list[str] = args) -> str | None:
                return args[args.index(flag) + 1] if flag in args[:-1] else None

            return ExecutorInfo(pid, arg("--executor-id"), arg("--app-id"))
    return ExecutorInfo(None, None, None)


def _task_attempt_id() -> int | None:
    """Spark's task attempt id (unique in the application; attemptNumber() restarts at 0 after a
    stage retry, so it cannot tell two attempts apart)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    return None if ctx is None else int(ctx.taskAttemptId())


# ---------------------------------------------------------------------- the slot directory

@contextlib.contextmanager
def claim_slot(slot_dir: Path, timeout_s: float, stop: threading.Event | None = None) -> Iterator[Path]:
    """Hold ``slot_dir/slot.lock`` (``flock``, released by the kernel if the process dies) while inside.

    Waits up to ``timeout_s`` for a previous holder to go: after a kill -9 of an executor its Python
    workers die within ~0.1 s, but a task killed by cancellation may linger for Spark's kill timeout.
    """
    slot_dir.mkdir(parents=True, exist_ok=True)
    lock: IO[bytes] = open(slot_dir / "slot.lock", "ab")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                raise SlotBusyError(f"{slot_dir} is held by another process (waited {timeout_s:g} s)")
            time.sleep(0.2)
        yield slot_dir
    finally:
        lock.close()


def check_slot_identity(slot_dir: Path, slot: int, bookie_id: str) -> None:
    """Record the slot's bookie id on first use and refuse a different one later.

    The id is derived (host and base port + slot), so a changed ``--base-port`` or host name would
    silently turn this slot's data into another bookie's; the cookie check would refuse too, but
    this message says why.
    """
    from spark_bookie.errors import StartupError

    ident = slot_dir / "slot.json"
    if ident.exists():
        try:
            recorded = json.loads(ident.read_text())["bookie_id"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StartupError(f"{ident} is unreadable ({e!r})") from e
        if recorded != bookie_id:
            raise StartupError(
                f"slot {slot} directory {slot_dir} belongs to bookie {recorded}, but this task would run "
                f"{bookie_id} (was --base-port or the executor host name changed?)")
        return
    tmp = ident.with_suffix(".tmp")
    tmp.write_text(json.dumps({"slot": slot, "bookie_id": bookie_id, "created_ms": int(time.time() * 1000)}))
    os.replace(tmp, ident)


# ---------------------------------------------------------------------- status in ZooKeeper

@dataclass
class SlotStatus:
    """What a slot task tells the driver, `spark-bookie cluster status` and tests."""

    slot: int
    state: str
    bookie_id: str
    host: str
    network_location: str
    executor_id: str | None
    executor_pid: int | None
    worker_pid: int
    app_id: str | None
    task_attempt_id: int | None
    started_ms: int
    heartbeat_ms: int = 0
    bookie_starts: int = 0
    read_only: bool = False
    registered: bool = False
    autorecovery: str = "off"
    error: str = ""
    http_port: int = 0  # the bookie's admin API (http_base_port + slot), 0 = none
    bookie_group: str = ""  # its placement group (HostingConfig.bookie_group), "" = none

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def decode_status(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    try:
        value = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class _Recovery(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


class _BookieLike(Protocol):
    bookie_id: str

    @property
    def read_only(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self, grace_s: float = 2.0) -> None: ...


class SlotRunner:
    """One slot's bookie + replication worker + heartbeat loop, inside one task."""

    def __init__(self, cfg: HostingConfig, slot: int, store: MetadataStore, slot_dir: Path,
                 status: SlotStatus) -> None:
        self.cfg = cfg
        self.slot = slot
        self.store = store
        self.slot_dir = slot_dir
        self.status = status
        self.stop_requested = threading.Event()
        self.bookie: _BookieLike | None = None
        self.recovery: _Recovery | None = None
        self.admin: Any = None  # spark_bookie.http's server of this slot's bookie (http_base_port)
        self._retry_delay_s = 1.0
        self._next_start = 0.0

    # -- status ---------------------------------------------------------------------------
    def report(self, state: str | None = None, error: str | None = None) -> None:
        if state is not None:
            self.status.state = state
        if error is not None:
            self.status.error = error
        self.status.heartbeat_ms = int(time.time() * 1000)
        if self.bookie is not None:
            self.status.read_only = self.bookie.read_only
        try:
            self.store.cluster.put_app_data(app_key(self.cfg.name, "slots", str(self.slot)), self.status.encode())
        except MetadataError as e:
            log.warning("slot %d: could not write status: %s", self.slot, e)

    def _check_stop(self) -> bool:
        try:
            if self.store.cluster.get_app_data(app_key(self.cfg.name, "stop")) is not None:
                self.stop_requested.set()
        except MetadataError as e:
            log.warning("slot %d: could not read the stop request: %s", self.slot, e)
        return self.stop_requested.is_set()

    # -- bookie -----------------------------------------------------------------------------
    def bookie_config(self) -> Any:
        from spark_bookie.server.config import load_config

        d = self.slot_dir
        explicit = {
            "zk_connect": self.cfg.zk_connect, "port": self.cfg.port(self.slot),
            "host": self.cfg.bind_host or bind_host(), "advertised_host": self.status.host,
            "network_location": self.status.network_location, "bookie_group": self.status.bookie_group,
            "journal_dirs": [str(d / "journal")], "ledger_dirs": [str(d / "ledgers")],
            "zk_session_timeout_ms": self.cfg.zk_session_timeout_ms,
        }
        return load_config(None, **{**dict(self.cfg.bookie_settings), **explicit})

    def _try_start(self) -> None:
        """Start the bookie (and its replication worker); on a StartupError report `failed` and
        schedule a retry with exponential backoff instead of failing the task."""
        from spark_bookie.errors import BookieError
        from spark_bookie.server.bookie import Bookie  # grpc: imported inside the task only

        self.report(STARTING)
        try:
            check_slot_identity(self.slot_dir, self.slot, self.status.bookie_id)
            bookie = Bookie(self.bookie_config(), metadata=self.store)
            invariant(bookie.bookie_id == self.status.bookie_id,
                      f"bookie id {bookie.bookie_id} != slot's {self.status.bookie_id}")
            bookie.start()
        except BookieError as e:
            delay = self._retry_delay_s
            self._retry_delay_s = min(delay * 2, self.cfg.start_retry_delay_ms_max / 1000)
            self._next_start = time.monotonic() + delay
            log.error("slot %d: bookie %s did not start (retrying in %g s): %s", self.slot,
                      self.status.bookie_id, delay, e)
            self.report(FAILED, error=f"{type(e).__name__}: {e}")
            return
        self.bookie = bookie
        self._retry_delay_s = 1.0
        self.status.bookie_starts += 1
        self.status.error = ""
        log.info("slot %d: bookie %s serving (location %s)", self.slot, bookie.bookie_id,
                 self.status.network_location)
        self._start_recovery()
        self._start_admin(bookie)
        self.report(SERVING)

    def _start_recovery(self) -> None:
        if not self.cfg.autorecovery:
            self.status.autorecovery = "off"
            return
        try:
            from recovery import AutoRecovery, AutoRecoveryConfig

            settings = dict(self.cfg.autorecovery_settings)
            ar = AutoRecovery(self.cfg.zk_connect, AutoRecoveryConfig(**settings) if settings else None,
                              candidate_id=f"{self.status.bookie_id}/slot-{self.slot}",
                              run_auditor=False, run_worker=True, client_config=self.cfg.client_config())
            ar.start()
        except Exception as e:  # the bookie serves on; replication is the cluster's, not this slot's, duty
            log.exception("slot %d: replication worker did not start", self.slot)
            self.status.autorecovery = f"error: {type(e).__name__}: {e}"
            return
        self.recovery = ar
        self.status.autorecovery = "worker"

    def _start_admin(self, bookie: Any) -> None:
        """The bookie's /metrics and admin API on http_base_port + slot; a port that cannot be
        bound is logged and the bookie serves on without it."""
        if not self.cfg.http_base_port:
            return
        from spark_bookie.http.process import serve_bookie

        port = self.cfg.http_base_port + self.slot
        try:
            self.admin = serve_bookie(bookie, port)
        except OSError as e:
            log.error("slot %d: no HTTP admin on port %d: %s", self.slot, port, e)
            return
        self.status.http_port = port
        log.info("slot %d: bookie %s http admin on %s", self.slot, bookie.bookie_id, self.admin.url)

    def _registered(self) -> bool:
        if self.bookie is None:
            return False
        try:
            bid = self.bookie.bookie_id
            return bid in self.store.cluster.list_bookies() or bid in self.store.cluster.list_bookies(readonly=True)
        except MetadataError:
            return False

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until a stop is requested; always leaves nothing running behind."""
        interval_s = self.cfg.heartbeat_interval_ms / 1000
        try:
            while not self._check_stop():
                if self.bookie is None and time.monotonic() >= self._next_start:
                    self._try_start()
                else:
                    self.status.registered = self._registered()
                    self.report()
                self.stop_requested.wait(interval_s)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self.report(STOPPING)
        if self.admin is not None:
            self._stop_logged("the HTTP admin", self.admin.stop)
            self.admin = None
            self.status.http_port = 0
        if self.recovery is not None:
            self._stop_logged("the replication worker", self.recovery.stop)
            self.recovery = None
        if self.bookie is not None:
            self._stop_logged(f"bookie {self.status.bookie_id}", self.bookie.stop,
                              grace_s=self.cfg.stop_grace_ms / 1000)
            self.bookie = None
        self.status.registered = False
        self.report(STOPPED)

    def _stop_logged(self, what: str, stop: Any, **kwargs: Any) -> None:
        """Stop one part; a failure is logged, not raised: the parts after it must stop too."""
        try:
            stop(**kwargs)
        except Exception:
            log.exception("slot %d: stopping %s failed", self.slot, what)


# ---------------------------------------------------------------------- the task

def _setup_task_logging() -> None:
    """Our INFO lines in the executor's stderr log (Python workers are reused: configure once)."""
    root = logging.getLogger("spark_bookie")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def run_slot(cfg: HostingConfig, slot: int, _rows: Iterable[Any]) -> Iterator[str]:
    """The body of slot ``slot``'s task (``mapPartitionsWithIndex``); yields one JSON summary line
    once the slot was stopped on request."""
    _setup_task_logging()
    host = cfg.advertised_host or executor_host()
    info = executor_info()
    status = SlotStatus(
        slot=slot, state=STARTING, bookie_id=f"{host}:{cfg.port(slot)}", host=host,
        network_location=cfg.network_location(host, slot), bookie_group=cfg.bookie_group(host, slot),
        executor_id=info.executor_id,
        executor_pid=info.pid, worker_pid=os.getpid(), app_id=info.app_id,
        task_attempt_id=_task_attempt_id(), started_ms=int(time.time() * 1000))
    log.info("slot %d: task %s on executor %s (pid %s) will run bookie %s", slot, status.task_attempt_id,
             info.executor_id, info.pid, status.bookie_id)
    store = connect_metadata(cfg.zk_connect, session_timeout_ms=cfg.zk_session_timeout_ms, zk_auth=cfg.zk_auth(),
                             zk_tls=cfg.zk_tls())
    try:
        runner = SlotRunner(cfg, slot, store, cfg.slot_dir(slot), status)
        # The slot's status node is the holder's: nothing is written before the lock is ours, so a
        # task waiting for the slot never hides the live holder's status.
        with claim_slot(cfg.slot_dir(slot), cfg.slot_claim_timeout_ms / 1000):
            runner.run()
    finally:
        store.close()
    yield json.dumps({"slot": slot, "bookie_id": status.bookie_id, "state": status.state,
                      "bookie_starts": status.bookie_starts})


def read_slot_statuses(store: MetadataStore, name: str) -> dict[int, dict[str, Any]]:
    """Every slot's last reported status (slot → decoded JSON), for the driver and the CLI."""
    out: dict[int, dict[str, Any]] = {}
    for child in store.cluster.list_app_data(app_key(name, "slots")):
        if child.isdigit():
            out[int(child)] = decode_status(store.cluster.get_app_data(app_key(name, "slots", child)))
    return out


def request_stop(store: MetadataStore, name: str, reason: str) -> None:
    """Ask the hosting application ``name`` to stop gracefully (its driver and every slot task
    watch this node)."""
    store.cluster.put_app_data(app_key(name, "stop"), json.dumps(
        {"reason": reason, "at_ms": int(time.time() * 1000), "by": f"{socket.gethostname()}:{os.getpid()}"}
    ).encode())
