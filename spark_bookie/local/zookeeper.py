"""The embedded ZooKeeper: the ZooKeeper server that ships inside pyspark's jars, as a child process.

No separate ZooKeeper install is needed for a sandbox, tests or a single-machine cluster: pyspark
4.3 carries ZooKeeper 3.9.5 (server classes included). It is bound to 127.0.0.1 only (never every
interface, which the short ``port datadir`` form would do), logs warnings to a file in its data
directory, and runs in its own process group so Ctrl-C on our terminal stops it through us, cleanly.

With ``tls`` (a secured sandbox) it serves only ZooKeeper's secure client port, through Netty: no
plain port at all, so neither the digest credentials nor any node's data can cross the network in
clear, even from a client set up wrongly. Its readiness probe then speaks TLS too.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

from spark_bookie.errors import StartupError

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
HOST = "127.0.0.1"
LOG_NAME = "zookeeper.log"  # log4j2 output (warnings and errors only)
OUT_NAME = "zookeeper.out"  # the JVM's stdout/stderr (crashes, log4j's own complaints)
CONFIG_NAME = "zoo.cfg"
LOG_CONFIG_NAME = "log4j2.properties"
_CLEAN_EXIT_CODES = (0, 143, -signal.SIGTERM)  # 143 = 128+SIGTERM, how the JVM reports it
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"   # the only one that serves TLS


class ZooKeeperError(StartupError):
    """The embedded ZooKeeper could not be started (the message says why and shows its log)."""


class JavaNotFoundError(ZooKeeperError):
    """No ``java`` executable: ZooKeeper is a Java program."""


class PortInUseError(ZooKeeperError):
    """The client port is already taken on 127.0.0.1."""


class ZooKeeperExitedError(ZooKeeperError):
    """The ZooKeeper process exited while starting (bad config, data dir, port race...)."""


class ZooKeeperStartTimeoutError(ZooKeeperError):
    """ZooKeeper did not answer ``ruok`` with ``imok`` (and serve requests) in time."""


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on the PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError("java not found (PATH or JAVA_HOME): the embedded ZooKeeper needs a JRE 17+")
    return found


def find_pyspark_jars() -> Path:
    """The ``jars`` folder of the installed pyspark, checked to contain ZooKeeper's server jar.

    Found without importing pyspark (which is slow and starts nothing we need here).
    """
    spec = importlib.util.find_spec("pyspark")
    candidates = [Path(p) / "jars" for p in (spec.submodule_search_locations or [])] if spec else []
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"]) / "jars")
    for jars in candidates:
        if any(jars.glob("zookeeper-3.*.jar")):
            return jars
    raise ZooKeeperError(f"no ZooKeeper jar in pyspark's jars (looked in {[str(c) for c in candidates]})")


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux: ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports this process handed out: a sandbox asks for all its bookies' ports before any binds, so
# "free now" alone gave two bookies one port (seen: the second found the first's cookie in
# ZooKeeper and refused to start).
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port_range(count: int, attempts: int = 100) -> int:
    """A base port such that base..base+count-1 are all free on 127.0.0.1 now (racy by nature, so
    bind soon).

    Never the same port twice in one process. The range lies below the kernel's ephemeral ports.
    A server's port here is its identity (a bookie id is host:port) and is bound again when the
    process restarts; a port in the ephemeral range can meanwhile be taken by any outgoing
    connection on the machine (seen in CI: a restarted bookie refused for minutes with "port in
    use").
    """
    low, top = _port_slice(10_000, _ephemeral_floor() - count)
    for _ in range(attempts):
        base = random.randrange(low, max(top, low + 1))
        ports = set(range(base, base + count))
        with _handed_out_lock:
            if ports & _handed_out or any(port_in_use(p) for p in ports):
                continue
            _handed_out.update(ports)
        return base
    raise ZooKeeperError(f"found no {count} consecutive free ports below {top + count}")


PORT_SLICE_ENV = "SPARK_BOOKIE_PORT_SLICE"


def _port_slice(low: int, top: int) -> tuple[int, int]:
    """The k-th of n equal parts of [low, top) when ``SPARK_BOOKIE_PORT_SLICE`` is "k/n": harnesses
    running side by side (the test suite's workers, and every process they start) then never pick
    each other's ports, which "never twice in one process" cannot promise across processes."""
    said = os.environ.get(PORT_SLICE_ENV, "")
    try:
        k, n = (int(x) for x in said.split("/"))
    except ValueError:
        return low, top
    if not 0 <= k < n:
        return low, top
    width = (top - low) // n
    return low + k * width, low + (k + 1) * width


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, outside the ephemeral range (see free_port_range)."""
    return free_port_range(1)


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether binding ``host:port`` would fail. SO_REUSEADDR as Java sets it, so a TIME_WAIT
    leftover of a previous ZooKeeper does not count as in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


@dataclass(frozen=True)
class ZooKeeperServerTls:
    """TLS on the embedded ZooKeeper's client port. ``key_store``: one PEM file holding the server's
    private key and certificate chain (ZooKeeper's PEM key store); ``trust_store``: the CA bundle of
    client certificates. With a trust store ZooKeeper asks clients for a certificate but also serves
    those without one (``ssl.clientAuth=want``): the digest credentials authenticate a session, TLS
    keeps them and the data private."""

    key_store: Path
    trust_store: Path | None = None

    def settings(self) -> dict[str, object]:
        """zoo.cfg's TLS keys (ZooKeeper makes each a ``zookeeper.``-prefixed system property)."""
        out: dict[str, object] = {"serverCnxnFactory": NETTY_FACTORY, "ssl.keyStore.location": self.key_store,
                                  "ssl.keyStore.type": "PEM", "ssl.clientAuth": "none"}
        if self.trust_store is not None:
            out.update({"ssl.trustStore.location": self.trust_store, "ssl.trustStore.type": "PEM",
                        "ssl.clientAuth": "want"})
        return out


def _probe_context() -> ssl.SSLContext:
    """TLS for our own readiness probe of the process we started: nothing secret is sent, and the
    certificate is the clients' to check."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def four_letter_word(port: int, command: str, timeout_s: float = 2.0, host: str = HOST,
                     tls: ssl.SSLContext | None = None) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ``mntr``...) and return the answer;
    over TLS with ``tls`` (a secure client port answers them too)."""
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        s = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
        try:
            s.sendall(command.encode("ascii"))
            if tls is None:
                s.shutdown(socket.SHUT_WR)   # a TLS socket cannot half-close: the server closes after answering
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        finally:
            if s is not raw:
                s.close()
    return b"".join(chunks).decode("utf-8", errors="replace")


class EmbeddedZooKeeper:
    """One standalone ZooKeeper server on ``127.0.0.1:port`` with its data in ``data_dir``.

    Restarting on the same ``data_dir`` keeps the data (and the sessions, until they time out).
    """

    def __init__(
        self,
        port: int,
        data_dir: str | Path,
        *,
        tick_time_ms: int = 500,
        min_session_timeout_ms: int = 2000,
        max_session_timeout_ms: int = 20000,
        heap_mb: int = 256,
        host: str = HOST,
        tls: ZooKeeperServerTls | None = None,
    ) -> None:
        """ZooKeeper ends a session at the first tick after its timeout ran out, so the tick is
        how late a dead bookie's session can end: with 1 s ticks a 2 s session lived up to 3 s.
        Half a second keeps that slack small; the shortest session stays 2 s
        (``min_session_timeout_ms``), as it was with 1 s ticks. ``host`` is the one address it binds:
        loopback by default; a multi-host harness gives the address its network namespaces reach
        (spark_bookie.local.hosts). ``tls``: serve the secure client port only (its port is
        ``port``)."""
        if not 0 < port < 65536:
            raise ValueError(f"bad ZooKeeper port {port}")
        if min_session_timeout_ms < 2 * tick_time_ms:
            raise ValueError(f"min_session_timeout_ms {min_session_timeout_ms} is below two ticks "
                             f"({2 * tick_time_ms} ms), ZooKeeper's own floor")
        self.port = port
        self.host = host
        self.data_dir = Path(data_dir).absolute()
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap_mb = heap_mb
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self._log_offsets: dict[Path, int] = {}  # where this run's output starts in each log
        self._lock = threading.Lock()

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        return f"EmbeddedZooKeeper({self.connect_string}, {str(self.data_dir)!r}, pid={self.pid})"

    # -- files ------------------------------------------------------------------------------
    def _write_config(self) -> Path:
        ports: dict[str, object] = {"clientPort": self.port, "clientPortAddress": self.host}
        if self.tls is not None:   # the secure port alone: no clientPort key, so no plain port is served
            ports = {"secureClientPort": self.port, "secureClientPortAddress": self.host, **self.tls.settings()}
        config = {
            "tickTime": self.tick_time_ms,
            "dataDir": self.data_dir,
            **ports,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "*",
            "minSessionTimeout": self.min_session_timeout_ms,
            "maxSessionTimeout": self.max_session_timeout_ms,
            "autopurge.snapRetainCount": 3,  # a long-lived sandbox must not fill its disk
            "autopurge.purgeInterval": 1,
        }
        path = self.data_dir / CONFIG_NAME
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        return path

    def _write_log_config(self) -> Path:
        """log4j2 (pyspark's jars bind slf4j to log4j2): WARN and above, to a file."""
        path = self.data_dir / LOG_CONFIG_NAME
        path.write_text(
            "status = warn\n"
            "appender.file.type = File\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_path}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n\n"
            "rootLogger.level = warn\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
            # warns "maxCnxns is not configured" on every start; unlimited is what we want
            "logger.cnxn.name = org.apache.zookeeper.server.ServerCnxnFactory\n"
            "logger.cnxn.level = error\n"
        )
        return path

    def java_command(self, java: str, jars: Path, config: Path, log_config: Path) -> list[str]:
        """The exact command line (exposed for logs and docs). The client JIT only
        (TieredStopAtLevel=1): an embedded ZooKeeper's load is light, and the optimising compiler's
        warm-up took a quarter of a 2-core machine's CPU during a re-replication benchmark (3.3 s
        -> 1.7 s of ZooKeeper CPU for ~8,500 requests)."""
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={log_config}",
            "-Dzookeeper.jmx.log4j.disable=true",
            *([f"-Dzookeeper.serverCnxnFactory={NETTY_FACTORY}"] if self.tls is not None else []),
            "-cp",
            f"{jars}/*",
            MAIN_CLASS,
            str(config),
        ]

    def log_tail(self, lines: int = 30) -> str:
        """The last lines this run wrote to ZooKeeper's log and the JVM's output, for error messages.

        Both files are appended to across restarts; older runs' lines are left out so that an old
        "Address already in use" cannot be mistaken for today's cause.
        """
        parts = []
        for path in (self.log_path, self.data_dir / OUT_NAME):
            try:
                with open(path, "rb") as f:
                    f.seek(self._log_offsets.get(path, 0))
                    text = f.read().decode(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(parts) if parts else "(ZooKeeper wrote no log)"

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server and return once it serves requests; a clear ZooKeeperError otherwise."""
        with self._lock:
            if self.running:
                return
            java = find_java()
            jars = find_pyspark_jars()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if port_in_use(self.port, self.host):
                raise PortInUseError(f"cannot start ZooKeeper: port {self.port} on {self.host} is already in use")
            command = self.java_command(java, jars, self._write_config(), self._write_log_config())
            self._log_offsets = {
                p: p.stat().st_size for p in (self.log_path, self.data_dir / OUT_NAME) if p.exists()
            }
            self._out = open(self.data_dir / OUT_NAME, "ab")  # closed in stop()
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        """Ready = ``ruok`` answers ``imok`` and ``srvr`` reports a mode.

        ``imok`` alone comes too early: the server answers it before its database is loaded.
        """
        deadline = time.monotonic() + timeout_s
        tls = _probe_context() if self.tls is not None else None
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._raise_exited(None if proc is None else proc.returncode)
            try:
                if four_letter_word(self.port, "ruok", 1.0, self.host, tls) == "imok" and "Mode:" in four_letter_word(
                    self.port, "srvr", 1.0, self.host, tls
                ):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise ZooKeeperStartTimeoutError(
            f"ZooKeeper on {self.connect_string} did not become ready within {timeout_s:g} s\n"
            + self.log_tail()
        )

    def _raise_exited(self, code: int | None) -> None:
        tail = self.log_tail()
        if "Address already in use" in tail:
            raise PortInUseError(
                f"cannot start ZooKeeper: port {self.port} on {self.host} is already in use\n{tail}"
            )
        raise ZooKeeperExitedError(f"ZooKeeper exited with code {code} while starting\n{tail}")

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Idempotent; returns the exit code."""
        with self._lock:
            proc, self._proc = self._proc, None
            out, self._out = self._out, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
            code = proc.returncode
        if out is not None:
            out.close()
        return code

    def __enter__(self) -> EmbeddedZooKeeper:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's own process group (it leads it: ``start_new_session``)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run_foreground(port: int, data_dir: str | Path) -> int:
    """``spark-bookie zookeeper``: start, print the connect string, serve until SIGTERM/SIGINT.

    Returns 0 after a signal and a clean stop, 1 if ZooKeeper failed to start or died on its own.
    Must run on the main thread (it installs signal handlers, restored on return).
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    zk = EmbeddedZooKeeper(port, data_dir)
    try:
        try:
            zk.start()
        except ZooKeeperError as e:
            print(f"spark-bookie zookeeper: {e}", file=sys.stderr)
            return 1
        print(zk.connect_string, flush=True)
        print(
            f"ZooKeeper serving on {zk.connect_string} (data {zk.data_dir}, log {zk.log_path})",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(0.5):
            if not zk.running:
                print(
                    f"spark-bookie zookeeper: ZooKeeper exited on its own\n{zk.log_tail()}", file=sys.stderr
                )
                return 1
        return 0
    finally:
        zk.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
