"""LedgerIndex.write makes its batch durable itself, outside rocksdict (which holds the GIL for a
whole Rdict.write, its WAL fsync included): the WAL file that holds the batch is fdatasynced and
the index directory fsynced before write() returns, and other threads run while that happens."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from spark_bookie.storage.entry_log import Location
from spark_bookie.storage.index import IndexBatch, LedgerIndex, entry_key

pytestmark = pytest.mark.unit


def _synced_paths(monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.0) -> list[tuple[str, str]]:
    """Record (call, path) of every fdatasync / fsync from now on; optionally make each slow."""
    calls: list[tuple[str, str]] = []
    for name in ("fdatasync", "fsync"):
        real = getattr(os, name)

        def wrapped(fd: int, _real=real, _name=name) -> None:  # type: ignore[no-untyped-def]
            calls.append((_name, os.readlink(f"/proc/self/fd/{fd}")))
            if delay_s:
                time.sleep(delay_s)  # a slow disk; sleeping releases the GIL as the real call does
            _real(fd)
        monkeypatch.setattr(os, name, wrapped)
    return calls


def test_the_wal_holding_the_batch_and_the_directory_are_synced(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    index = LedgerIndex(tmp_path / "index")
    index.open()
    try:
        calls = _synced_paths(monkeypatch)
        batch = IndexBatch()
        batch.put_location(0x5EED_1D, 0xC0FFEE, Location(7, 4096, 3))
        index.write(batch)
        wal_syncs = [p for call, p in calls if call == "fdatasync" and p.endswith(".log")]
        assert wal_syncs, f"no WAL file was fdatasynced: {calls}"
        key = entry_key(0x5EED_1D, 0xC0FFEE)
        assert any(key in Path(p).read_bytes() for p in wal_syncs), "the synced WAL files do not hold the batch"
        assert ("fsync", str(tmp_path / "index")) in calls
        assert index.get_location(0x5EED_1D, 0xC0FFEE) == Location(7, 4096, 3)
    finally:
        index.close()


def test_other_threads_run_while_the_wal_is_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = LedgerIndex(tmp_path / "index")
    index.open()
    try:
        _synced_paths(monkeypatch, delay_s=0.2)
        ticks: list[float] = []
        done = threading.Event()

        def tick() -> None:
            while not done.is_set():
                time.sleep(0.001)
                ticks.append(time.monotonic())

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.05)
        batch = IndexBatch()
        batch.put_location(1, 1, Location(1, 0, 0))
        start = time.monotonic()
        index.write(batch)
        end = time.monotonic()
        done.set()
        ticker.join()
        during = [t for t in ticks if start < t < end]
        assert end - start >= 0.2
        assert len(during) >= 20, f"only {len(during)} ticks of another thread in a {end - start:.2f}s write"
    finally:
        index.close()
