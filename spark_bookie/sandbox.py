"""A whole cluster on one machine: embedded ZooKeeper plus N real bookie processes.

BookKeeper's `localbookie`. Used by `spark-bookie sandbox`, by the README's main command and by
the integration tests, which kill bookies with SIGKILL and restart them on the same directories.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadata import MetadataStore
from metadata import connect as connect_metadata

from .zookeeper import EmbeddedZooKeeper, free_port

log = logging.getLogger(__name__)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_conf(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("[bookie]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in settings.items()))
    return path


@dataclass
class BookieProcess:
    """One `spark-bookie bookie` child process with fixed directories and port."""

    zk: str
    port: int
    root: Path
    settings: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _log_offset: int = 0

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledgers"

    @property
    def log_path(self) -> Path:
        return self.root / "bookie.log"

    def command(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "spark_bookie.cli", "bookie", "--zk", self.zk, "--port", str(self.port),
               "--journal-dir", str(self.journal_dir), "--ledger-dir", str(self.ledger_dir)]
        if self.settings:
            cmd += ["--conf", str(write_conf(self.root / "bookie.toml", self.settings))]
        return cmd

    def start(self) -> None:
        cmd = self.command()
        with open(self.log_path, "ab") as logf:
            self._log_offset = logf.tell()
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_registered(self, store: MetadataStore, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"bookie {self.bookie_id} exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            # `spark-bookie bookie` prints "ready" after registering; a stale znode of a killed
            # predecessor must not count, so both the line (from this run) and the node are required.
            if self._says_ready() and self.bookie_id in (store.list_bookies()
                                                         + store.list_bookies(readonly=True)):
                return
            time.sleep(0.05)
        raise TimeoutError(f"bookie {self.bookie_id} did not register in {timeout_s}s:\n" + self.log_tail())

    def _says_ready(self) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f"bookie {self.bookie_id} ready".encode() in f.read()
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM and wait (graceful); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Sandbox:
    """Embedded ZooKeeper + `bookies` bookie processes under `root`."""

    def __init__(self, root: str | Path, bookies: int = 3, *, zk_port: int | None = None,
                 zk_connect: str | None = None, bookie_settings: dict[str, Any] | None = None) -> None:
        """With `zk_connect`, use that (running) ZooKeeper instead of starting an embedded one."""
        self.root = Path(root)
        self.zk: EmbeddedZooKeeper | None = None
        self._zk_connect = zk_connect
        if zk_connect is None:
            self.zk = EmbeddedZooKeeper(zk_port or free_port(), self.root / "zookeeper")
        self.settings = dict(bookie_settings or {})
        self.bookies: list[BookieProcess] = []
        self._count = bookies
        self.store: MetadataStore | None = None

    @property
    def connect_string(self) -> str:
        if self.zk is not None:
            return self.zk.connect_string
        return self._zk_connect or ""

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.zk is not None:
            self.zk.start()
        self.store = connect_metadata(self.connect_string)
        self.store.init_cluster()
        for _ in range(self._count):
            self.add_bookie(wait=False)
        for b in self.bookies:
            b.wait_registered(self.store)

    def add_bookie(self, wait: bool = True, **settings: Any) -> BookieProcess:
        i = len(self.bookies)
        b = BookieProcess(self.connect_string, free_port(), self.root / f"bookie-{i}",
                          {**self.settings, **settings})
        self.bookies.append(b)
        b.start()
        if wait and self.store is not None:
            b.wait_registered(self.store)
        return b

    def restart(self, b: BookieProcess, wait: bool = True) -> None:
        b.start()
        if wait and self.store is not None:
            b.wait_registered(self.store)

    def stop(self) -> None:
        for b in self.bookies:
            try:
                b.stop()
            except Exception:
                log.exception("stopping %s", b.bookie_id)
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.zk is not None:
            self.zk.stop()

    def __enter__(self) -> Sandbox:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
