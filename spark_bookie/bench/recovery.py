"""`spark-bookie bench recovery`: how fast a lost bookie's data is re-replicated.

A sandbox of real bookie processes (5 by default) and `spark-bookie autorecovery` processes (the
auditor candidates and replication workers); N ledgers of M bytes each are written E3/Qw2/Qa2
and closed; one bookie is killed with SIGKILL; the clock runs from the kill until no ledger's
metadata names it and the under-replication queue is empty. Printed beside it, measured in the
same run on the same disk: the raw disk's write rate (1 MiB writes + fdatasync), the ceiling any
re-replication into these bookies has; the copy phase's own rate (first mark to done); and the CPU
per repaired ledger of the autorecovery processes and of the surviving bookies (on a shared
machine the rate follows the load, the CPU per ledger much less). Goal (issue 4): at least
50 MB/s of re-replicated data, counted over the whole time from the death (detection by ZooKeeper
session expiry, the auditor's confirmation and its scan included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench.common import cpu_seconds, raw_group_commit

GOAL_MB_PER_S = 50.0
POLL_S = 0.1                # the repair's progress is polled this often (cheap reads only)
FULL_CHECK_S = 0.5          # a long list of ledgers never seen queued is read at most this often
BOOKIE_SESSION_MS = 2_000   # the embedded ZooKeeper's floor: a dead bookie is noticed as soon as it can be
ENTRY_OVERHEAD_BYTES = 32 + 4  # framing header + CRC32C digest, copied with every entry


def add_recovery_parser(sub: Any) -> None:
    p = sub.add_parser("recovery", help="time from a bookie's death to full re-replication, vs the raw disk")
    p.add_argument("--ledgers", type=int, default=1000)
    p.add_argument("--ledger-bytes", type=int, default=1 << 20, help="data per ledger (default 1 MiB)")
    p.add_argument("--entry-bytes", type=int, default=64 << 10, help="entry size (default 64 KiB)")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="`spark-bookie autorecovery` processes")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up waiting for the repair after this long")
    p.add_argument("--json", default="bench-recovery.json")
    p.add_argument("--quick", action="store_true", help="at most 40 ledgers of 256 KiB (smoke test)")
    p.set_defaults(func_bench=bench_recovery)


def _write_ledgers(zk: str, count: int, ledger_bytes: int, entry_bytes: int) -> dict[str, Any]:
    """`count` closed E3/Qw2/Qa2 ledgers of `ledger_bytes` each (eight written at a time)."""
    from ledger_client import ClientConfig, LedgerClient

    payload = os.urandom(entry_bytes)
    per_ledger = max(1, ledger_bytes // entry_bytes)

    def one(c: LedgerClient) -> None:
        w = c.create_ledger(3, 2, 2)
        futs = [w.append_async(payload) for _ in range(per_ledger)]
        for f in futs:
            f.result(timeout=300)
        w.close()

    t0 = time.perf_counter()
    with LedgerClient(zk, config=ClientConfig()) as c, ThreadPoolExecutor(8) as ex:
        for f in [ex.submit(one, c) for _ in range(count)]:
            f.result()
    elapsed = time.perf_counter() - t0
    total = count * per_ledger * entry_bytes
    return {"entries_per_ledger": per_ledger, "bytes": total, "seconds": elapsed, "mb_per_s": total / elapsed / 1e6}


def _on_bookie(store: Any, bookie: str) -> tuple[set[int], int]:
    """(ledgers naming the bookie, entry copies its re-replication writes)."""
    from recovery import scan_ledgers
    from recovery.plan import copy_entry_count

    ledgers: set[int] = set()
    copies = 0
    for md in scan_ledgers(store, 256):
        if bookie in md.bookies():
            ledgers.add(md.ledger_id)
            copies += copy_entry_count(md, bookie)
    return ledgers, copies


def _start_workers(zk: str, root: Path, n: int) -> list[subprocess.Popen[bytes]]:
    conf = root / "autorecovery.toml"
    conf.write_text("[autorecovery]\nzk_session_timeout_ms = 4000\n"
                    "acquire_poll_ms = 200\nworker_backoff_ms = 200\ncheck_all_ledgers_interval_ms = 0\n"
                    "placement_check_interval_ms = 0\n")
    procs = []
    for i in range(n):
        log = open(root / f"autorecovery-{i}.log", "ab")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "autorecovery", "--zk", zk,
                                       "--conf", str(conf), "--id", f"bench-ar-{i}"],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
        log.close()
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def _time_repair(sb: Any, victim: Any, on_victim: set[int], timeout_s: float) -> dict[str, float]:
    """Kill `victim` and time: its registration gone, the first ledger marked, everything repaired
    (every ledger that named it no longer does, and the queue is empty).

    Polled every POLL_S with cheap reads only, so the benchmark does not slow down what it measures:
    the queue through the store's cached bucket listing (no ledger node read per poll), and each
    ledger's metadata once, after it left the queue (ledgers never seen queued are read when the
    queue looks empty). A mark is timed at the poll that saw it, the end after the reads that
    proved it: upper bounds, late by at most one poll."""
    store = sb.store
    pending = set(on_victim)   # ledgers still naming the victim, as far as we know
    seen: set[int] = set()     # ledgers of `pending` seen in the queue
    marks: dict[str, float] = {}
    last_full = -FULL_CHECK_S
    t0 = time.monotonic()
    victim.kill()
    while time.monotonic() - t0 < timeout_s:
        now = time.monotonic() - t0
        if "detected" not in marks and victim.bookie_id not in store.cluster.list_bookies():
            marks["detected"] = now
        queued = set(_queued_ids(store))
        if queued and "first_marked" not in marks:
            marks["first_marked"] = now
        seen |= queued & pending
        left = seen - queued
        # the queue looks empty: read what is left (rarely while it is long: the auditor may still be marking)
        full = not queued and "detected" in marks and (len(pending) <= 64 or now - last_full >= FULL_CHECK_S)
        if full:
            last_full = now
        pending -= _no_longer_naming(store, sorted((pending if full else left) & pending), victim.bookie_id)
        seen -= left
        if not pending and "first_marked" not in marks:
            marks["first_marked"] = now  # marked and repaired between two polls: the latest it can have been
        if not pending and not queued:
            marks["repaired"] = time.monotonic() - t0
            return marks
        time.sleep(POLL_S)
    raise TimeoutError(f"the repair did not finish in {timeout_s:.0f}s ({len(pending)} ledgers left)")


def _queued_ids(store: Any) -> list[int]:
    """The queued ledger ids, cheaply (the bucket listing cached between watch events); an empty
    answer is exact."""
    return list(store.underreplication.underreplicated_ids())


def _no_longer_naming(store: Any, ledger_ids: list[int], bookie: str) -> set[int]:
    """Which of the ledgers (deleted ones included) no longer name `bookie`: pipelined reads, so
    the poll costs a round trip per batch and not per ledger."""
    out: set[int] = set()
    for i in range(0, len(ledger_ids), 256):
        chunk = ledger_ids[i:i + 256]
        for lid, got in zip(chunk, store.ledgers.read_ledger_metadata_many(chunk), strict=True):
            if got is None or bookie not in got[0].bookies():
                out.add(lid)
    return out


def bench_recovery(args: argparse.Namespace) -> int:
    from spark_bookie.local.sandbox import Sandbox

    ledgers = min(args.ledgers, 40) if args.quick else args.ledgers
    ledger_bytes = (256 << 10) if args.quick else args.ledger_bytes
    root = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    res: dict[str, Any] = {"ledgers": ledgers, "ledger_bytes": ledger_bytes, "entry_bytes": args.entry_bytes,
                           "bookies": args.bookies, "workers": args.workers, "ensemble": "E3/Qw2/Qa2"}
    settings = {"zk_session_timeout_ms": BOOKIE_SESSION_MS}
    workers: list[subprocess.Popen[bytes]] = []
    progress = StepProgress("bench recovery", ("ledgers written", "repaired"))
    try:
        with Sandbox(root / "cluster", args.bookies, bookie_settings=settings) as sb:
            store = sb.store
            if store is None:
                raise RuntimeError("sandbox did not start")
            store.underreplication.set_lost_bookie_recovery_delay_s(0)
            workers = _start_workers(sb.connect_string, root, args.workers)
            res["write"] = _write_ledgers(sb.connect_string, ledgers, ledger_bytes, args.entry_bytes)
            progress.step("ledgers written")
            res["raw_disk_1mib_fdatasync"] = raw_group_commit(root, (64 if args.quick else 256) << 20)
            counts = Counter(b for md in _all(store) for b in md.bookies())
            victim = next(b for b in sb.bookies if b.bookie_id == counts.most_common(1)[0][0])
            on_victim, copies = _on_bookie(store, victim.bookie_id)
            copied = copies * (args.entry_bytes + ENTRY_OVERHEAD_BYTES)
            res.update(victim=victim.bookie_id, ledgers_on_victim=len(on_victim), entry_copies=copies,
                       bytes_rereplicated=copied)
            survivors = [b.proc.pid for b in sb.bookies if b is not victim and b.proc is not None]
            zk = [sb.zk.pid] if sb.zk is not None and sb.zk.pid is not None else []
            cpu0 = (_cpu([p.pid for p in workers]), _cpu(survivors), _cpu([os.getpid()]), _cpu(zk))
            marks = _time_repair(sb, victim, on_victim, args.timeout)
            progress.step("repaired")
            cpu = {"autorecovery": _cpu([p.pid for p in workers]) - cpu0[0], "bookies": _cpu(survivors) - cpu0[1],
                   "benchmark_polling": _cpu([os.getpid()]) - cpu0[2], "zookeeper": _cpu(zk) - cpu0[3]}
            res["cpu_seconds"] = cpu
            res["cpu_ms_per_ledger"] = {k: v * 1000 / max(1, len(on_victim)) for k, v in cpu.items()}
            res["seconds"] = marks
            res["mb_per_s"] = copied / marks["repaired"] / 1e6
            res["mb_per_s_after_first_mark"] = copied / max(1e-9, marks["repaired"] - marks["first_marked"]) / 1e6
            _stop(workers)  # before the cluster goes: stopping bookies would start new repairs
    finally:
        progress.close()
        _stop(workers)
        shutil.rmtree(root, ignore_errors=True)
    _report(res)
    Path(args.json).write_text(json.dumps(res, indent=2))
    print(f"results written to {args.json}")
    return 0


def _cpu(pids: list[int]) -> float:

    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


def _all(store: Any) -> list[Any]:
    from recovery import scan_ledgers

    return scan_ledgers(store, 256)


def _report(res: dict[str, Any]) -> None:
    s, w, raw = res["seconds"], res["write"], res["raw_disk_1mib_fdatasync"]["mb_per_s"]
    res["goals"] = {f"re-replication >= {GOAL_MB_PER_S:.0f} MB/s (from the death)": res["mb_per_s"] >= GOAL_MB_PER_S}
    print()
    print(f"wrote {res['ledgers']:,} ledgers x {res['ledger_bytes'] / 2**20:.2f} MiB ({res['ensemble']}, "
          f"{res['entry_bytes'] // 1024} KiB entries) into {res['bookies']} bookies at {w['mb_per_s']:.0f} MB/s")
    print(f"killed {res['victim']} (on {res['ledgers_on_victim']:,} ledgers; {res['entry_copies']:,} entry copies, "
          f"{res['bytes_rereplicated'] / 1e6:,.0f} MB to re-replicate); {res['workers']} autorecovery processes")
    print(f"  after the SIGKILL: registration gone {s['detected']:.1f}s, first ledger marked {s['first_marked']:.1f}s, "
          f"fully re-replicated {s['repaired']:.1f}s")
    cpu, per = res["cpu_seconds"], res["cpu_ms_per_ledger"]
    print(f"  CPU during the repair: autorecovery processes {cpu['autorecovery']:.1f}s "
          f"({per['autorecovery']:.1f} ms/ledger), surviving bookies {cpu['bookies']:.1f}s "
          f"({per['bookies']:.1f} ms/ledger), ZooKeeper {cpu['zookeeper']:.1f}s, "
          f"this benchmark's polling {cpu['benchmark_polling']:.1f}s")
    print(f"re-replication: {res['mb_per_s']:.0f} MB/s from the death; copy phase (first mark to done): "
          f"{res['mb_per_s_after_first_mark']:.0f} MB/s; raw disk (1 MiB write + fdatasync, same run): {raw:.0f} MB/s")
    for goal, ok in res["goals"].items():
        print(f"goal {goal}: {'PASS' if ok else 'FAIL'}")
