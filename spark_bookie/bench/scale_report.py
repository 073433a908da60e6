"""The scale benchmark's figures, SMALL beside LARGE with their ratio (spark_bookie/bench/scale.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Get = Callable[[dict[str, Any]], Any]

# key, label, unit, where it is in one size's results
FIGURES: tuple[tuple[str, str, str, Get], ...] = (
    ("create_per_s_16_threads", "create+close, one client, 16 threads", "ledgers/s",
     lambda r: r["create_per_s"]["threads"]),
    ("create_per_s_loop", "create+close, one client, plain loop", "ledgers/s", lambda r: r["create_per_s"]["loop"]),
    ("delete_per_s_16_threads", "delete, one client, 16 threads", "ledgers/s", lambda r: r["delete_per_s"]),
    ("list_ledgers_ms", "list_ledgers (full listing)", "ms", lambda r: r["list_ledgers"]["seconds"] * 1000),
    ("stream_info_ms", "stream_info, stream of many segments", "ms", lambda r: r["stream_info"]["seconds"] * 1000),
    ("auditor_audit_s", "auditor: first audit (index of all ledgers)", "s", lambda r: r["auditor"].get("audit_s")),
    ("auditor_full_check_s", "auditor: full check of every ledger", "s",
     lambda r: r["auditor"].get("full_check_s")),
    ("auditor_full_check_again_s", "auditor: next full check (nothing changed)", "s",
     lambda r: r["auditor"].get("full_check_again_s")),
    ("auditor_replicas_check_s", "auditor: replicas check of every ledger", "s",
     lambda r: r.get("replicas_check", {}).get("full_check_s")),
    ("auditor_replicas_check_again_s", "auditor: next replicas check (nothing changed)", "s",
     lambda r: r.get("replicas_check", {}).get("full_check_again_s")),
    ("gc_round_after_deletes_ms", "bookie GC round after the deletes", "ms",
     lambda r: r["gc_round_after_deletes_s"] * 1000),
    ("gc_round_idle_ms", "bookie GC round, nothing changed", "ms", lambda r: r["gc_round_idle_s"] * 1000),
    ("bookie_rss_median_mb", "bookie RSS, median of bookies", "MiB", lambda r: r["memory"]["bookie_rss_median_mb"]),
    ("bookie_rss_max_mb", "bookie RSS, largest", "MiB", lambda r: r["memory"]["bookie_rss_max_mb"]),
    ("zookeeper_rss_mb", "ZooKeeper RSS", "MiB", lambda r: r["memory"]["zookeeper_rss_mb"]),
    ("znodes_per_ledger", "znodes per ledger", "", lambda r: r["per_ledger"]["znodes_per_unit"]),
    ("zk_writes_per_ledger", "ZooKeeper writes per ledger (create+close)", "",
     lambda r: r["per_ledger"]["writes_per_unit"]),
    ("znodes_per_segment", "znodes per stream segment", "", lambda r: r["per_segment"]["znodes_per_unit"]),
    ("zk_writes_per_segment", "ZooKeeper writes per stream segment", "",
     lambda r: r["per_segment"]["writes_per_unit"]),
    ("rereplication_s", "kill -9 of a bookie to fully re-replicated", "s", lambda r: r["repair"]["seconds"]),
    ("rereplication_ledgers_per_s", "re-replicated ledgers per second", "ledgers/s",
     lambda r: r["repair"]["ledgers_per_s"]),
    ("cold_start_first_ledger_ms", "new client: connect + first ledger (median)", "ms",
     lambda r: r["cold_start"]["first_ledger_ms"]),
    ("cold_start_import_ms", "new process: imports before that (median)", "ms", lambda r: r["cold_start"]["import_ms"]),
)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not math.isnan(float(x)) else None


def figures(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure at both sizes and LARGE/SMALL (None where one was not measured in time)."""
    out = {}
    for key, label, unit, get in FIGURES:
        small, large = (_num(get(res[s])) for s in ("small", "large"))
        ratio = large / small if small and large is not None else None
        out[key] = {"label": label, "unit": unit, "small": small, "large": large, "ratio": ratio}
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3f}"


def _size_line(res: dict[str, Any], name: str) -> str:
    r, listed = res[name], res[name]["list_ledgers"]
    return (f"{name.upper()}: {r['bookies']} live bookies, {listed['ledgers']:,} ledgers listed ({listed['plain']:,} "
            f"plain, the rest stream segments), {r['streams']:,} streams in 10 namespaces; {r['deleted']:,} plain "
            f"ledgers deleted after that")


def where_line(where: dict[str, Any], verb: str = "ran") -> str:
    """Where the bookies ran (ScaleCluster.where())."""
    if where["mode"] == "processes":
        return f"the {where['bookies']} bookies {verb} as processes on this machine"
    how = (f"network namespaces on a bridge, ZooKeeper on the gateway {where['gateway']}" if where["mode"] == "netns"
           else f"loopback addresses 127.0.0.2.., no network namespaces: {where['reason']}")
    return (f"the {where['bookies']} bookies {verb} on {where['hosts_with_bookies']} hosts "
            f"(of {where['hosts']}; {how})")


def report(res: dict[str, Any]) -> None:
    h = res["host"]
    print()
    print(f"host floors: loopback round trip p50 {h['round_trip']['p50_ms']:.3f} ms (p99 "
          f"{h['round_trip']['p99_ms']:.3f}), fdatasync p50 {h['fdatasync']['p50_ms']:.3f} ms (p99 "
          f"{h['fdatasync']['p99_ms']:.3f}); {h['cores']} cores; load at start {res['load_average_at_start'][0]:.2f}")
    if "cluster" in res:
        print(where_line(res["cluster"]))
    for name in ("small", "large"):
        print(_size_line(res, name))
    print("LARGE was built on SMALL: more bookies, ledgers and streams added to the same cluster "
          f"({'quick run' if res['quick'] else 'full run'}, {res['seconds']:.0f} s)")
    print(f"{'figure':<48}{'SMALL':>12}{'LARGE':>12}{'LARGE/SMALL':>13}  unit")
    for f in res["figures"].values():
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "n/a"
        print(f"{f['label']:<48}{_fmt(f['small']):>12}{_fmt(f['large']):>12}{ratio:>13}  {f['unit']}")
    for name in ("small", "large"):
        rep = res[name]["repair"]
        print(f"{name.upper()} kill -9 of {rep['victim']}: {rep['ledgers_repaired']:,}/{rep['ledgers_held']:,} ledgers "
              f"moved off it in {rep['seconds']:.1f} s ({'complete' if rep['complete'] else 'NOT complete'}; "
              f"first mark {rep['marks_s'].get('first_marked', float('nan')):.1f} s after the kill)")
    small_rate = res["small"]["create_per_s"]["threads"]
    want = res["plan"]["large"]["ledgers"]
    print(f"at SMALL's 16-thread create rate, {want:,} ledgers take {want / small_rate:,.0f} s to create "
          "from one client")
    for note in res.get("notes", []):
        print(f"note: {note}")
