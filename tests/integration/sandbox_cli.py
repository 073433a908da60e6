"""`spark-bookie sandbox` run as a user runs it: a child process in a directory, its output in a
file, stopped with Ctrl-C (SIGINT); waits are on the lines it prints, never on sleeps."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from bookie_helpers import wait_until

READY = "press Ctrl-C to stop"
REPO = Path(__file__).resolve().parents[2]


class SandboxRun:
    """One `spark-bookie sandbox ARGS` in ``cwd``; ``start`` returns once it printed READY or exited."""

    def __init__(self, cwd: Path, *args: str, name: str = "run") -> None:
        self.cwd = cwd
        self.args = args
        self.out = cwd / f"{name}.out"
        self.err = cwd / f"{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> SandboxRun:
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "sandbox", *self.args],
                                         cwd=self.cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        wait_until(lambda: READY in self.stdout or self.proc.poll() is not None, timeout_s, f"sandbox {self.args}")
        return self

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and READY in self.stdout

    def line(self, pattern: str) -> str:
        """The first group of ``pattern`` in a line of the output."""
        m = re.search(pattern, self.stdout, re.M)
        assert m, (pattern, self.stdout, self.stderr)
        return m.group(1)

    @property
    def zk(self) -> str:
        return self.line(r"^export SPARK_BOOKIE_ZK=(\S+)$")

    def interrupt(self, timeout_s: float = 180.0) -> int:
        """Ctrl-C, as a terminal sends it to the foreground process; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)

    def describe(self) -> str:
        return f"sandbox {' '.join(self.args)}:\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"


def run_cli(cwd: Path, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`spark-bookie sandbox ARGS` expected to fail at once."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "sandbox", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def assert_one_line_error(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    errors = [x for x in done.stderr.splitlines() if x.startswith("spark-bookie: error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(errors) == 1 and fragment in errors[0], done.stderr
