"""`spark-bookie bench append --tenants`: the cost of the bookies' per-namespace checks on appends.

Two clusters of three bookies in the same run, both with token authentication on (an HS256 secret
file) and the same `client`-role token (not a superuser, whom the checks skip): on one,
`tenant_checks_enabled = true` and the role appends to ledgers created in a namespace of a tenant
that grants it produce and consume, so every add batch goes through the access gate (DESIGN §4.9);
on the other, `tenant_checks_enabled = false` (authentication on, no tenants) and the same role
appends to plain ledgers. Saturated E3Qw3Qa2 runs alternate which side goes first, and are judged,
like the metrics cost, by the bookies' median CPU per entry; each side's latency at 1,000/s is
measured once, before any saturated run. Goal: a cost under 5%.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from spark_bookie.bench.host import cpu_times, steal_share

GOAL_TENANTS_COST_PERCENT = 5.0
SIDES = ("checks", "plain")            # tenant checks on, namespaced ledgers / checks off, plain ledgers
ROLE = "bench-producer"                # a client role: the checks apply to it
TENANT, NAMESPACE = "bench", "bench-appends"
CFG = (3, 3, 2)


def _secret(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "token-secret"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32).hex().encode())
    return path


@contextmanager
def _clusters(root: Path) -> Iterator[dict[str, tuple[Any, list[int], str]]]:
    """Both sides, each as (a client holding the role's token, its bookies' pids, the namespace its
    ledgers are created in)."""
    from ledger_client import ClientConfig, LedgerClient
    from spark_bookie.local.sandbox import Sandbox
    from spark_bookie.server.auth import mint_token

    secret_path = _secret(root)
    secret = secret_path.read_bytes()
    base = {"auth_enabled": True, "auth_token_secret_path": str(secret_path)}
    producer = ClientConfig(auth_token=mint_token(secret, ROLE, "client", ttl_s=86_400.0))
    with ExitStack() as stack:
        sides: dict[str, tuple[Any, list[int], str]] = {}
        for name, checks, namespace in (("checks", True, NAMESPACE), ("plain", False, "")):
            sb = stack.enter_context(Sandbox(root / name, 3, bookie_settings={**base,
                                                                               "tenant_checks_enabled": checks}))
            if namespace:
                admin = ClientConfig(auth_token=mint_token(secret, "bench-admin", "admin", ttl_s=3_600.0))
                with LedgerClient(sb.connect_string, config=admin) as c:
                    c.create_tenant(TENANT, admin_roles=["bench-admin"])
                    c.create_namespace(namespace, tenant=TENANT).grant_permission(ROLE, ["produce", "consume"])
            client = stack.enter_context(LedgerClient(sb.connect_string, config=producer))
            sides[name] = (client, [b.proc.pid for b in sb.bookies if b.proc is not None], namespace)
        yield sides


def tenants_cost(root: Path, entries: int, seconds: float, size: int, rounds: int) -> dict[str, Any]:
    """Each side warmed up and its latency at 1,000/s measured once, then `rounds` saturated runs
    of each side, alternating which goes first; medians of CPU per entry, best and median entries/s."""
    from spark_bookie.bench.append_runs import latency_at_rate as _latency_at_rate
    from spark_bookie.bench.append_runs import throughput as _throughput

    with _clusters(root) as sides:
        at_1000 = {}
        for name in SIDES:   # each side's latency right after its own warm-up, so both start alike
            client, pids, ns = sides[name]
            _throughput(client, CFG, min(entries, 5_000), size, pids, namespace=ns)
            at_1000[name] = _latency_at_rate(client, CFG, 1000.0, seconds, size, pids, namespace=ns)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in SIDES}
        host0 = cpu_times()
        for i in range(rounds):
            for name in (SIDES if i % 2 == 0 else SIDES[::-1]):
                client, pids, ns = sides[name]
                runs[name].append(_throughput(client, CFG, entries, size, pids, namespace=ns))
        steal = steal_share(host0, cpu_times())

    def median(key: str) -> dict[str, float]:
        return {k: statistics.median(r[key] for r in v) for k, v in runs.items()}

    cpu = median("bookies_cpu_us_per_entry")
    return {"runs": runs, "at_1000": at_1000, "host_steal_share_saturated": steal,
            "median_bookies_cpu_us_per_entry": cpu, "median_client_cpu_us_per_entry": median("client_cpu_us_per_entry"),
            "median_entries_per_s": median("entries_per_s"),
            "best_entries_per_s": {k: max(r["entries_per_s"] for r in v) for k, v in runs.items()},
            "cost_percent": (cpu["checks"] - cpu["plain"]) / cpu["plain"] * 100 if cpu["plain"] else 0.0}


def report_tenants(res: dict[str, Any]) -> None:
    """Its lines in bench append's table, with the host's floors of the same run beside them."""
    t = res.get("tenants_cost")
    if t is None:
        return
    c, p = "checks", "plain"
    best, med = t["best_entries_per_s"], t["median_entries_per_s"]
    bcpu, ccpu = t["median_bookies_cpu_us_per_entry"], t["median_client_cpu_us_per_entry"]
    lc, lp = t["at_1000"][c], t["at_1000"][p]
    h, d = res["host_round_trip"], res["host_fdatasync"]
    print(f"tenant checks on (client role, namespaced ledgers) vs off (auth on, no tenants), E3Qw3Qa2, "
          f"{len(t['runs'][c])} alternating rounds: {best[c]:,.0f} vs {best[p]:,.0f} entries/s at best, "
          f"{med[c]:,.0f} vs {med[p]:,.0f} median; CPU per entry (median) bookies {bcpu[c]:.1f} vs "
          f"{bcpu[p]:.1f} us, client {ccpu[c]:.1f} vs {ccpu[p]:.1f} us: tenant checks cost "
          f"{t['cost_percent']:+.1f}%")
    print(f"  at 1,000/s: p50 {lc['p50_ms']:.2f} vs {lp['p50_ms']:.2f} ms, p99 {lc['p99_ms']:.2f} vs "
          f"{lp['p99_ms']:.2f} ms; bookies' CPU per entry {lc['bookies_cpu_us_per_entry']:.0f} vs "
          f"{lp['bookies_cpu_us_per_entry']:.0f} us")
    print(f"  host floors (same run): round trip p50 {h['p50_ms']:.2f} / p99 {h['p99_ms']:.2f} ms, fdatasync p50 "
          f"{d['p50_ms']:.2f} / p99 {d['p99_ms']:.2f} ms; steal {lc['host_steal_share']:.0%} and "
          f"{lp['host_steal_share']:.0%} in the 1,000/s runs, {t['host_steal_share_saturated']:.0%} in the "
          f"saturated rounds")


def tenants_goal(res: dict[str, Any]) -> dict[str, bool]:
    t = res.get("tenants_cost")
    if t is None:
        return {}
    return {f"tenant checks cost < {GOAL_TENANTS_COST_PERCENT}% of the bookies' CPU per entry":
            t["cost_percent"] < GOAL_TENANTS_COST_PERCENT}
