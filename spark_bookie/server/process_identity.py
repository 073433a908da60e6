"""Who wrote a registration: enough to tell, on the same machine, that its writer is dead.

A SIGKILLed bookie's ephemeral registration stays until its ZooKeeper session times out, and a
bookie restarted with the same id used to wait that long (10 s by default) before it could serve.
The node now carries the writing process's identity: the machine's boot id, its PID namespace,
the pid and the pid's start time (pids are reused, start times within one boot are not). A bookie
that finds its id registered by a process of this boot and PID namespace that no longer runs (or
whose pid now belongs to another process) removes the node and registers at once. Anything else
(another machine, boot or container, a live process, a node without these fields, a system
without /proc) is waited for as before: only a process that is certainly dead is taken over, so
two live bookies never share an id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def boot_id() -> str | None:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[inode]``): pids of another namespace (another
    container on the same machine) say nothing about processes here."""
    try:
        return os.readlink(PROC / "self/ns/pid")
    except OSError:
        return None


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first; a name
    may hold spaces and parentheses, so they start after the last ")"); None if no such process
    (or no /proc)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None if
    no such process (or no /proc)."""
    fields = stat_fields(pid)
    try:
        return None if fields is None else int(fields[19])
    except (IndexError, ValueError):
        return None


def this_process() -> dict[str, Any]:
    """The fields a registration carries about its writer (empty where /proc is missing)."""
    boot, ns, pid = boot_id(), pid_namespace(), os.getpid()
    started = start_ticks(pid)
    if boot is None or ns is None or started is None:
        return {}
    return {"boot_id": boot, "pid_ns": ns, "pid": pid, "pid_started": started}


def written_by_dead_process(data: bytes) -> bool:
    """Whether the registration ``data`` was written by a process of this machine's current boot
    and this PID namespace that is no longer running. False whenever that is not certain."""
    try:
        said = json.loads(data)
        boot, ns, pid, started = said["boot_id"], said["pid_ns"], int(said["pid"]), int(said["pid_started"])
    except (ValueError, TypeError, KeyError):
        return False
    here = boot_id()
    if here is None or boot != here or ns != pid_namespace() or pid <= 0 or pid == os.getpid():
        return False
    now = start_ticks(pid)
    if now is None:
        return (PROC / "self").exists()   # no such pid, and /proc works: the writer is gone
    return now != started   # the pid was reused by another process
