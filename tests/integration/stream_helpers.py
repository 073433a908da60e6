"""Helpers for stream tests: a writer in a child process that reports each acknowledged record."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

WRITER_SCRIPT = """
import sys
from ledger_client import LedgerClient, ClientConfig
zk, ns, stream, count, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
c = LedgerClient(zk, config=ClientConfig(zk_session_timeout_ms=4000))
w = c.namespace(ns).open_writer(stream, lock_timeout_ms=30_000)
print("open", flush=True)
def report(f, i):
    d = f.result()
    print(f"ack {i} {d}", flush=True)
for i in range(start, start + count):
    f = w.write_async(b"rec-%08d" % i, txid=i)
    f.add_done_callback(lambda f, i=i: report(f, i))
    if i % 50 == 0:
        w.flush()
w.flush()
print("done", flush=True)
sys.stdin.read()  # wait to be killed
"""


class WriterProcess:
    """`python -c WRITER_SCRIPT`: writes records `start..start+count-1` (payload b"rec-%08d", txid
    = i), printing `ack <i> <dlsn>` as each is acknowledged; killed by the test."""

    def __init__(self, zk: str, ns: str, stream: str, count: int, start: int = 0, workdir: Path | None = None) -> None:
        self.acked: dict[int, str] = {}
        self.lines: list[str] = []
        self.opened = threading.Event()
        self.done = threading.Event()
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, zk, ns, stream, str(count), str(start)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=workdir)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("ack "):
                _, i, dlsn = line.split()
                self.acked[int(i)] = dlsn
            elif line.startswith("open"):
                self.opened.set()
            elif line.startswith("done"):
                self.done.set()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)


def writes(w, payload: bytes) -> bool:
    """Whether the writer takes a record now (False: a quota refused it)."""
    from ledger_client import errors

    try:
        w.write(payload)
        return True
    except errors.QuotaExceededError:
        return False


def payload(i: int) -> bytes:
    return b"rec-%08d" % i


def read_all(ns, stream: str, expect: int, timeout_s: float = 60.0, **kw) -> list:
    """At least ``expect`` records from a reader (then whatever else is ready)."""
    import time

    from ledger_client import errors

    out: list = []
    deadline = time.monotonic() + timeout_s
    with ns.open_reader(stream, **kw) as r:
        try:
            while len(out) < expect and time.monotonic() < deadline:
                out += r.read_batch(100_000, 500)
            out += r.read_batch(100_000, 200)
        except errors.EndOfStreamError:
            pass
    return out
