"""The directory of `spark-bookie sandbox` (default ``./.sandbox``) and what a second start in it does.

Everything a sandbox makes lives there: ZooKeeper's data, each bookie's journal and ledgers (whose
cookie names the bookie's ``host:port``), a Spark sandbox's slots, a secured sandbox's CA, tokens
and ZooKeeper credentials (which its ZooKeeper data's ACL names), and ``sandbox.json``, the record
of what ran: the mode, ZooKeeper's port, the bookies' ports and the processes.

**A start is fresh unless ``--resume`` is given**, as BookKeeper's ``localbookie`` starts clean:
the previous sandbox's data belongs to the ports it ran on, and a new start picks new ones, so
kept data would only make the bookies refuse their cookies. A fresh start says which directory
it wipes, and wipes only what sandboxes make there: a ``--root`` holding anything else is refused,
never emptied. ``--resume`` brings the previous sandbox back as it was (same mode, same ports, same
data, same credentials) or says in one line why it cannot (no record, other flags, a port taken).
While a sandbox runs it holds an flock on ``sandbox.lock``: a second one in the same directory
stops at once, before touching anything, and so does one that finds processes of the previous
sandbox still running (its terminal was closed, say).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from spark_bookie.local.sandbox import SandboxError
from spark_bookie.local.zookeeper import port_in_use

RECORD_NAME = "sandbox.json"
LOCK_NAME = "sandbox.lock"
# What sandboxes (and their demos) make in their directory; nothing else is ever deleted.
MADE_BY_SANDBOXES = re.compile(r"(zookeeper|bookie-\d+|bookie\.toml|data|secure|driver\.log|hosts-sandbox|"
                               r"checkpoints|delta|sandbox\.json|sandbox\.lock)")
BOOKIES, SPARK, HOSTS = "bookies", "spark", "hosts"


@dataclass
class SandboxRecord:
    """What a sandbox ran as: its shape (mode, secure, bookies, http, hosts), then, once up, its
    ports and processes. ``bookie_ports``: each bookie's (Spark: base_port + slot)."""

    mode: str
    secure: bool
    bookies: int
    http: bool = False
    hosts: int = 0
    zk_port: int = 0
    bookie_ports: list[int] = field(default_factory=list)
    http_ports: list[int] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)   # hosts: each host's address
    pids: list[int] = field(default_factory=list)

    def flags(self) -> str:
        """The sandbox command line that makes this shape."""
        mode = {SPARK: " --spark", HOSTS: f" --hosts {self.hosts}"}.get(self.mode, "")
        count = f" --bookies {self.bookies}" if self.mode != HOSTS else ""
        return f"sandbox{mode}{count}{' --secure' if self.secure else ''}{' --http' if self.http else ''}"

    def ports(self) -> list[tuple[str, int]]:
        """(address, port) of everything it listens on that can be checked from here."""
        out = [("127.0.0.1", self.zk_port)] if self.mode != HOSTS or _loopback(self.addresses) else []
        if self.mode == HOSTS:
            return out + [(a, p) for a, p in zip(self.addresses, self.bookie_ports, strict=False) if _loopback([a])]
        return out + [("127.0.0.1", p) for p in self.bookie_ports + self.http_ports]


def _loopback(addresses: list[str]) -> bool:
    return all(a.startswith("127.") for a in addresses)


class SandboxDir:
    """One sandbox directory: its lock, its record, its fresh start or resume."""

    def __init__(self, root: str | Path, say: Callable[[str], object] | None = None) -> None:
        self.root = Path(root).absolute()
        self._say = say or (lambda line: print(line, flush=True))
        self._lock: IO[str] | None = None

    @contextmanager
    def claim(self, shape: SandboxRecord, resume: bool) -> Iterator[SandboxRecord | None]:
        """Hold the directory while the sandbox runs; yields the record to resume (``resume``) or
        None after wiping the previous sandbox (fresh). SandboxError, one line, when it cannot."""
        self._precheck(resume)   # before the lock file: a refused directory is left as it was
        self._take_lock()
        try:
            previous = self.previous()
            self._check_no_survivors(previous)
            if resume:
                record = self._resumable(previous, shape)
                self._say(f"sandbox directory {self.root}: resuming the previous sandbox ({record.flags()}) "
                          f"with its data, ZooKeeper on port {record.zk_port}")
                yield record
            else:
                wiped = self._wipe()
                self._say(f"sandbox directory {self.root}: " + (
                    "deleted the previous sandbox's data, starting fresh (--resume brings a sandbox back)"
                    if wiped else "starting fresh"))
                yield None
        finally:
            self._release_lock()

    def save(self, record: SandboxRecord) -> None:
        """Write the record of a sandbox that is up (what --resume reads)."""
        tmp = self.root / (RECORD_NAME + ".tmp")
        tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
        tmp.replace(self.root / RECORD_NAME)

    def previous(self) -> SandboxRecord | None:
        """The last sandbox's record; None if there is none (or it is unreadable)."""
        try:
            return SandboxRecord(**json.loads((self.root / RECORD_NAME).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    # -- the lock ---------------------------------------------------------------------------
    def _precheck(self, resume: bool) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise SandboxError(f"{self.root} is not a directory: choose another --root")
        if resume:
            self._resumable_record(self.previous())
        elif self.root.exists():
            self._check_only_sandbox_files()

    def _take_lock(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        f = open(self.root / LOCK_NAME, "a+")  # noqa: SIM115 (held while the sandbox runs)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise SandboxError(f"a sandbox is already running in {self.root} (pid {holder}): stop it first, "
                               "or give this one another --root") from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock = f

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- fresh or resumed -------------------------------------------------------------------
    def _check_no_survivors(self, previous: SandboxRecord | None) -> None:
        """Processes of the previous sandbox that outlived it would hold its ports and files."""
        alive = [pid for pid in (previous.pids if previous else []) if self._runs_here(pid)]
        if alive:
            pids = " ".join(map(str, alive))
            raise SandboxError(f"processes of the previous sandbox in {self.root} are still running (pids {pids}): "
                               f"stop them first (kill {pids})")

    def _runs_here(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.root).encode() in cmdline

    def _check_only_sandbox_files(self) -> list[Path]:
        """What the directory holds besides the lock; SandboxError if a sandbox did not make all of it."""
        entries = [p for p in self.root.iterdir() if p.name != LOCK_NAME]
        strangers = sorted(p.name for p in entries if not MADE_BY_SANDBOXES.fullmatch(p.name))
        if strangers:
            raise SandboxError(f"{self.root} holds {', '.join(strangers[:3])}, which no sandbox makes: not deleting "
                               "it; give another --root (or empty that directory)")
        return entries

    def _wipe(self) -> bool:
        """Delete what the previous sandbox made; refuse (deleting nothing) if anything else is there."""
        entries = self._check_only_sandbox_files()
        for p in entries:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        return bool(entries)

    def _resumable_record(self, previous: SandboxRecord | None) -> SandboxRecord:
        if previous is None or not previous.zk_port:
            raise SandboxError(f"no sandbox to resume in {self.root} (no {RECORD_NAME}: none ran there, or it "
                               "stopped before it was up); start without --resume for a fresh one")
        return previous

    def _resumable(self, found: SandboxRecord | None, shape: SandboxRecord) -> SandboxRecord:
        previous = self._resumable_record(found)
        same = (previous.mode, previous.secure, previous.hosts) == (shape.mode, shape.secure, shape.hosts) and (
            shape.bookies in (0, previous.bookies))
        if not same:
            raise SandboxError(f"the sandbox in {self.root} ran as `{previous.flags()}`: resume it with those "
                               "flags, or start without --resume for a fresh one")
        taken = [f"{a}:{p}" for a, p in previous.ports() if port_in_use(p, a)]
        if taken:
            raise SandboxError(f"cannot resume the sandbox in {self.root}: its port {', '.join(taken)} is in use by "
                               "another program; start without --resume for a fresh one on new ports")
        return previous
