"""A whole cluster on one machine: embedded ZooKeeper plus N real bookie processes.

BookKeeper's `localbookie`. Used by `spark-bookie sandbox`, by the README's main command and by
the integration tests, which kill bookies with SIGKILL and restart them on the same directories.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadata import MetadataStore
from metadata import connect as connect_metadata
from spark_bookie.local.zookeeper import EmbeddedZooKeeper, ZooKeeperServerTls, free_port, free_port_range
from spark_bookie.server.config import zk_tls_from

log = logging.getLogger(__name__)


class SandboxError(RuntimeError):
    """A sandbox could not start: ``message`` is one line for the command line (what failed and
    where its log is), ``detail`` the log's tail (in ``str()``, for tests and programs)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message}\n{self.detail}" if self.detail else self.message


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A sandbox's process did not come up in time."""


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_conf(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("[bookie]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in settings.items()))
    return path


@dataclass
class BookieProcess:
    """One `spark-bookie bookie` child process with fixed directories and port."""

    zk: str
    port: int
    root: Path
    settings: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _log_offset: int = 0

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str | None:
        """The admin API's base URL (/metrics, /api/v1/...) when the bookie serves HTTP."""
        port = self.settings.get("http_port")
        return f"http://127.0.0.1:{port}" if port else None

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledgers"

    @property
    def log_path(self) -> Path:
        return self.root / "bookie.log"

    def command(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "spark_bookie.cli", "bookie", "--zk", self.zk, "--port", str(self.port),
               "--journal-dir", str(self.journal_dir), "--ledger-dir", str(self.ledger_dir)]
        if self.settings:
            cmd += ["--conf", str(write_conf(self.root / "bookie.toml", self.settings))]
        return cmd

    def start(self) -> None:
        if self.alive:  # a second process would fail on the directory lock and orphan this one
            raise RuntimeError(f"bookie {self.bookie_id} is still running (pid {self.proc.pid if self.proc else '?'}); "
                               "stop or kill it before starting it again")
        cmd = self.command()
        with open(self.log_path, "ab") as logf:
            self._log_offset = logf.tell()
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_registered(self, store: MetadataStore, timeout_s: float = 60.0) -> None:
        """Until the bookie says ready and is registered; SandboxError if it exits first,
        SandboxTimeoutError if that takes over ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SandboxError(f"bookie {self.bookie_id} exited with {self.proc.returncode}: {self._last_error()} "
                                   f"(log {self.log_path})", self.log_tail())
            # `spark-bookie bookie` prints "ready" after registering; a stale znode of a killed
            # predecessor must not count, so both the line (from this run) and the node are required.
            if self._says_ready() and self.bookie_id in (store.cluster.list_bookies()
                                                         + store.cluster.list_bookies(readonly=True)):
                return
            time.sleep(0.05)
        raise SandboxTimeoutError(f"bookie {self.bookie_id} did not register in {timeout_s:g} s (log {self.log_path})",
                                  self.log_tail())

    def _last_error(self) -> str:
        """The line of this run's log that says why the bookie stopped (its `error:` line)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "(no log)"
        said = [x.split("error: ", 1)[1] for x in lines if "error: " in x]
        return said[-1] if said else (lines[-1] if lines else "(empty log)")

    def _says_ready(self) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f"bookie {self.bookie_id} ready".encode() in f.read()
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM and wait (graceful); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def embedded_zookeeper(port: int | None, root: Path, settings: dict[str, Any],
                       tls: ZooKeeperServerTls | None) -> EmbeddedZooKeeper:
    """The sandbox's ZooKeeper in ``<root>/zookeeper``, serving TLS exactly when the bookie settings
    connect over TLS (``zk_tls``); SandboxError for a mismatch, which would only show later as
    bookies that cannot reach it."""
    if (tls is None) != (zk_tls_from(settings) is None):
        raise SandboxError("the embedded ZooKeeper serves TLS (zk_tls=) exactly when the bookie settings' "
                           "zk_tls is on: the bookies could not reach it otherwise")
    return EmbeddedZooKeeper(port or free_port(), root / "zookeeper", tls=tls)


def connect_as_bookies(connect_string: str, settings: dict[str, Any]) -> MetadataStore:
    """A sandbox's own metadata session, with its bookies' ZooKeeper credentials and TLS (a secured
    sandbox's layout is then created with their ACL)."""
    return connect_metadata(connect_string, zk_auth=settings.get("zk_auth") or None, zk_tls=zk_tls_from(settings))


def init_layout(store: MetadataStore, settings: dict[str, Any]) -> None:
    """Create the cluster's layout; when the bookies' client config names the members' ZooKeeper
    credentials (a secured sandbox's does), turn the per-tenant ZooKeeper ACLs on too (DESIGN
    §4.9), so roles made with `spark-bookie role create` are kept apart by ZooKeeper itself."""
    store.cluster.init_cluster()
    conf = settings.get("client_conf")
    if not conf:
        return
    import tomllib

    member_auth = tomllib.loads(Path(conf).read_text()).get("client", {}).get("zk_member_auth")
    if member_auth:
        store.tenants.enable_zk_acls(member_auth)


def stop_cluster(bookies: Sequence[BookieProcess], store: MetadataStore | None, zk: EmbeddedZooKeeper | None) -> None:
    """Bookies gracefully (one failing to stop does not keep the others running), then the
    metadata session, then ZooKeeper: the order that leaves no bookie without its ZooKeeper."""
    for b in bookies:
        try:
            b.stop()
        except Exception:
            log.exception("stopping %s", b.bookie_id)
    if store is not None:
        store.close()
    if zk is not None:
        zk.stop()


def group_setting(groups: Sequence[str], i: int) -> dict[str, str]:
    """The bookie setting that puts the ``i``-th bookie of a sandbox in its placement group."""
    return {"bookie_group": groups[i]} if i < len(groups) and groups[i] else {}


class Sandbox:
    """Embedded ZooKeeper + `bookies` bookie processes under `root`."""

    def __init__(self, root: str | Path, bookies: int = 3, *, zk_port: int | None = None,
                 zk_connect: str | None = None, bookie_settings: dict[str, Any] | None = None,
                 http: bool = False, bookie_ports: Sequence[int] = (), http_ports: Sequence[int] = (),
                 zk_tls: ZooKeeperServerTls | None = None, bookie_groups: Sequence[str] = ()) -> None:
        """With `zk_connect`, use that (running) ZooKeeper instead of starting an embedded one.
        With `http`, every bookie serves the admin API and /metrics on a port of its own.
        `bookie_ports` / `http_ports`: the ports of the first bookies (a resumed sandbox's), free
        ones for the rest. `zk_tls`: the embedded ZooKeeper serves TLS only (a secured sandbox's,
        `SecureSandboxFiles.zookeeper_tls()`, with bookie settings that say `zk_tls`).
        `bookie_groups`: the placement group of each bookie in order ("" or past the end: none)."""
        self.http = http
        self._groups = list(bookie_groups)
        self._ports = list(bookie_ports)
        self._http_ports = list(http_ports)
        self.root = Path(root)
        self.settings = dict(bookie_settings or {})
        self.zk: EmbeddedZooKeeper | None = None
        self._zk_connect = zk_connect
        if zk_connect is None:
            self.zk = embedded_zookeeper(zk_port, self.root, self.settings, zk_tls)
        self.bookies: list[BookieProcess] = []
        self._count = bookies
        self.store: MetadataStore | None = None

    @property
    def connect_string(self) -> str:
        if self.zk is not None:
            return self.zk.connect_string
        return self._zk_connect or ""

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.zk is not None:
            self.zk.start()
        self.store = connect_as_bookies(self.connect_string, self.settings)
        init_layout(self.store, self.settings)
        for i in range(self._count):
            self.add_bookie(wait=False, **group_setting(self._groups, i))
        for b in self.bookies:
            b.wait_registered(self.store)

    def add_bookie(self, wait: bool = True, **settings: Any) -> BookieProcess:
        i = len(self.bookies)
        settings = {**self.settings, **settings}
        if self.http and "http_port" not in settings:
            settings["http_port"] = self._http_ports[i] if i < len(self._http_ports) else free_port()
        port = self._ports[i] if i < len(self._ports) else free_port()
        b = BookieProcess(self.connect_string, port, self.root / f"bookie-{i}", settings)
        self.bookies.append(b)
        b.start()
        if wait and self.store is not None:
            b.wait_registered(self.store)
        return b

    @property
    def pids(self) -> list[int]:
        """The processes it started (ZooKeeper, bookies)."""
        pids = [b.proc.pid for b in self.bookies if b.proc is not None]
        return pids + ([self.zk.pid] if self.zk is not None and self.zk.pid is not None else [])

    def restart(self, b: BookieProcess, wait: bool = True) -> None:
        b.start()
        if wait and self.store is not None:
            b.wait_registered(self.store)

    def stop(self) -> None:
        stop_cluster(self.bookies, self.store, self.zk)
        self.store = None

    def __enter__(self) -> Sandbox:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SparkSandbox:
    """Embedded ZooKeeper + the bookie-cluster Spark application (spark_bookie.hosting) on
    ``local-cluster[N,1,1024]``: N executor JVMs, each hosting one bookie (`sandbox --spark`).

    The driver runs as a child process in its own session (so Ctrl-C reaches only us and we stop it
    gracefully, through the stop request in ZooKeeper); its log is ``<root>/driver.log``.

    ``bookie_settings`` go to every executor's bookie as the job's ``--bookie-conf``
    (``<root>/bookie.toml``); a secured sandbox's (``SecureSandboxFiles.bookie_settings()``: mTLS,
    tokens, zk_auth, the client_conf of the replication workers and the auditor) also make the
    ZooKeeper layout, and this object's own session, carry the ACL of their zk_auth.
    """

    def __init__(self, root: str | Path, bookies: int = 3, *, zk_port: int | None = None,
                 zk_connect: str | None = None, master: str | None = None, python: str = sys.executable,
                 extra_args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
                 start_timeout_s: float = 300.0, submit_conf: dict[str, str] | None = None,
                 script: Path | None = None, bookie_settings: dict[str, Any] | None = None,
                 base_port: int | None = None, zk_tls: ZooKeeperServerTls | None = None) -> None:
        """With ``submit_conf`` (possibly empty), the driver is launched the documented way, by
        ``spark-submit --master M --conf k=v ... jobs/bookie_cluster.py`` (the spark-submit beside
        ``python``); without, as ``python jobs/bookie_cluster.py --master M``. ``base_port``: the
        bookies' first port (a resumed sandbox's; default: a free range). ``zk_tls``: as Sandbox's."""
        self.root = Path(root).absolute()
        self.submit_conf = submit_conf
        self.script = script  # the driver's file: the hosting package's launcher unless given
        self.bookies = bookies
        self.settings = dict(bookie_settings or {})
        self.zk: EmbeddedZooKeeper | None = None
        self._zk_connect = zk_connect
        if zk_connect is None:
            self.zk = embedded_zookeeper(zk_port, self.root, self.settings, zk_tls)
        self.master = master or f"local-cluster[{bookies},1,1024]"
        self.python = python
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self._base_port = base_port
        self.base_port = 0
        self.name = "bookie-cluster"
        self.proc: subprocess.Popen[bytes] | None = None
        self.store: MetadataStore | None = None

    @property
    def connect_string(self) -> str:
        return self.zk.connect_string if self.zk is not None else (self._zk_connect or "")

    @property
    def driver_log(self) -> Path:
        return self.root / "driver.log"

    @property
    def bookie_ids(self) -> list[str]:
        return [f"127.0.0.1:{self.base_port + k}" for k in range(self.bookies)]

    def driver_command(self) -> list[str]:
        from spark_bookie.hosting import launch

        script = self.script or Path(launch.__file__)
        args = ["--zk", self.connect_string, "--bookies", str(self.bookies), "--data-root", str(self.root / "data"),
                "--base-port", str(self.base_port), *self.extra_args]
        if self.settings:
            args += ["--bookie-conf", str(self._write_bookie_conf())]
        if self.submit_conf is None:
            return [self.python, str(script), *args, "--master", self.master, "--conf", "spark.ui.enabled=false"]
        conf = {"spark.ui.enabled": "false", **self.submit_conf}
        confs = [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]
        submit = str(Path(self.python).parent / "spark-submit")
        return [submit, "--master", self.master, *confs, str(script), *args]

    def _write_bookie_conf(self) -> Path:
        """``<root>/bookie.toml``, private (a secured sandbox's holds its ZooKeeper credentials)."""
        path = self.root / "bookie.toml"
        self.root.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        return write_conf(path, self.settings)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.zk is not None:
            self.zk.start()
        self.store = connect_as_bookies(self.connect_string, self.settings)
        init_layout(self.store, self.settings)
        self.base_port = self._base_port or free_port_range(self.bookies)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": self.python,
               "PYSPARK_DRIVER_PYTHON": self.python, **self.env}
        with open(self.driver_log, "ab") as logf:
            self.proc = subprocess.Popen(self.driver_command(), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.wait_bookies(self.bookie_ids, self.start_timeout_s)

    def wait_bookies(self, wanted: list[str], timeout_s: float) -> None:
        """Wait until every bookie in ``wanted`` is registered (writable)."""
        deadline = time.monotonic() + timeout_s
        store = self._store()
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SandboxError(f"the bookie-cluster driver exited with {self.proc.returncode} "
                                   f"(log {self.driver_log})", self.log_tail())
            if set(wanted) <= set(store.cluster.list_bookies()):
                return
            time.sleep(0.5)
        raise SandboxTimeoutError(f"bookies {wanted} not all registered in {timeout_s:g} s (registered: "
                                  f"{store.cluster.list_bookies()}; log {self.driver_log})", self.log_tail())

    def _store(self) -> MetadataStore:
        if self.store is None:
            raise RuntimeError("the Spark sandbox is not started")
        return self.store

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.driver_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no driver log)"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 120.0) -> int | None:
        """Graceful: the stop request in ZooKeeper, then wait for the driver to exit; SIGTERM, then
        SIGKILL of its whole process group (driver, Spark JVM, executors) if it does not."""
        from spark_bookie.hosting.slots import request_stop

        if self.proc is not None and self.proc.poll() is None:
            try:
                request_stop(self._store(), self.name, "sandbox stopping")
            except Exception:
                log.exception("could not write the stop request; terminating the driver")
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=30)
        self._reap_group()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.zk is not None:
            self.zk.stop()
        return None if self.proc is None else self.proc.returncode

    @property
    def pids(self) -> list[int]:
        """The processes it started (the driver, which leads the Spark processes' group; ZooKeeper)."""
        pids = [self.proc.pid] if self.proc is not None else []
        return pids + ([self.zk.pid] if self.zk is not None and self.zk.pid is not None else [])

    def group_members(self) -> list[int]:
        """Pids still in the driver's process group (driver, Spark JVM, executors, Python workers)."""
        if self.proc is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids

    def _reap_group(self, wait_s: float = 10.0) -> None:
        """After the driver exited, nothing of its process group may stay behind."""
        if self.proc is None:
            return
        deadline = time.monotonic() + wait_s
        while self.group_members() and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = self.group_members()
        if survivors:
            log.warning("killing processes the Spark driver left behind: %s", survivors)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> SparkSandbox:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
