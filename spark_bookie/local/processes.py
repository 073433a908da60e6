"""Ending a process that runs in a session of its own (a replicator, a Spark application): SIGTERM
first, so that it can stop cleanly, then SIGKILL to its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_session(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, grace_s: float = 60.0) -> int | None:
    """SIGTERM ``proc``; after ``grace_s`` SIGKILL its process group (started with
    ``start_new_session=True``). Its exit code (-9 when it had to be killed), or None if never started."""
    if proc is None or proc.poll() is not None:
        return None if proc is None else proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(30)
