"""Which registrations a restarted bookie may take over: only those whose writer is certainly dead."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_bookie.server import process_identity as pi

pytestmark = pytest.mark.unit


def _data(**fields: object) -> bytes:
    return json.dumps({"id": "127.0.0.1:3181", **fields}).encode()


def test_a_live_process_and_this_process_are_never_dead():
    me = pi.this_process()
    assert set(me) == {"boot_id", "pid_ns", "pid", "pid_started"}
    assert not pi.written_by_dead_process(_data(**me))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as live:
        try:
            started = pi.start_ticks(live.pid)
            assert started is not None
            assert not pi.written_by_dead_process(_data(**{**me, "pid": live.pid, "pid_started": started}))
        finally:
            live.kill()


def test_an_exited_process_or_a_reused_pid_is_dead():
    me = pi.this_process()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(gone.stdout)
    if pi.start_ticks(pid) is None:   # (the pid may already belong to someone else: then the next case)
        assert pi.written_by_dead_process(_data(**{**me, "pid": pid, "pid_started": 1}))
    # A pid that runs, but started at another time than the writer did: reused, so the writer is gone.
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as other:
        try:
            started = pi.start_ticks(other.pid)
            assert started is not None
            assert pi.written_by_dead_process(_data(**{**me, "pid": other.pid, "pid_started": started - 1}))
            # the same pid in another PID namespace (another container) says nothing about it
            assert not pi.written_by_dead_process(_data(**{**me, "pid_ns": "pid:[1]", "pid": other.pid,
                                                           "pid_started": started - 1}))
        finally:
            other.kill()


@pytest.mark.parametrize("data", [
    b"not json", b"[]", _data(), _data(boot_id="x", pid=1),
    _data(boot_id="another-boot", pid_ns="pid:[1]", pid=2 ** 22 + 1, pid_started=1),   # another machine or boot
    _data(boot_id=None, pid=2 ** 22 + 1, pid_started=1),
    _data(boot_id=pi.boot_id(), pid=2 ** 22 + 1, pid_started=1),   # no namespace said: not certain
    _data(boot_id=pi.boot_id(), pid_ns=pi.pid_namespace(), pid=0, pid_started=1),   # not a process's pid
    _data(boot_id=pi.boot_id(), pid_ns=pi.pid_namespace(), pid=-7, pid_started=1),
])
def test_anything_not_certain_is_not_dead(data):
    assert not pi.written_by_dead_process(data)


def test_without_proc_nothing_is_dead(monkeypatch, tmp_path):
    me = pi.this_process()
    monkeypatch.setattr(pi, "PROC", tmp_path / "no-proc")
    assert pi.this_process() == {}
    assert not pi.written_by_dead_process(_data(**{**me, "pid": 2 ** 22 + 1, "pid_started": 1}))
