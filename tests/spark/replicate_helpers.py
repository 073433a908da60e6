"""Two clusters and a `spark-bookie replicate` process, for the replication tests (DESIGN §4.12)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from hosting_helpers import wait_until

from spark_bookie.local.processes import stop_session

METRICS_RE = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")


def two_clusters(zk_server: str, root: Path, bookies: int = 3, settings: tuple[dict, dict] = ({}, {})
                 ) -> tuple[object, object]:
    """Sandboxes A and B of real bookies, each under a ZooKeeper chroot of its own (``settings``:
    each one's bookie settings beyond the tests' usual ones)."""
    from spark_bookie.local.sandbox import Sandbox

    out = []
    for name, extra in zip(("a", "b"), settings, strict=True):
        sb = Sandbox(root / f"cluster-{name}", bookies, zk_connect=f"{zk_server}/{name}-{uuid.uuid4().hex[:8]}/ledgers",
                     bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, **extra})
        sb.start()
        out.append(sb)
    return out[0], out[1]


class Replicator:
    """`spark-bookie replicate` in a process of its own (so that it can be killed with SIGKILL)."""

    def __init__(self, a: str, b: str, streams: str, checkpoint: Path, *extra: str) -> None:
        self.args = [sys.executable, "-m", "spark_bookie", "replicate", "--from", a, "--to", b, "--streams", streams,
                     "--checkpoint", str(checkpoint), "--metrics-port", "0", "--trigger-interval-ms", "200", *extra]
        self.log = checkpoint.parent / f"replicate-{checkpoint.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self._since = 0

    def start(self, timeout_s: float = 120) -> Replicator:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        self._since = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        wait_until(lambda: self._port() is not None or self.proc.poll() is not None, timeout_s,
                   "the replicator to start")
        assert self.proc.poll() is None, self.tail()
        return self

    def _port(self) -> int | None:
        m = METRICS_RE.search(self.log.read_bytes()[self._since:].decode(errors="replace"))
        self.port = int(m.group(1)) if m else None
        return self.port

    def metrics(self) -> dict[str, float]:
        """replication_* samples of /metrics: 'name{stream="x"}' -> value."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("replication_")}

    def kill9(self) -> None:
        """SIGKILL the replicator and its Spark JVM (its process group), as a crash would."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        return stop_session(self.proc)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def status(checkpoint: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "spark_bookie", "replicate", "status", "--checkpoint",
                          str(checkpoint), "--json", *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def records(ns, stream: str) -> list[tuple[int, bytes]]:
    """Every record a reader returns now, from the start: (txid, payload)."""
    from ledger_client import errors

    got: list = []
    with ns.open_reader(stream) as r:
        try:
            while batch := r.read_batch(100_000, 300):
                got += batch
        except errors.EndOfStreamError:
            pass
    return [(rec.txid, rec.payload) for rec in got]


def wait_replicated(a_ns, b_ns, stream: str, timeout_s: float, rep: Replicator | None = None) -> list:
    """Until B's stream holds exactly A's records (order, txids, payloads); B's records."""
    def same() -> bool:
        if rep is not None and rep.proc is not None and rep.proc.poll() is not None:
            raise AssertionError(f"the replicator exited {rep.proc.returncode}:\n{rep.tail()}")
        if not b_ns.stream_exists(stream):
            return False
        dst = records(b_ns, stream)
        src = records(a_ns, stream)   # read second: a source that grows meanwhile still holds dst whole
        n = min(len(src), len(dst))    # (a reader may also stop early at a slow tail: compare what both read)
        assert dst[:n] == src[:n], f"{stream}: the replica is not a prefix of its source: {_diff(src, dst)}"
        return len(dst) == len(src)

    deadline = time.monotonic() + timeout_s
    wait_until(same, timeout_s, f"{stream} to be replicated")
    assert time.monotonic() <= deadline + 1
    return records(b_ns, stream)


def _diff(src: list, dst: list) -> str:
    at = next((i for i, (x, y) in enumerate(zip(src, dst, strict=False)) if x != y), min(len(src), len(dst)))
    return (f"{len(src)} source records, {len(dst)} in the replica, first difference at {at}: "
            f"source {src[at:at + 2]!r:.200} replica {dst[at:at + 2]!r:.200}")
