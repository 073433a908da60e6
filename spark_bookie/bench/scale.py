"""`spark-bookie bench scale`: what grows with the number of ledgers, streams and bookies (issue 33).

One sandbox on this machine is measured at two sizes in the same run, so that growth shows as a
ratio: SMALL (10,000 ledgers, 3 bookies, 100 streams) and then LARGE (100,000 ledgers, 30 bookies,
1,000 streams), built on top of SMALL (27 bookies, 90,000 ledgers and 900 streams more). Ledgers
are small and closed, as most of a busy cluster's are: one in ten holds 1-3 entries of 100 bytes,
the rest are empty. Streams are spread over 10 namespaces, roll a segment every ~6 records (about
3 segments each) and have 2 subscriptions whose readers read every record and commit.

Measured at each size: ledger create rate (one client, ``create_ledger`` + ``close``, 16 threads
and a plain loop) and delete rate (16 threads); ``list_ledgers`` and ``stream_info`` (a stream
of many segments) times; the auditor's first audit, full check and replicas check of every
ledger (an in-process AutoRecovery, auditor only, as autorecovery runs it); a bookie's forced GC round (admin
API, timed by its own gc metric); the bookies' and ZooKeeper's resident memory; znodes and
ZooKeeper writes per ledger and per stream segment (``mntr`` / ``srvr``); the time from a kill -9
of a bookie until `spark-bookie autorecovery` processes have moved every ledger it held off it
and the under-replication queue is empty; a new process's first ledger (cold start). Printed
beside them: the host's floors (a loopback round trip, an fdatasync), measured in the same run.

With ``--hosts`` the bookies run on hosts of their own (spark_bookie.local.multihost: network
namespaces as root, else loopback addresses 127.0.0.2..), one bookie per host as LARGE grows, and
ZooKeeper on the gateway address; the clients, the auditor and the autorecovery processes stay on
this machine and reach them over the hosts' bridge.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.progress import StepProgress
from spark_bookie.bench import scale_build as build
from spark_bookie.bench import scale_measure as measure
from spark_bookie.bench.common import finish, pct
from spark_bookie.bench.host import fdatasyncs, round_trips
from spark_bookie.bench.scale_cluster import ScaleCluster
from spark_bookie.bench.scale_report import figures, report, where_line

THREADS = 16
AUTORECOVERY_PROCESSES = 2
BUILD_BUDGET_S = 480.0      # LARGE's ledgers are cut to what the measured rate builds in this long
# GC only when forced: the bench times forced rounds by the bookie's own gc metric, which a
# periodic round in between would add to (docs/benchmarks.md, bench scale)
BOOKIE_SETTINGS = {"gc_interval_ms": 3_600_000, "zk_session_timeout_ms": 3_000}
QUICK_SESSION_MS = 2_000    # a quick run's bookies (ZooKeeper's floor): a killed one is noticed sooner


@dataclass(frozen=True)
class Size:
    name: str
    ledgers: int
    bookies: int
    streams: int


@dataclass(frozen=True)
class Plan:
    small: Size
    large: Size
    create_batch: int          # ledgers of the 16-thread create (and delete) measurement
    loop_batch: int            # ledgers of the single-thread create loop
    wide_segments: int         # segments of the stream_info stream (and of the per-segment cost)
    cold_starts: int
    auditor_cap_s: float
    repair_cap_s: float
    floor_s: float             # length of each host-floor measurement


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan(Size("small", 300, 3, 10), Size("large", 1_500, 5, 30), 60, 30, 20, 2, 60.0, 60.0, 0.5)
    small = Size("small", args.small_ledgers, 3, args.small_streams)
    large = Size("large", args.large_ledgers, args.large_bookies, args.large_streams)
    return Plan(small, large, min(2_000, small.ledgers // 5), min(500, small.ledgers // 10), 200, 5,
                args.auditor_cap, args.repair_cap, 2.0)


def add_scale_parser(sub: Any) -> None:
    p = sub.add_parser("scale", help="ledger, stream and bookie counts vs create/list/audit/GC/recovery costs, "
                                     "at two sizes in one run")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 300 ledgers / 3 bookies / 10 streams, then 1,500 / 5 / 30")
    p.add_argument("--small-ledgers", type=int, default=10_000)
    p.add_argument("--small-streams", type=int, default=100)
    p.add_argument("--large-ledgers", type=int, default=100_000)
    p.add_argument("--large-bookies", type=int, default=30)
    p.add_argument("--large-streams", type=int, default=1_000)
    p.add_argument("--auditor-cap", type=float, default=300.0, metavar="SECONDS",
                   help="stop waiting for the auditor's two full checks after this long (default 300)")
    p.add_argument("--repair-cap", type=float, default=300.0, metavar="SECONDS",
                   help="stop waiting for the re-replication after a kill -9 after this long (default 300)")
    p.add_argument("--hosts", action="store_true",
                   help="run the bookies on hosts of their own (network namespaces as root, else loopback "
                        "addresses; docs/hosts.md): as many hosts as LARGE's bookies and the spare, up to 29")
    p.add_argument("--json", default="bench-scale.json", metavar="PATH", help="where the results go as JSON")
    p.set_defaults(func_bench=bench_scale)


def say(line: str) -> None:
    print(f"bench scale: {line}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """The cluster under measurement and what has been built in it so far."""

    sb: ScaleCluster
    client: Any
    plan: Plan
    root: Path
    ids: list[int] = field(default_factory=list)   # plain ledgers alive
    streams: int = 0
    build_rate: float = 0.0    # plain ledgers/s of the SMALL build (what sizes LARGE's build)
    notes: list[str] = field(default_factory=list)

    def four_letter(self, command: str) -> str:
        return self.sb.four_letter(command)

    @property
    def alive(self) -> list[Any]:
        return self.sb.alive


def _grow(run: Run, size: Size) -> dict[str, Any]:
    """Bring the cluster to ``size``: bookies, then plain ledgers (what the create measurements
    will add counted in), then streams."""
    out: dict[str, Any] = {}
    more = size.bookies - len(run.alive)
    if more > 0:
        t0 = time.perf_counter()
        run.sb.add_bookies(more)
        out["bookies_added"] = {"count": more, "seconds": time.perf_counter() - t0}
        say(f"{size.name}: {more} bookies added in {out['bookies_added']['seconds']:.1f} s")
    want = size.ledgers - len(run.ids) - run.plan.create_batch - run.plan.loop_batch
    if size.name == "large" and run.ids and want > 0:
        rate = run.build_rate
        if rate and want / rate > BUILD_BUDGET_S:
            cut = int(rate * BUILD_BUDGET_S)
            run.notes.append(f"LARGE ledgers cut: {want:,} more at the SMALL build rate ({rate:,.0f}/s) would take "
                             f"{want / rate:,.0f} s; built {cut:,} (the {BUILD_BUDGET_S:.0f} s budget)")
            want = cut
    if want > 0:
        built = build.build_ledgers(run.client, want, THREADS, say)
        run.ids += built.pop("ids")
        out["ledgers_built"] = built
        say(f"{size.name}: {want:,} ledgers built at {built['per_s']:,.0f}/s")
    if size.streams > run.streams:
        out["streams_built"] = build.build_streams(run.client, run.streams, size.streams, THREADS, say)
        run.streams = size.streams
        say(f"{size.name}: streams built in {out['streams_built']['seconds']:.1f} s")
    return out


def _client_figures(run: Run, size: Size) -> dict[str, Any]:
    """Create, list and stream_info figures and the ZooKeeper cost of a ledger and a segment."""
    p, out = run.plan, {}
    wide = f"wide-{size.name}"
    seg = measure.zk_cost(run.four_letter, lambda: build.wide_stream(run.client, wide, p.wide_segments))
    out["per_segment"] = seg
    rates: dict[str, float] = {}

    def batch() -> int:   # the median of three batches: a build's flushes and snapshots settle meanwhile
        runs = [measure.create_rate(run.client, p.create_batch, THREADS) for _ in range(3)]
        rates["threads"] = statistics.median(r for r, _ in runs)
        for _, ids in runs:
            run.ids += ids
        return sum(len(ids) for _, ids in runs)

    out["per_ledger"] = measure.zk_cost(run.four_letter, batch)
    rates["loop"], ids = measure.create_rate(run.client, p.loop_batch, 1)
    run.ids += ids
    out["create_per_s"] = rates
    list_s, listed = measure.timed_median(lambda: list(run.client.list_ledgers()), 3)
    out["list_ledgers"] = {"seconds": list_s, "ledgers": len(listed) if isinstance(listed, list) else 0,
                           "plain": len(run.ids)}
    ns = build.namespace(run.client, 0)
    info_s, _ = measure.timed_median(lambda: ns.stream_info(wide), 5)
    out["stream_info"] = {"seconds": info_s, "segments": seg["units"]}
    return out


def _gc_and_deletes(run: Run) -> dict[str, Any]:
    """The delete rate (a random sample of the plain ledgers), then a forced GC round on the first
    bookie (the deletes' round) and another with nothing changed."""
    rnd = random.Random(len(run.ids))
    gone = set(rnd.sample(range(len(run.ids)), run.plan.create_batch))
    victims = [run.ids[i] for i in sorted(gone)]
    run.ids = [lid for i, lid in enumerate(run.ids) if i not in gone]
    out: dict[str, Any] = {"delete_per_s": measure.delete_rate(run.client, victims, THREADS), "deleted": len(victims)}
    url = run.sb.http_url(run.sb.bookies[0])
    out["gc_round_after_deletes_s"] = measure.gc_round(url, 600.0)
    out["gc_round_idle_s"] = measure.gc_round(url, 600.0)
    return out


def _wait_auditor(urls: list[str], cap_s: float) -> float:
    """Until one autorecovery process is the auditor and has run its first audit; the seconds."""
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < cap_s:
        for url in urls:
            try:
                text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            except OSError:
                continue
            runs = [float(x.split()[1]) for x in text.splitlines() if x.startswith("auditor_AUDIT_RUNS")]
            if runs and max(runs) >= 1:
                return time.monotonic() - t0
        time.sleep(0.2)
    return time.monotonic() - t0


def _repair(run: Run, size: Size) -> dict[str, Any]:
    """Kill -9 a bookie and time the re-replication by `spark-bookie autorecovery` processes (the
    first auditor's audit done before the kill, as in a cluster where they run all along). With
    no bookie to spare for E3 ensembles, a spare joins first."""
    from spark_bookie.local.processes import stop_session
    from spark_bookie.local.zookeeper import free_port

    if len(run.alive) <= 3:
        run.sb.add_bookies(1)
        run.notes.append(f"{size.name}: a spare bookie joined before the kill (E3 ledgers on 3 bookies cannot "
                         "be re-replicated after losing one)")
    # the victim: at SMALL one of the first 3 (it holds every ledger), later the newest bookie
    victim = run.alive[1] if size.name == "small" else run.alive[-1]
    held = measure.held_by(run.sb.store, victim.bookie_id)
    ports = [free_port() for _ in range(AUTORECOVERY_PROCESSES)]
    procs = measure.start_autorecovery(run.sb.connect_string, run.root, ports)
    try:
        ready = _wait_auditor([f"http://127.0.0.1:{p}" for p in ports], 300.0)
        say(f"{size.name}: autorecovery up ({ready:.1f} s); kill -9 {victim.bookie_id} "
            f"(in {len(held):,} ledgers)")
        out = measure.time_repair(run.sb.store, victim, held, run.plan.repair_cap_s, say)
        out["autorecovery_ready_s"] = ready
    finally:
        for proc in procs:
            stop_session(proc, 30.0)
    out["ledgers_per_s"] = out["ledgers_repaired"] / out["seconds"] if out["seconds"] > 0 else 0.0
    if not out["complete"]:
        run.notes.append(f"{size.name}: re-replication NOT finished within {out['cap_s']:.0f} s: "
                         f"{out['ledgers_repaired']:,}/{out['ledgers_held']:,} ledgers moved, "
                         f"{out['queued_at_end']:,} still queued")
    return out


def _measure(run: Run, size: Size, progress: StepProgress) -> dict[str, Any]:
    res: dict[str, Any] = {"size": vars(size), "built": _grow(run, size)}
    progress.step(f"{size.name} built")
    res.update(_client_figures(run, size))
    res["memory"] = measure.memory(run.sb.pids(run.alive), run.sb.zk_pid)
    res["cold_start"] = measure.cold_starts(run.sb.connect_string, run.plan.cold_starts)
    res["auditor"] = measure.auditor_checks(run.sb.connect_string, run.plan.auditor_cap_s)
    res["replicas_check"] = measure.auditor_checks(run.sb.connect_string, run.plan.auditor_cap_s, replicas=True)
    for key, what in (("auditor", "full checks"), ("replicas_check", "replicas checks")):
        if not res[key]["complete"]:
            run.notes.append(f"{size.name}: the auditor's two {what} did not finish within "
                             f"{run.plan.auditor_cap_s:.0f} s ({res[key]['marks_s']})")
    res.update(_gc_and_deletes(run))
    res["bookies"] = len(run.alive)
    res["plain_ledgers"], res["streams"] = len(run.ids), run.streams
    progress.step(f"{size.name} measured")
    res["repair"] = _repair(run, size)
    progress.step(f"{size.name} re-replicated")
    say(f"{size.name}: done")
    return res


def _floors(root: Path, seconds: float) -> dict[str, Any]:
    trips = round_trips(1000.0, seconds)
    syncs = fdatasyncs(root, 1000.0, seconds, 100)
    return {"round_trip": {"p50_ms": pct(trips, 50), "p99_ms": pct(trips, 99)},
            "fdatasync": {"p50_ms": pct(syncs, 50), "p99_ms": pct(syncs, 99)}, "cores": os.cpu_count()}


def host_count(plan: Plan) -> int:
    """Hosts for ``--hosts``: one per bookie that will ever run (LARGE's, and the spare SMALL's kill
    needs when it has no fourth bookie), at most what one harness slot holds."""
    from spark_bookie.local.hosts import HOSTS_MAX

    spare = 1 if plan.small.bookies <= 3 else 0
    return min(HOSTS_MAX, max(plan.small.bookies, plan.large.bookies) + spare)


def bench_scale(args: argparse.Namespace) -> int:
    from ledger_client import LedgerClient

    plan = plan_of(args)
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    res: dict[str, Any] = {"quick": bool(args.quick), "plan": {"small": vars(plan.small), "large": vars(plan.large)},
                           "threads": THREADS, "load_average_at_start": os.getloadavg()}
    progress = StepProgress("bench scale", ("host floors", *(f"{s} {what}" for s in ("small", "large")
                                                             for what in ("built", "measured", "re-replicated"))))
    t0 = time.monotonic()
    try:
        res["host"] = _floors(root, plan.floor_s)
        progress.step("host floors")
        settings = {**BOOKIE_SETTINGS, **({"zk_session_timeout_ms": QUICK_SESSION_MS} if args.quick else {})}
        hosts = host_count(plan) if args.hosts else 0
        with ScaleCluster(root / "cluster", plan.small.bookies, settings, hosts) as sb, \
                LedgerClient(sb.connect_string) as client:
            sb.store.underreplication.set_lost_bookie_recovery_delay_s(0)
            if hosts:
                say(where_line(sb.where(), "run"))
            run = Run(sb, client, plan, root)
            res["small"] = _measure(run, plan.small, progress)
            run.build_rate = res["small"]["built"].get("ledgers_built", {}).get("per_s", 0.0)
            res["large"] = _measure(run, plan.large, progress)
            res["notes"] = run.notes
            res["cluster"] = sb.where()
    finally:
        progress.close()
        shutil.rmtree(root, ignore_errors=True)
    res["seconds"] = time.monotonic() - t0
    res["figures"] = figures(res)
    return finish(res, args.json, report)
