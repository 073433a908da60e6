"""Garbage collection and compaction of entry logs, on real files and a real RocksDB."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_bookie.storage.entry_log import FILE_HEADER
from spark_bookie.storage.gc import GarbageCollector, GcStats
from spark_bookie.storage.ledger_storage import LedgerStorage

pytestmark = pytest.mark.unit


def body(ledger: int, entry: int, size: int = 1000) -> bytes:
    return (f"[{ledger}/{entry}]".encode() * (size // 6 + 1))[:size]


def fill(s: LedgerStorage, ledger: int, n: int, size: int = 1000) -> None:
    if not s.ledger_exists(ledger):
        s.set_master_key(ledger, b"k")
    for e in range(n):
        s.add_entry(ledger, e, body(ledger, e, size))


def check(s: LedgerStorage, ledger: int, n: int, size: int = 1000) -> None:
    got = s.get_range(ledger, 0, n - 1, 1 << 30)
    assert len(got) == n
    for e, data in enumerate(got):
        assert data == body(ledger, e, size), f"ledger {ledger} entry {e} differs"


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    s = LedgerStorage(tmp_path, entry_log_size_bytes_max=256 << 10, entry_log_block_bytes=8 << 10)
    s.open()
    yield s
    s.close()


def restart(s: LedgerStorage, read_cache_bytes_max: int = 32 << 20) -> LedgerStorage:
    """Close and reopen: the last log is no longer the one being written, so GC may take it."""
    s.close()
    s2 = LedgerStorage(
        s.ledger_dir,
        entry_log_size_bytes_max=256 << 10,
        entry_log_block_bytes=8 << 10,
        read_cache_bytes_max=read_cache_bytes_max,
    )
    s2.open()
    return s2


def test_deletes_dead_ledger_and_its_logs(storage: LedgerStorage) -> None:
    fill(storage, 1, 300)
    storage.flush()
    fill(storage, 2, 600)  # only ledger 2 in these logs
    s = restart(storage)
    try:
        logs_before = s.entry_log_ids()
        usage_before = s.disk_usage_bytes()
        gc = GarbageCollector(s, lambda local: local - {1}, compaction_ratio_threshold=0.5)
        stats = gc.run_once()
        assert stats.ledgers_deleted == 1 and stats.logs_deleted >= 2
        assert stats.bytes_reclaimed > 500_000
        assert s.ledger_ids() == [1]
        assert len(s.entry_log_ids()) < len(logs_before)
        assert s.disk_usage_bytes() < usage_before - 500_000
        check(s, 1, 300)
        assert gc.run_once() == GcStats()  # nothing left to do
    finally:
        s.close()


def test_compacts_mixed_logs(storage: LedgerStorage) -> None:
    storage.set_master_key(1, b"k")
    storage.set_master_key(2, b"k")
    for e in range(600):  # interleaved in the same flushes, so every log holds both ledgers
        storage.add_entry(1, e, body(1, e, 300))
        storage.add_entry(2, e, body(2, e, 1500))
        if e % 100 == 99:
            storage.flush()
    s = restart(storage)
    try:
        old_logs = s.entry_log_ids()
        usage_before = s.disk_usage_bytes()
        stats = GarbageCollector(s, lambda local: local - {1}, compaction_ratio_threshold=0.5).run_once()
        assert stats.ledgers_deleted == 1
        assert stats.logs_compacted >= 1, stats
        assert stats.bytes_reclaimed > 0
        # each flush writes ledger 1 then ledger 2 (sorted), so a log is ~17% live or all dead
        assert stats.logs_compacted + stats.logs_deleted == len(old_logs)
        assert not set(old_logs) & set(s.entry_log_ids())
        assert s.disk_usage_bytes() < usage_before * 0.4
        check(s, 1, 600, 300)
        s = restart(s)
        check(s, 1, 600, 300)  # the index switch was durable
        assert s.ledger_ids() == [1]
    finally:
        s.close()


def test_missing_ledgers_none_or_failing_deletes_nothing(storage: LedgerStorage) -> None:
    fill(storage, 1, 200)
    fill(storage, 2, 200)
    s = restart(storage)

    def broken(local: set[int]) -> set[int] | None:
        raise ConnectionError("zookeeper down")

    try:
        for source in (lambda local: None, broken):
            stats = GarbageCollector(s, source, compaction_ratio_threshold=0.5).run_once()
            assert stats.ledgers_deleted == 0 and stats.logs_deleted == 0
            assert s.ledger_ids() == [1, 2]
            check(s, 1, 200)
            check(s, 2, 200)
    finally:
        s.close()


def test_ledger_created_after_snapshot_is_kept(storage: LedgerStorage) -> None:
    fill(storage, 1, 10)
    storage.flush()

    def missing(local: set[int]) -> set[int]:
        fill(storage, 7, 5)  # created locally while the metadata store was asked (it holds only 1)
        return local - {1}

    stats = GarbageCollector(storage, missing, compaction_ratio_threshold=0.5).run_once()
    assert stats.ledgers_deleted == 0
    assert storage.ledger_ids() == [1, 7]


def test_current_log_is_never_collected(storage: LedgerStorage) -> None:
    fill(storage, 1, 100)
    storage.flush()
    current = storage.entry_logger.current_log_id
    GarbageCollector(storage, lambda local: local, compaction_ratio_threshold=0.9).run_once()
    assert storage.ledger_ids() == []
    assert current in storage.entry_log_ids()


def test_orphan_log_without_accounting_is_deleted(storage: LedgerStorage) -> None:
    fill(storage, 1, 50)
    s = restart(storage)
    # as if the bookie crashed after the log fsync but before the index write
    s.entry_logger.append([(9, e, b"orphan") for e in range(10)])
    s.entry_logger.sync()
    orphan = s.entry_logger.current_log_id
    s = restart(s)
    try:
        assert orphan in s.entry_log_ids()
        stats = GarbageCollector(s, lambda local: local - {1}, compaction_ratio_threshold=0.5).run_once()
        assert stats.logs_deleted == 1 and stats.logs_compacted == 0
        assert orphan not in s.entry_log_ids() and s.entry_log_ids()
        check(s, 1, 50)
    finally:
        s.close()


def test_orphan_tail_of_an_accounted_log_is_reclaimed(storage: LedgerStorage) -> None:
    """A crash in the middle of a flush into a log that earlier flushes already filled leaves
    bytes no index entry points at, after accounted ones: they count as dead space, so the log
    is compacted (its live entries kept) rather than holding that space for ever."""
    fill(storage, 1, 50)
    storage.flush()
    log_id = storage.entry_logger.current_log_id
    # the interrupted flush: blocks written and synced, the index batch never written
    storage.entry_logger.append([(1, 50 + e, body(1, 50 + e)) for e in range(150)])
    storage.entry_logger.sync()
    s = restart(storage)
    try:
        (usage,) = [u for u in s.gc_log_usage() if u.log_id == log_id]
        assert usage.live_ratio < 0.3, usage
        stats = GarbageCollector(s, lambda local: set(), compaction_ratio_threshold=0.5).run_once()
        assert stats.logs_compacted == 1 and log_id not in s.entry_log_ids()
        assert stats.bytes_reclaimed > 100 * 1000
        check(s, 1, 50)
        assert s.entry_location(1, 50) is None   # the orphans stay unindexed (the journal has them)
    finally:
        s.close()


def test_reader_with_stale_location_relooks_up_once(
    storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(storage, 1, 20, 300)
    fill(storage, 2, 20, 3000)
    s = restart(storage)
    try:
        stale = s.entry_location(1, 5)
        gc = GarbageCollector(s, lambda local: local - {1}, compaction_ratio_threshold=0.5)
        assert gc.run_once().logs_compacted == 1
        assert stale is not None and stale.log_id not in s.entry_log_ids()
        real = s._index.get_location
        calls: list[int] = []

        def first_stale(ledger_id: int, entry_id: int):  # type: ignore[no-untyped-def]
            calls.append(entry_id)
            return stale if len(calls) == 1 else real(ledger_id, entry_id)

        monkeypatch.setattr(s._index, "get_location", first_stale)
        assert s.get_entry(1, 5) == body(1, 5, 300)
        assert calls == [5, 5]
    finally:
        s.close()


def test_corrupt_log_is_not_compacted_away(storage: LedgerStorage) -> None:
    seed = random.randrange(1 << 30)
    print(f"corruption seed {seed}")
    rng = random.Random(seed)
    fill(storage, 1, 100)
    fill(storage, 2, 100, 3000)
    s = restart(storage)
    try:
        log_id = s.entry_log_ids()[0]
        path = s.entry_logger.log_path(log_id)
        data = bytearray(path.read_bytes())
        data[rng.randrange(FILE_HEADER.size, len(data))] ^= 0x10
        path.write_bytes(bytes(data))
        gc = GarbageCollector(s, lambda local: local - {1}, compaction_ratio_threshold=0.9)
        stats = gc.run_once()
        assert stats.logs_failed >= 1, f"seed {seed}: {stats}"
        assert log_id in s.entry_log_ids()
        # not scanned again every round (each try reads the whole log and fails the same way)
        assert gc.run_once().logs_failed == 0 and log_id in s.entry_log_ids() and log_id in gc.abandoned
    finally:
        s.close()


def test_reads_never_miss_during_compaction_and_flush(storage: LedgerStorage) -> None:
    storage.set_master_key(1, b"k")
    storage.set_master_key(2, b"k")
    for e in range(1500):
        storage.add_entry(1, e, body(1, e, 200))
        storage.add_entry(2, e, body(2, e, 1200))
        if e % 250 == 249:
            storage.flush()
    s = restart(storage, read_cache_bytes_max=16 << 10)  # reads go to the files being compacted
    stop = threading.Event()
    failures: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            e = rng.randrange(1500)
            try:
                if rng.random() < 0.5:
                    ok = s.get_entry(1, e) == body(1, e, 200)
                else:
                    got = s.get_range(1, e, e + 30, 1 << 20)
                    ok = len(got) == min(31, 1500 - e) and all(
                        g == body(1, e + i, 200) for i, g in enumerate(got)
                    )
            except Exception as exc:  # noqa: BLE001 - any miss is a failure
                failures.append(f"entry {e}: {exc!r}")
                return
            if not ok:
                failures.append(f"entry {e}: wrong bytes")
                return

    def writer() -> None:
        s.set_master_key(3, b"k")
        e = 0
        while not stop.is_set():
            s.add_entry(3, e, body(3, e, 500))
            e += 1
            if e % 200 == 0:
                s.flush()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)] + [
        threading.Thread(target=writer)
    ]
    for t in threads:
        t.start()
    try:
        stats = GarbageCollector(s, lambda local: local - {1, 3}, compaction_ratio_threshold=0.5).run_once()
    finally:
        stop.set()
        for t in threads:
            t.join()
    try:
        assert stats.logs_compacted >= 1, stats
        assert not failures, failures[:5]
        check(s, 1, 1500, 200)
        n3 = s.last_entry_id(3) + 1
        check(s, 3, n3, 500)
    finally:
        s.close()
