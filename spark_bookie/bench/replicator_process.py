"""The replicator as `bench replicate` runs it: `spark-bookie replicate` as a process of its own
(as a user starts it), its CPU, its Spark JVM paused and resumed (a backlog behind a running
replicator), and its /metrics sampled in a thread."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from spark_bookie.bench.common import proc_stat, stat_cpu_seconds

READY_RE = re.compile(r"^replicating .*", re.M)
METRICS_RE = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
SAMPLE_RE = re.compile(r'^(replication_lag_seconds|replication_lag_records)\{stream="([^"]+)"\} (\S+)$', re.M)


def session_processes(sid: int) -> list[tuple[int, str, float]]:
    """Every live process of session ``sid`` (the replicator, its Spark JVM, its Python workers):
    (pid, command name, CPU seconds)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            name, fields = proc_stat(d.name)
            if int(fields[3]) == sid:
                found.append((int(d.name), name, stat_cpu_seconds(fields)))
        except (OSError, IndexError, ValueError):
            continue
    return found


def session_cpu_seconds(sid: int) -> float:
    """CPU of every live process of session ``sid``."""
    return sum(cpu for _pid, _name, cpu in session_processes(sid))


class ReplicatorProcess:
    """`spark-bookie replicate ...` in a session of its own; its log, its ready time and port."""

    def __init__(self, zk_a: str, zk_b: str, streams: str, workdir: Path, trigger_interval_ms: int | None,
                 max_records_per_trigger: int | None = None) -> None:
        exe = Path(sys.executable).parent / "spark-bookie"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "spark_bookie"]
        self.cli_args = ["replicate", "--from", zk_a, "--to", zk_b, "--streams", streams,
                         "--checkpoint", str(workdir / "checkpoint"), "--metrics-port", "0"]
        if trigger_interval_ms is not None:
            self.cli_args += ["--trigger-interval-ms", str(trigger_interval_ms)]
        if max_records_per_trigger is not None:
            self.cli_args += ["--max-records-per-trigger", str(max_records_per_trigger)]
        self.argv = cmd + self.cli_args
        self.log = workdir / "replicate.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.started = self.ready = 0.0

    def settings(self) -> dict[str, Any]:
        """The replication's settings as the command builds them (its arguments over the defaults;
        bench may not import the CLI, whose own defaults for these are ReplicationConfig's)."""
        import dataclasses

        from jobs.replication_config import ReplicationConfig

        given = dict(zip(self.cli_args[1::2], self.cli_args[2::2], strict=False))
        cfg = ReplicationConfig(given["--from"], given["--to"], given["--streams"], given["--checkpoint"],
                                metrics_port=int(given["--metrics-port"]))
        if "--trigger-interval-ms" in given:
            cfg = dataclasses.replace(cfg, trigger_interval_ms=int(given["--trigger-interval-ms"]))
        if "--max-records-per-trigger" in given:
            cfg = dataclasses.replace(cfg, max_records_per_trigger=int(given["--max-records-per-trigger"]))
        return {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in ("from_client_conf", "to_client_conf", "subscription", "metrics_host")}

    def start(self, timeout_s: float = 300.0) -> None:
        env = {**os.environ}
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if READY_RE.search(text):
                self.ready = time.monotonic()
                m = METRICS_RE.search(text)
                self.port = int(m.group(1)) if m else None
                return
            self.check()
            time.sleep(0.05)
        raise RuntimeError(f"the replicator did not start in {timeout_s:.0f} s:\n{self.tail()}")

    def recent_batches(self) -> list[dict[str, Any]]:
        """The query's last batches as the replicator's status.json lists them (rows, trigger time)."""
        try:
            doc = json.loads((self.log.parent / "checkpoint" / "status.json").read_text())
        except (OSError, ValueError):
            return []
        return list(doc.get("query", {}).get("recent") or [])

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the replicator exited {self.proc.returncode}:\n{self.tail()}")

    def cpu_seconds(self) -> float:
        return session_cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def metrics(self) -> list[tuple[str, str, float]]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        return [(m.group(1), m.group(2), float(m.group(3))) for m in SAMPLE_RE.finditer(text)]

    def pause_spark(self) -> int:
        """SIGSTOP the replicator's Spark JVM: no micro-batch runs, while the replicator's Python
        processes (their ZooKeeper sessions, its monitor) go on. Returns the JVM's pid."""
        if self.proc is None:
            raise RuntimeError("the replicator was not started")
        jvms = [pid for pid, name, _cpu in session_processes(self.proc.pid) if name == "java"]
        if len(jvms) != 1:
            raise RuntimeError(f"expected one Spark JVM in the replicator's session, found {jvms}")
        os.kill(jvms[0], signal.SIGSTOP)
        return jvms[0]

    @staticmethod
    def resume_spark(pid: int) -> None:
        os.kill(pid, signal.SIGCONT)

    def stop(self) -> int | None:
        from spark_bookie.local.processes import stop_session

        return stop_session(self.proc)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class MetricsSampler:
    """The replicator's /metrics every ``interval_s``, in a thread: the largest value of each
    (phase, metric, stream) seen, and how many scrapes worked or failed."""

    def __init__(self, rep: ReplicatorProcess, interval_s: float = 0.5) -> None:
        self.rep, self.interval_s = rep, interval_s
        self.phase = "backlog"
        self.max: dict[str, dict[str, dict[str, float]]] = {}
        self.scrapes = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)

    def start(self) -> MetricsSampler:
        if self.rep.port is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                samples = self.rep.metrics()
            except OSError:
                self.failures += 1
                continue
            self.scrapes += 1
            for metric, stream, value in samples:
                per = self.max.setdefault(self.phase, {}).setdefault(metric, {})
                per[stream] = max(per.get(stream, value), value)
