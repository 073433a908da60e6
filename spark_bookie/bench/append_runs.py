"""The append bench's two measurements, shared by its comparisons (append.py, tenants_cost.py):
saturated pipelined appends and an open-loop rate, each with the CPU it cost per entry."""

from __future__ import annotations

import os
import time
from typing import Any

from spark_bookie.bench.common import cpu_seconds, pct
from spark_bookie.bench.host import cpu_times, steal_share


def _cpu_now(bookie_pids: list[int]) -> tuple[float, float]:
    """CPU seconds used so far by this process (the client) and by all the bookies."""
    return cpu_seconds(), sum(cpu_seconds(p) for p in bookie_pids)


def _cpu_per_entry(before: tuple[float, float], after: tuple[float, float], entries: int) -> dict[str, float]:
    return {"client_cpu_us_per_entry": (after[0] - before[0]) / entries * 1e6,
            "bookies_cpu_us_per_entry": (after[1] - before[1]) / entries * 1e6}


def throughput(client: Any, cfg: tuple[int, int, int], entries: int, size: int,
                bookie_pids: list[int], namespace: str = "") -> dict[str, float]:
    """Pipelined appends; also CPU microseconds per entry in the client and in all bookies, the
    figure that decides how far two cores can go. `namespace`: the ledger's (its grants decide)."""
    w = client.create_ledger(*cfg, namespace=namespace)
    payload = os.urandom(size)
    cpu0 = _cpu_now(bookie_pids)
    t0 = time.perf_counter()
    for _ in range(entries):  # futures are not kept: see latency_at_rate
        f = w.append_async(payload)
    # A failed append fails the writer and every append after it, so the last stands for all.
    last = f.result(timeout=600)
    elapsed = time.perf_counter() - t0
    cpu1 = _cpu_now(bookie_pids)
    w.close()
    if last != entries - 1:
        raise RuntimeError(f"the last append got entry id {last}, expected {entries - 1}")
    return {"entries_per_s": entries / elapsed, "mb_per_s": entries * size / elapsed / 1e6,
            **_cpu_per_entry(cpu0, cpu1, entries)}


def latency_at_rate(client: Any, cfg: tuple[int, int, int], rate: float, seconds: float,
                     size: int, bookie_pids: list[int], namespace: str = "") -> dict[str, float]:
    """Open loop: entry i is due at t0 + i/rate; latency counts from then (no coordinated omission).
    Also the CPU per entry: at this rate every add is its own message, and how busy that keeps
    the two cores is what the tail latency follows."""
    w = client.create_ledger(*cfg, namespace=namespace)
    payload = os.urandom(size)
    n = max(1, int(rate * seconds))
    lat = [0.0] * n
    cpu0, host0 = _cpu_now(bookie_pids), cpu_times()
    t0 = time.perf_counter()
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        f = w.append_async(payload)
        f.add_done_callback(lambda _f, i=i, due=due: lat.__setitem__(i, time.perf_counter() - due))
    # Completions are in entry-id order, so the last future covers all. Keeping every future (as
    # this loop did) made the heap grow by ~10 tracked objects per entry, and CPython's full
    # collections, which rescan all of them, stalled the writer for 30-40 ms: the bench's p99.
    f.result(timeout=120)
    cpu1, host1 = _cpu_now(bookie_pids), cpu_times()
    w.close()
    return {"offered_per_s": rate, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "p999_ms": pct(lat, 99.9),
            **_cpu_per_entry(cpu0, cpu1, n), "host_steal_share": steal_share(host0, host1)}
