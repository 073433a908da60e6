"""What several benchmarks share: the raw disk's own limits (the baselines a journal is measured
against), percentiles, and CPU time of this or another process."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REDIS_MISSING = "redis-server is not installed (scripts/bootstrap installs it as root)"


def raw_fsync_per_write(d: Path, writes: int = 2000, size: int = 1024) -> dict[str, float]:
    """1 KiB write + fdatasync each, into a preallocated file (the best a non-batching journal can do)."""
    path = d / "raw-fsync.bin"
    buf = os.urandom(size)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, writes * size)
        os.fsync(fd)
        lat = []
        t0 = time.perf_counter()
        for _ in range(writes):
            t = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {"writes_per_s": writes / elapsed, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def raw_group_commit(d: Path, total_bytes: int = 256 << 20, chunk: int = 1 << 20) -> dict[str, float]:
    """1 MiB writes + fdatasync each: the disk's group-commit ceiling."""
    path = d / "raw-group.bin"
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, total_bytes)
        os.fsync(fd)
        t0 = time.perf_counter()
        for _ in range(total_bytes // chunk):
            os.write(fd, buf)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {"mb_per_s": total_bytes / elapsed / 1e6}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k] * 1000.0



def proc_stat(pid: int | str) -> tuple[str, list[str]]:
    """A process's command name and the fields of /proc/PID/stat after it (a name may hold spaces
    and parentheses: the fields start after the last ")")."""
    head, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    return head.split("(", 1)[1], rest.split()


def stat_cpu_seconds(fields: list[str]) -> float:
    """User + system CPU from proc_stat's fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU of this process (pid None) or of another one (from /proc)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    return stat_cpu_seconds(proc_stat(pid)[1])


@contextmanager
def redis_server(workdir: Path) -> Iterator[int | None]:
    """A Redis with appendfsync always (every write fsynced, one copy: the benchmarks' peer) on a
    free loopback port, answering pings; yields its port, or None where redis-server is missing."""
    server = shutil.which("redis-server")
    if server is None:
        yield None
        return
    import redis  # the client library is a test/bench dependency

    from spark_bookie.local.zookeeper import free_port

    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def finish(res: dict[str, Any], json_path: str, report: Callable[[dict[str, Any]], None]) -> int:
    """The end of a benchmark run: the load average at its end, the printed table (which also
    decides the goals), and the JSON of everything."""
    res["load_average_at_end"] = os.getloadavg()
    report(res)
    Path(json_path).write_text(json.dumps(res, indent=2))
    print(f"results written to {json_path}")
    return 0


def timed_threads(count: int, target: Callable[[int], None]) -> float:
    """Run ``target(k)`` for k in 0..count-1 on threads of their own, all at once; the seconds they
    took together (a peer's concurrent clients)."""
    import threading

    threads = [threading.Thread(target=target, args=(k,)) for k in range(count)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0
