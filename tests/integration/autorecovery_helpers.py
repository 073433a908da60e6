"""Helpers for the autorecovery integration tests: fast settings, ledgers, and full-replication checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from bookie_helpers import wait_until
from client_helpers import data

from ledger_client import LedgerClient
from ledger_client.machines import write_set
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType
from metadata import MetadataStore, NoNodeError

#: Short periods so each test takes seconds (the defaults are BookKeeper's: tens of seconds).
FAST_AUTORECOVERY = {
    "zk_session_timeout_ms": 4000,
    "open_ledger_rereplication_grace_ms": 1000,
    "worker_backoff_ms": 300,
    "worker_backoff_max_ms": 2000,
    "acquire_poll_ms": 300,
    "audit_interval_ms": 60_000,
    "check_all_ledgers_interval_ms": 0,
    "replicas_check_interval_ms": 0,
    "placement_check_interval_ms": 0,
    "bookie_timeout_ms": 3000,
    "copy_stall_timeout_ms": 20_000,
    "recovery_operation_timeout_ms": 30_000,
}


def write_autorecovery_conf(path: Path, **overrides: Any) -> Path:
    values = {**FAST_AUTORECOVERY, **overrides}
    path.write_text("[autorecovery]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items()))
    return path


def write_ledger(c: LedgerClient, entries: int, *, close: bool, size: int = 200, e: int = 3, qw: int = 2,
                 qa: int = 2) -> tuple[int, Any]:
    """A ledger of ``entries`` known payloads; closed, or left open with its writer returned."""
    w = c.create_ledger(e, qw, qa)
    futs = [w.append_async(data(w.ledger_id, i, size)) for i in range(entries)]
    for f in futs:
        f.result(60)
    if close:
        w.close()
    return w.ledger_id, w


def ledger_with_gap(c: LedgerClient, gap: Collection[int], entries: int = 100, size: int = 200) -> tuple[int, str]:
    """A closed E3/Qw3/Qa2 ledger of ``entries`` known payloads whose second bookie lacks ``gap``
    (written by raw adds, as a writer that lost its connection to that bookie for a while and
    died before marking the ledger; closed by recovery): (its id, that bookie)."""
    from ledger_client.protocol.framing import master_key
    from ledger_client.transport import BookieClient

    w = c.create_ledger(3, 3, 2)   # its handle writes nothing: the adds below are the writer's
    lid, ensemble = w.ledger_id, w.metadata.ensembles[0]
    digester = Digester(DigestType.CRC32C, b"")
    bodies = [digester.frame(lid, e, e - 1, (e + 1) * size, data(lid, e, size)) for e in range(entries)]
    for b in ensemble:
        with BookieClient(b) as bc:
            futures = [bc.add(lid, e, master_key(b""), bodies[e]) for e in range(entries)
                       if not (b == ensemble[1] and e in gap)]
            assert [f.result(timeout=60).status for f in futures] == [pb.EOK] * len(futures)
    c.open_ledger(lid, b"")   # recovery: fenced and closed at the last entry
    return lid, ensemble[1]


def ledgers_naming(store: MetadataStore, bookie: str) -> list[int]:
    out = []
    for lid in store.ledgers.list_ledgers():
        try:
            if bookie in store.ledgers.read_ledger_metadata(lid)[0].bookies():
                out.append(lid)
        except NoNodeError:
            pass
    return out


def wait_fully_repaired(store: MetadataStore, bookie: str, timeout_s: float) -> float:
    """Wait until no ledger names ``bookie`` and the queue is empty; returns the seconds it took."""
    t0 = time.monotonic()
    wait_until(lambda: not ledgers_naming(store, bookie) and not store.underreplication.list_underreplicated(),
               timeout_s, what=f"no ledger naming {bookie} and an empty under-replication queue")
    return time.monotonic() - t0


def assert_every_replica_has_every_entry(c: LedgerClient, ledger_id: int, entries: int, size: int = 200) -> None:
    """Read each entry from *each* bookie of its write set (not just the first that answers), digest
    checked: a copy the worker claimed in the metadata but did not write would fail here."""
    md = c.ledger_metadata(ledger_id)
    assert md.is_closed and md.last_entry_id == entries - 1, (md.state, md.last_entry_id, entries)
    digester = Digester(DigestType.CRC32C, b"")
    for e in range(entries):
        ensemble = md.ensemble_at(e)
        for i in write_set(e, md.ensemble_size, md.write_quorum_size):
            resp = c.pool.get(ensemble[i]).read(ledger_id, e)
            assert resp.status == pb.EOK, f"{ledger_id}/{e} on {ensemble[i]}: {pb.StatusCode.Name(resp.status)}"
            assert digester.unframe(resp.body, ledger_id, e)[2] == data(ledger_id, e, size)


class AutoRecoveryProcess:
    """One `spark-bookie autorecovery` child process (its own process group, killable with SIGKILL)."""

    def __init__(self, zk: str, conf: Path, candidate_id: str, log_path: Path, *extra: str) -> None:
        self.candidate_id = candidate_id
        self.log_path = log_path
        cmd = [sys.executable, "-m", "spark_bookie.cli", "autorecovery", "--zk", zk, "--conf", str(conf),
               "--id", candidate_id, *extra]
        with open(log_path, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def wait_ready(self, timeout_s: float = 60) -> None:
        wait_until(lambda: f"autorecovery {self.candidate_id} ready" in self.log() or self.proc.poll() is not None,
                   timeout_s, what=f"autorecovery {self.candidate_id} to start")
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode
