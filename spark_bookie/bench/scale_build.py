"""What the scale benchmark (spark_bookie/bench/scale.py) builds: many small closed ledgers (most
empty, some with a few entries), streams in namespaces with rolling segments and readers with
subscriptions (the bookies: spark_bookie/bench/scale_cluster.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

WRITTEN_EVERY = 10          # one ledger in 10 gets a few entries; the others stay empty (closed)
ENTRY = b"e" * 100          # a small ledger's entries
NAMESPACES = 10
RECORD = b"r" * 100
SEGMENT_BYTES = 600         # a segment rolls after about six 100-byte records
BUFFER_BYTES = 120          # one record per entry
RECORDS_PER_SEGMENT = 6
SEGMENTS_PER_STREAM = 3
READERS_PER_STREAM = 2      # subscriptions that read every record and commit
REPORT_EVERY_S = 10.0


def _every(seconds: float) -> Callable[[], bool]:
    """True at most once per ``seconds`` (progress lines)."""
    last = [time.monotonic()]

    def due() -> bool:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            return True
        return False
    return due


def build_ledgers(client: Any, count: int, threads: int, say: Callable[[str], None]) -> dict[str, Any]:
    """``count`` closed ledgers from ``threads`` threads: one in WRITTEN_EVERY gets 1-3 entries of
    100 bytes, the rest are created and closed empty (as most ledgers of a busy cluster: ended
    tasks, rolled segments)."""
    rnd = random.Random(count)
    entries = [rnd.randint(1, 3) if i % WRITTEN_EVERY == 0 else 0 for i in range(count)]
    due = _every(REPORT_EVERY_S)
    done = [0]
    t0 = time.perf_counter()

    def one(i: int) -> int:
        h = client.create_ledger()
        for _ in range(entries[i]):
            h.append(ENTRY)
        h.close()
        done[0] += 1
        if due():
            say(f"built {done[0]:,}/{count:,} ledgers ({done[0] / (time.perf_counter() - t0):,.0f}/s)")
        return int(h.ledger_id)

    with ThreadPoolExecutor(threads) as ex:
        ids = list(ex.map(one, range(count)))
    elapsed = time.perf_counter() - t0
    return {"ledgers": count, "written": sum(1 for e in entries if e), "seconds": elapsed,
            "per_s": count / elapsed if elapsed > 0 else 0.0, "ids": ids}


def namespace(client: Any, k: int) -> Any:
    """The k-th namespace (created on first use) with small rolling segments."""
    name = f"scale-ns-{k}"
    if name in client.list_namespaces():
        return client.namespace(name)
    return client.create_namespace(name, segment_rolling_bytes=SEGMENT_BYTES, output_buffer_bytes=BUFFER_BYTES)


def write_stream(ns: Any, name: str, segments: int) -> int:
    """About ``segments`` segments of 100-byte records, the writer closed at the end; the records."""
    records = segments * RECORDS_PER_SEGMENT
    with ns.open_writer(name) as w:
        for _ in range(records):
            w.write(RECORD)
    return records


def read_all(ns: Any, name: str, subscription: str, records: int, timeout_s: float = 60.0) -> None:
    """A reader of ``subscription`` reads the stream's ``records`` records and commits the last."""
    deadline = time.monotonic() + timeout_s
    with ns.open_reader(name, subscription=subscription) as r:
        got: list[Any] = []
        while len(got) < records and time.monotonic() < deadline:
            got += r.read_batch(10_000, 200)
        if got:
            r.commit(got[-1].dlsn, sync=True)


def build_streams(client: Any, first: int, last: int, threads: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Streams ``first``..``last - 1``, spread over NAMESPACES namespaces, each with about
    SEGMENTS_PER_STREAM segments and READERS_PER_STREAM subscriptions' readers."""
    spaces = [namespace(client, k) for k in range(NAMESPACES)]
    due = _every(REPORT_EVERY_S)
    done = [0]
    t0 = time.perf_counter()

    def one(i: int) -> None:
        ns = spaces[i % NAMESPACES]
        name = f"stream-{i}"
        records = write_stream(ns, name, SEGMENTS_PER_STREAM)
        for r in range(READERS_PER_STREAM):
            read_all(ns, name, f"reader-{r}", records)
        done[0] += 1
        if due():
            say(f"built {done[0]:,}/{last - first:,} streams")

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(first, last)))
    return {"streams": last - first, "seconds": time.perf_counter() - t0, "namespaces": NAMESPACES,
            "segments_per_stream": SEGMENTS_PER_STREAM, "readers_per_stream": READERS_PER_STREAM}


def wide_stream(client: Any, name: str, segments: int) -> int:
    """A stream of about ``segments`` segments in the first namespace; how many it has."""
    ns = namespace(client, 0)
    write_stream(ns, name, segments)
    return len(ns.stream_info(name).segments)

