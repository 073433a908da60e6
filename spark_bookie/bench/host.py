"""What the host gives a latency benchmark, measured in the same run as the benchmark.

On a virtual machine whose host is busy, a thread woken on an idle virtual CPU can wait
milliseconds before it runs (counted as "steal" in /proc/stat). An append at 1,000/s is a chain
of such wake-ups (writer, bookie, journal, fdatasync, reader), so its tail follows the host's:
on the same 2-core machine, p99 at 1,000/s went from under 5 ms on a quiet day to 10-60 ms on a
day when a bare round trip between two processes had a p99 of 2.5-3.5 ms. Reporting both lets
a reader tell a slower build from a busier host.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

_ECHO = "import socket,sys\ns=socket.socket(fileno=int(sys.argv[1]))\nwhile (d:=s.recv(64)):\n    s.sendall(d)\n"


def cpu_times() -> list[int]:
    """The host's CPU time counters (first line of /proc/stat: user nice system idle iowait irq
    softirq steal ...)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    """Fraction of the host's CPU time between two `cpu_times()` that the hypervisor took."""
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8])
    return delta[7] / total if len(delta) > 7 and total > 0 else 0.0


def _paced(rate: float, seconds: float, op: Callable[[int], None]) -> list[float]:
    """`op(i)` `rate` times a second (open loop, like the append latency run); its durations in seconds."""
    times: list[float] = []
    t0 = time.perf_counter()
    for i in range(max(1, int(rate * seconds))):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - start)
    return times


def round_trips(rate: float = 1000.0, seconds: float = 3.0) -> list[float]:
    """One byte to another process and back, `rate` times a second: the round-trip times, the
    floor under any request/answer latency."""
    mine, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()

    def trip(_: int) -> None:
        mine.sendall(b"x")
        mine.recv(64)

    try:
        mine.settimeout(10)
        trip(0)  # the echo process has started once this comes back
        return _paced(rate, seconds, trip)
    finally:
        mine.close()
        echo.wait(timeout=10)


def thread_handoffs(rate: float = 1000.0, seconds: float = 3.0) -> list[float]:
    """An item put on a queue.Queue by one thread and taken by another blocked on it, `rate` times
    a second: the floor under each hand-off between two threads of one Python process (a record
    crosses several on its way from a writer to a tailing reader)."""
    q: queue.Queue[float] = queue.Queue()
    got: list[float] = []

    def take() -> None:
        while (sent := q.get()) >= 0:
            got.append(time.perf_counter() - sent)

    taker = threading.Thread(target=take, name="handoff-probe", daemon=True)
    taker.start()
    try:
        _paced(rate, seconds, lambda _i: q.put(time.perf_counter()))
    finally:
        q.put(-1.0)
        taker.join(10)
    return got


def fdatasyncs(directory: Path, rate: float = 1000.0, seconds: float = 3.0, record_bytes: int = 1024) -> list[float]:
    """A `record_bytes` write and an fdatasync into a preallocated file in `directory`, `rate`
    times a second: the disk's floor under a durable add (a bookie's journal does at least this
    per group, and E3/Qw3/Qa2 waits for the second of three bookies doing it on this disk)."""
    path = directory / "fdatasync-probe"
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    data = os.urandom(record_bytes)

    def write(i: int) -> None:
        os.pwrite(fd, data, i * record_bytes)
        os.fdatasync(fd)

    try:
        os.posix_fallocate(fd, 0, max(1, int(rate * seconds)) * record_bytes)
        os.fsync(fd)
        return _paced(rate, seconds, write)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
