"""Micro-benchmarks of the bookie's storage parts, run by `spark-bookie bench bookie`: the journal
alone (durable adds/s through group commit) and the entry log + index (write, flush, read back).
They live here, not beside the code they measure, so the storage modules hold only what a bookie
runs."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ledger_client.protocol.checks import invariant
from spark_bookie.storage.journal import Journal, JournalRecord, RecordType
from spark_bookie.storage.ledger_storage import LedgerStorage


def journal_measure(journal_dir: str | Path, records: int = 50_000, record_bytes: int = 1024, batch: int = 128,
            **journal_kwargs: Any) -> dict[str, float]:
    """Durable adds/s and MB/s through a fresh journal in a temporary subdirectory of `journal_dir`.

    Submits from one thread without waiting (as the gRPC server does) and stops the clock when the
    last callback has run, so the figure includes encoding, writing and every fdatasync.
    """
    Path(journal_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="measure-", dir=journal_dir))
    payload = os.urandom(record_bytes)
    done = threading.Semaphore(0)
    errors: list[BaseException] = []

    def callback(err: BaseException | None) -> None:
        if err is not None:
            errors.append(err)
        done.release()

    journal = Journal(work, **journal_kwargs)
    try:
        journal.start()
        submits = 0
        t0 = time.perf_counter()
        for first in range(0, records, batch):
            last = min(first + batch, records)
            recs = [JournalRecord(RecordType.ADD, 1, e, payload) for e in range(first, last)]
            journal.submit(recs, callback)
            submits += 1
        for _ in range(submits):
            done.acquire()
        elapsed = time.perf_counter() - t0
        syncs = journal.groups_synced
    finally:
        journal.stop()
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        raise errors[0]
    return {"records": records, "record_bytes": record_bytes, "batch": batch, "seconds": elapsed,
            "adds_per_s": records / elapsed, "mb_per_s": records * record_bytes / elapsed / 1e6,
            "fsyncs": syncs, "records_per_fsync": records / max(syncs, 1)}


_WORDS = (
    "ledger entry bookie journal fence quorum ensemble write read offset block index value key "
    "spark executor stream segment record payload timestamp user event session click view id "
    'alpha beta gamma delta epsilon true false null 0 1 2 3 4 5 6 7 8 9 { } [ ] : , "'
).split()


def _payload_pool(size: int, seed: int) -> bytes:
    """Text-like bytes (random words, roughly JSON-ish): compressible, but not by repetition."""
    rng = random.Random(seed)
    words = rng.choices(_WORDS, k=size // 5 + 16)
    return " ".join(words).encode()[:size]


def storage_measure(
    ledger_dir: str | Path,
    entries: int = 50_000,
    entry_bytes: int = 1024,
    compression: str = "none",
    *,
    block_bytes: int = 64 << 10,
) -> dict[str, float | int | str]:
    """Write+flush throughput, bytes on disk and sequential read-back throughput for one setting.

    Reads happen after a close/reopen (empty read cache, page cache warm), through get_range
    in 4 MiB batches, and are checked byte for byte against what was written.
    """
    pool = _payload_pool(max(4 << 20, entry_bytes * 2), seed=7)
    rng = random.Random(11)
    span = len(pool) - entry_bytes
    bodies = [pool[o : o + entry_bytes] for o in (rng.randrange(span) for _ in range(entries))]
    storage = LedgerStorage(ledger_dir, compression=compression, entry_log_block_bytes=block_bytes)
    storage.open()
    storage.set_master_key(1, b"k")
    t0 = time.perf_counter()
    for i, body in enumerate(bodies):
        storage.add_entry(1, i, body)
    t1 = time.perf_counter()
    storage.flush()
    t2 = time.perf_counter()
    log_bytes = storage.entry_logger.total_bytes()
    storage.close()
    storage.open()
    t3 = time.perf_counter()
    got = 0
    while got < entries:
        batch = storage.get_range(1, got, entries - 1, 4 << 20)
        invariant(batch[0] == bodies[got] and batch[-1] == bodies[got + len(batch) - 1], "read-back mismatch")
        got += len(batch)
    t4 = time.perf_counter()
    storage.close()
    raw = entries * entry_bytes
    return {
        "compression": compression,
        "entries": entries,
        "entry_bytes": entry_bytes,
        "add_us_per_entry": (t1 - t0) / entries * 1e6,
        "flush_s": t2 - t1,
        "write_entries_per_s": entries / (t2 - t0),
        "write_mib_per_s": raw / (t2 - t0) / (1 << 20),
        "bytes_on_disk": log_bytes,
        "disk_to_raw_ratio": log_bytes / raw,
        "read_entries_per_s": entries / (t4 - t3),
        "read_mib_per_s": raw / (t4 - t3) / (1 << 20),
    }
