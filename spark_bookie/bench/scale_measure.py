"""The scale benchmark's measurements (`spark-bookie bench scale`, spark_bookie/bench/scale.py):
each one reads or drives the cluster through a public or operator path only (the client, the
admin API, ZooKeeper's four-letter words, an AutoRecovery object, `spark-bookie autorecovery`
processes), so that changes behind those paths show in the figures."""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

POLL_S = 0.02
COLD_START_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from ledger_client import LedgerClient
t1 = time.perf_counter()
c = LedgerClient(sys.argv[1])
h = c.create_ledger()
h.close()
t2 = time.perf_counter()
c.delete_ledger(h.ledger_id)
c.close()
print(json.dumps({"import_s": t1 - t0, "first_ledger_s": t2 - t1}), flush=True)
"""


# ---------------------------------------------------------------- ZooKeeper and processes

def zk_counts(four_letter: Callable[[str], str]) -> tuple[int, int]:
    """(znodes, write transactions so far): ``mntr``'s zk_znode_count and the low 32 bits of
    ``srvr``'s Zxid (ZooKeeper numbers every write transaction of an epoch in them)."""
    znodes = next(int(line.split()[1]) for line in four_letter("mntr").splitlines()
                  if line.startswith("zk_znode_count"))
    zxid = next(line.split(":", 1)[1].strip() for line in four_letter("srvr").splitlines()
                if line.startswith("Zxid"))
    return znodes, int(zxid, 16) & 0xFFFFFFFF


def zk_cost(four_letter: Callable[[str], str], count_of: Callable[[], int]) -> dict[str, float]:
    """Znodes and ZooKeeper writes per unit of what ``count_of`` does (it returns how many units)."""
    nodes0, writes0 = zk_counts(four_letter)
    n = count_of()
    nodes1, writes1 = zk_counts(four_letter)
    return {"units": n, "znodes": nodes1 - nodes0, "writes": writes1 - writes0,
            "znodes_per_unit": (nodes1 - nodes0) / max(1, n), "writes_per_unit": (writes1 - writes0) / max(1, n)}


def rss_mb(pid: int) -> float:
    """The process's resident set (VmRSS of /proc/<pid>/status), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory(bookie_pids: list[int], zk_pid: int | None) -> dict[str, float]:
    rss = [rss_mb(p) for p in bookie_pids]
    return {"bookie_rss_median_mb": statistics.median(rss), "bookie_rss_max_mb": max(rss),
            "zookeeper_rss_mb": rss_mb(zk_pid) if zk_pid is not None else 0.0}


# ---------------------------------------------------------------- client operations

def create_rate(client: Any, count: int, threads: int) -> tuple[float, list[int]]:
    """Ledgers/s of ``create_ledger()`` + ``close()`` (empty) from ``threads`` threads; their ids."""
    def one(_: int) -> int:
        h = client.create_ledger()
        h.close()
        return int(h.ledger_id)

    t0 = time.perf_counter()
    if threads <= 1:
        ids = [one(i) for i in range(count)]
    else:
        with ThreadPoolExecutor(threads) as ex:
            ids = list(ex.map(one, range(count)))
    return count / (time.perf_counter() - t0), ids


def delete_rate(client: Any, ids: list[int], threads: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(client.delete_ledger, ids))
    return len(ids) / (time.perf_counter() - t0)


def timed_median(op: Callable[[], object], times: int) -> tuple[float, object]:
    """Median seconds of ``times`` calls of ``op``, and what the last one returned."""
    took, got = [], None
    for _ in range(times):
        t0 = time.perf_counter()
        got = op()
        took.append(time.perf_counter() - t0)
    return statistics.median(took), got


def cold_starts(zk: str, times: int) -> dict[str, float]:
    """A new process per try: a LedgerClient of its own (its own ZooKeeper session) creates and
    closes its first ledger; medians of the client's part and of the imports before it."""
    runs = []
    for _ in range(times):
        out = subprocess.run([sys.executable, "-c", COLD_START_SCRIPT, zk], capture_output=True, text=True,
                             timeout=120, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"first_ledger_ms": statistics.median(r["first_ledger_s"] for r in runs) * 1000,
            "import_ms": statistics.median(r["import_s"] for r in runs) * 1000, "tries": times}


# ---------------------------------------------------------------- bookie GC (admin API + /metrics)

def _gc_metric(base: str) -> tuple[float, float]:
    """(rounds, seconds) of the bookie's bookie_gc_THREAD_RUNTIME histogram."""
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    got = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for key in got:
            if line.startswith(f"bookie_gc_THREAD_RUNTIME_{key} "):
                got[key] = float(line.split()[1])
    return got["count"], got["sum"]


def gc_round(base: str, timeout_s: float) -> float:
    """Force one GC round through the admin API (PUT /api/v1/bookie/gc) and return its seconds as
    the bookie's own gc_round metric counted them; nan if it did not finish in ``timeout_s``."""
    count0, sum0 = _gc_metric(base)
    req = urllib.request.Request(base + "/api/v1/bookie/gc", method="PUT")
    urllib.request.urlopen(req, timeout=30).read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count, total = _gc_metric(base)
        if count > count0:
            return total - sum0
        time.sleep(0.05)
    return float("nan")


# ---------------------------------------------------------------- the auditor's full check

def auditor_checks(zk: str, cap_s: float, interval_ms: int = 200, replicas: bool = False) -> dict[str, Any]:
    """An auditor run in-process the way autorecovery runs it (an AutoRecovery object, auditor
    only), its full check of every ledger due every ``interval_ms``: the seconds of its first audit
    (the bookie index, built from every ledger's metadata), of its first full check (which starts
    when that audit ends) and of the second (which starts ``interval_ms`` after the first ended).
    ``replicas``: the replicas check (every entry's presence on every bookie) instead of the read
    check (first and last entries read)."""
    from recovery.autorecovery import AutoRecovery
    from recovery.config import AutoRecoveryConfig

    cfg = AutoRecoveryConfig(check_all_ledgers_interval_ms=0 if replicas else interval_ms,
                             replicas_check_interval_ms=interval_ms if replicas else 0, placement_check_interval_ms=0,
                             audit_interval_ms=3_600_000, stream_maintenance_interval_ms=0)
    ar = AutoRecovery(zk, cfg, candidate_id="bench-scale-auditor", run_worker=False)
    marks: dict[str, float] = {}
    quiet = logging.getLogger("recovery")   # its per-check lines would interleave with the progress
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    t0 = time.monotonic()
    ar.start()
    try:
        while time.monotonic() - t0 < cap_s and "check_2" not in marks:
            stats = ar.auditor_stats if ar.is_auditor else None
            now = time.monotonic() - t0
            if stats is not None:
                marks.setdefault("elected", now)
                if stats.audits >= 1:
                    marks.setdefault("audit_1", now)
                for k in (1, 2):
                    if (stats.replicas_checks if replicas else stats.ledger_checks) >= k:
                        marks.setdefault(f"check_{k}", now)
            time.sleep(POLL_S)
    finally:
        ar.stop()
        quiet.setLevel(level)
    out: dict[str, Any] = {"marks_s": marks, "cap_s": cap_s, "complete": "check_2" in marks}
    if "audit_1" in marks:
        out["audit_s"] = marks["audit_1"] - marks["elected"]
    if "check_1" in marks:
        out["full_check_s"] = marks["check_1"] - marks["audit_1"]
    if "check_2" in marks:
        out["full_check_again_s"] = marks["check_2"] - marks["check_1"] - interval_ms / 1000
    return out


# ---------------------------------------------------------------- re-replication after a kill -9

def start_autorecovery(zk: str, root: Path, http_ports: list[int]) -> list[subprocess.Popen[bytes]]:
    """A `spark-bookie autorecovery` process (auditor candidate and worker) per port of
    ``http_ports`` (where it serves /metrics), as an operator runs them, polling their queue often
    and with the periodic checks off."""
    conf = root / "autorecovery.toml"
    conf.write_text("[autorecovery]\nzk_session_timeout_ms = 4000\nacquire_poll_ms = 200\nworker_backoff_ms = 200\n"
                    "check_all_ledgers_interval_ms = 0\nplacement_check_interval_ms = 0\n"
                    "stream_maintenance_interval_ms = 0\n")
    procs = []
    for i, port in enumerate(http_ports):
        with open(root / f"autorecovery-{i}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "autorecovery", "--zk", zk,
                                           "--conf", str(conf), "--id", f"bench-scale-ar-{i}",
                                           "--http-port", str(port)],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
    return procs


def held_by(store: Any, bookie: str) -> set[int]:
    """The ledgers whose metadata names ``bookie`` (the auditor's scan, 256 reads at a time)."""
    from recovery import scan_ledgers

    return {md.ledger_id for md in scan_ledgers(store, 256) if bookie in md.bookies()}


def _repaired(store: Any, ledger_ids: list[int], bookie: str) -> set[int]:
    """Which ledgers (deleted ones included) no longer have ``bookie`` in their last fragment."""
    out: set[int] = set()
    for i in range(0, len(ledger_ids), 256):
        chunk = ledger_ids[i:i + 256]
        for lid, got in zip(chunk, store.ledgers.read_ledger_metadata_many(chunk), strict=True):
            if got is None or bookie not in got[0].ensembles[max(got[0].ensembles)]:
                out.add(lid)
    return out


def time_repair(store: Any, victim: Any, held: set[int], cap_s: float,
                say: Callable[[str], None]) -> dict[str, Any]:
    """SIGKILL ``victim`` and time until the under-replication queue is empty and none of the
    ledgers it held has it in its last fragment (`listunderreplicated`'s queue, read through the
    store, and the ledgers' metadata); at ``cap_s`` stop waiting and return the progress so far."""
    pending = set(held)
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    victim.kill()
    last_read = last_say = 0.0
    queued: list[int] = []
    while time.monotonic() - t0 < cap_s:
        now = time.monotonic() - t0
        queued = list(store.underreplication.underreplicated_ids())
        if queued:
            marks.setdefault("first_marked", now)
        if (not queued and now - last_read >= 1.0) or len(pending) <= 256:
            last_read = now
            pending -= _repaired(store, sorted(pending), victim.bookie_id)
        if not pending and not queued:
            marks["repaired"] = time.monotonic() - t0
            break
        if now - last_say >= 10:
            last_say = now
            say(f"re-replication: {len(held) - len(pending):,}/{len(held):,} ledgers moved off "
                f"{victim.bookie_id}, {len(queued):,} queued, {now:.0f} s")
        time.sleep(0.2)
    done = len(held) - len(pending)
    return {"victim": victim.bookie_id, "ledgers_held": len(held), "ledgers_repaired": done,
            "queued_at_end": len(queued), "complete": "repaired" in marks, "cap_s": cap_s, "marks_s": marks,
            "seconds": marks.get("repaired", time.monotonic() - t0)}
