"""LedgerStorage on real files and a real RocksDB: entries, ledger state, restart, corruption, threads."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_bookie.bench.storage_measure import storage_measure as measure
from spark_bookie.errors import CorruptDataError, NoEntryError, NoLedgerError, StorageIOError
from spark_bookie.storage.entry_log import FILE_HEADER
from spark_bookie.storage.ledger_storage import LedgerStorage

pytestmark = pytest.mark.unit


def body(ledger: int, entry: int, size: int = 200) -> bytes:
    return (f"<{ledger}:{entry}>".encode() * (size // 6 + 1))[:size]


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    s = LedgerStorage(tmp_path, write_cache_bytes_max=1 << 20, read_cache_bytes_max=256 << 10)
    s.open()
    yield s
    s.close()


def reopen(s: LedgerStorage, **kw: int | str) -> LedgerStorage:
    s.close()
    s2 = LedgerStorage(s.ledger_dir, **kw)  # type: ignore[arg-type]
    s2.open()
    return s2


def fill(s: LedgerStorage, ledger: int, n: int, size: int = 200, start: int = 0) -> None:
    if not s.ledger_exists(ledger):
        s.set_master_key(ledger, b"key%d" % ledger)
    for e in range(start, start + n):
        s.add_entry(ledger, e, body(ledger, e, size))


def test_add_get_from_cache_flush_and_reopen(storage: LedgerStorage) -> None:
    fill(storage, 1, 50)
    fill(storage, 2, 30)
    assert storage.get_entry(1, 7) == body(1, 7)  # from the write cache
    storage.flush()
    assert storage.write_cache_bytes() == 0
    assert storage.get_entry(1, 7) == body(1, 7)  # from disk
    assert storage.get_range(2, 0, 29, 1 << 20) == [body(2, e) for e in range(30)]
    s2 = reopen(storage)
    try:
        assert [s2.get_entry(1, e) for e in range(50)] == [body(1, e) for e in range(50)]
        assert s2.get_range(1, 10, 49, 1 << 20) == [body(1, e) for e in range(10, 50)]
        assert s2.ledger_ids() == [1, 2]
    finally:
        s2.close()


def test_entry_minus_one_and_last_entry_id(storage: LedgerStorage) -> None:
    storage.set_master_key(1, b"k")
    assert storage.last_entry_id(1) == -1
    with pytest.raises(NoEntryError):
        storage.get_entry(1, -1)
    fill(storage, 1, 10)
    assert storage.last_entry_id(1) == 9  # from the cache
    assert storage.get_entry(1, -1) == body(1, 9)
    storage.flush()
    fill(storage, 1, 5, start=10)
    assert storage.get_entry(1, -1) == body(1, 14)  # mix: cache above disk
    s2 = reopen(storage)
    try:
        assert s2.last_entry_id(1) == 14  # from the index (reverse seek)
        assert s2.get_entry(1, -1) == body(1, 14)
        s2.set_master_key(2, b"k")
        fill(s2, 2, 3)
        assert s2.last_entry_id(1) == 14 and s2.last_entry_id(2) == 2  # neighbours do not leak
        s2.add_entry(1, 20, b"x")  # an add after restart loads the index high-water mark first
        assert s2.last_entry_id(1) == 20
    finally:
        s2.close()


def test_no_ledger_vs_no_entry(storage: LedgerStorage) -> None:
    with pytest.raises(NoLedgerError):
        storage.get_entry(9, 0)
    with pytest.raises(NoLedgerError):
        storage.get_range(9, 0, 5, 1000)
    with pytest.raises(NoLedgerError):
        storage.add_entry(9, 0, b"x")
    with pytest.raises(NoLedgerError):
        storage.last_entry_id(9)
    with pytest.raises(NoLedgerError):
        storage.set_fenced(9)
    fill(storage, 9, 3)
    with pytest.raises(NoEntryError):
        storage.get_entry(9, 3)
    with pytest.raises(NoEntryError):
        storage.get_range(9, 5, 8, 1000)
    storage.flush()
    with pytest.raises(NoEntryError):
        storage.get_entry(9, 100)


def test_ledger_state_survives_reopen_after_flush(storage: LedgerStorage) -> None:
    storage.set_master_key(5, b"secret")
    assert storage.ledger_exists(5) and not storage.ledger_exists(6)
    assert storage.master_key(6) is None
    assert storage.set_fenced(5) is True
    assert storage.set_fenced(5) is False
    assert storage.explicit_lac(5) is None
    storage.set_explicit_lac(5, 10, b"lac10")
    storage.set_explicit_lac(5, 4, b"lac4")  # smaller: ignored
    assert storage.explicit_lac(5) == (10, b"lac10")
    storage.set_master_key(6, b"other")
    storage.flush()
    s2 = reopen(storage)
    try:
        assert s2.master_key(5) == b"secret" and s2.is_fenced(5)
        assert s2.explicit_lac(5) == (10, b"lac10")
        assert s2.master_key(6) == b"other" and not s2.is_fenced(6)
        assert s2.ledger_ids() == [5, 6]
    finally:
        s2.close()


def test_get_range_gap_max_bytes_and_cache_disk_mix(storage: LedgerStorage) -> None:
    fill(storage, 1, 20)
    storage.flush()
    fill(storage, 1, 10, start=20)  # 20..29 only in the cache
    fill(storage, 1, 5, start=31)  # gap at 30
    assert storage.get_range(1, 0, 100, 1 << 20) == [body(1, e) for e in range(30)]
    assert storage.get_range(1, 3, 6, 1 << 20) == [body(1, e) for e in range(3, 7)]
    assert len(storage.get_range(1, 0, 100, 1000)) == 5  # 5 * 200 bytes fit exactly
    assert storage.get_range(1, 0, 100, 1) == [body(1, 0)]  # always at least one
    assert storage.get_range(1, 5, 4, 1000) == []
    with pytest.raises(NoEntryError):
        storage.get_range(1, 30, 40, 1000)


def test_get_entries_skips_missing_ids_across_blocks_cache_and_ledgers(storage: LedgerStorage) -> None:
    """A striped bookie's entries: every other id, interleaved with another ledger in the same
    blocks, some flushed to disk and some still cached; a listed read returns exactly the held ones."""
    storage.set_master_key(1, b"k1")
    storage.set_master_key(2, b"k2")
    for e in range(0, 400, 2):
        storage.add_entry(1, e, body(1, e))
        storage.add_entry(2, e + 1, body(2, e + 1))
    storage.flush()
    for e in range(400, 440, 2):   # only in the write cache
        storage.add_entry(1, e, body(1, e))
    asked = list(range(0, 440))     # odd ids are not held by ledger 1
    ids, bodies = storage.get_entries(1, asked, 1 << 30)
    assert ids == list(range(0, 440, 2))
    assert bodies == [body(1, e) for e in ids]
    ids, _ = storage.get_entries(1, [3, 5, 398, 399, 400, 1000], 1 << 30)
    assert ids == [398, 400]
    ids, bodies = storage.get_entries(1, asked, 1000)   # 5 * 200 bytes fit exactly
    assert ids == [0, 2, 4, 6, 8] and bodies == [body(1, e) for e in ids]
    assert storage.get_entries(1, [10], 1)[0] == [10]   # always at least one
    with pytest.raises(NoEntryError):
        storage.get_entries(1, [1, 3, 1001], 1000)
    with pytest.raises(NoLedgerError):
        storage.get_entries(7, [0], 1000)


def test_held_entries_names_exactly_the_held_ids_from_cache_and_index(storage: LedgerStorage) -> None:
    """What a repair asks of a bookie (ReadRangeRequest.ids_only): every held id among those asked,
    flushed or cached, none read; a gap in the middle shows as well as one at an end."""
    storage.set_master_key(1, b"k1")
    storage.set_master_key(2, b"k2")
    for e in [*range(0, 40), *range(60, 100)]:   # 40..59 never added
        storage.add_entry(1, e, body(1, e))
        storage.add_entry(2, e, body(2, e))
    storage.flush()
    for e in range(100, 110):   # only in the write cache
        storage.add_entry(1, e, body(1, e))
    assert storage.held_entries(1, list(range(0, 120))) == [*range(0, 40), *range(60, 110)]
    assert storage.held_entries(1, [39, 40, 59, 60, 109, 110]) == [39, 60, 109]
    assert storage.held_entries(2, list(range(100, 110))) == []
    with pytest.raises(NoLedgerError):
        storage.held_entries(7, [0])


def test_add_is_idempotent_on_replay(storage: LedgerStorage) -> None:
    fill(storage, 1, 10)
    fill(storage, 1, 10)  # same adds again, still in the cache
    storage.flush()
    fill(storage, 1, 10)  # again after a flush (journal replay)
    storage.flush()
    assert storage.get_range(1, 0, 9, 1 << 20) == [body(1, e) for e in range(10)]
    assert storage.last_entry_id(1) == 9


def test_entries_stay_readable_while_being_flushed(
    storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(storage, 1, 20)
    real_write = storage._index.write
    seen: list[bytes] = []

    def write_and_peek(batch):  # type: ignore[no-untyped-def]
        if len(batch) > 1:  # the flush batch: logs written, index not yet
            assert storage.write_cache_bytes() == 0
            seen.append(storage.get_entry(1, 13))  # served from the swapped-out cache
        real_write(batch)

    monkeypatch.setattr(storage._index, "write", write_and_peek)
    storage.flush()
    assert seen == [body(1, 13)]
    assert storage.get_entry(1, 13) == body(1, 13)


def test_failed_flush_keeps_entries(storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(storage, 1, 20)
    storage.set_fenced(1)
    real_write = storage._index.write
    failed = [False]

    def failing_write(batch):  # type: ignore[no-untyped-def]
        if not failed[0] and len(batch) > 1:  # the flush's batch (not the log-id allocation)
            failed[0] = True
            raise StorageIOError("disk full")
        real_write(batch)

    monkeypatch.setattr(storage._index, "write", failing_write)
    with pytest.raises(StorageIOError):
        storage.flush()
    fill(storage, 1, 5, start=20)
    assert storage.get_range(1, 0, 24, 1 << 20) == [body(1, e) for e in range(25)]
    storage.flush()
    s2 = reopen(storage)
    try:
        assert s2.get_range(1, 0, 24, 1 << 20) == [body(1, e) for e in range(25)]
        assert s2.is_fenced(1)
    finally:
        s2.close()


def test_write_cache_back_pressure_flushes(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path, write_cache_bytes_max=64 << 10)
    s.open()
    try:
        s.set_master_key(1, b"k")
        peak = 0
        for e in range(2000):
            s.add_entry(1, e, body(1, e, 500))
            peak = max(peak, s.write_cache_bytes())
            if e == 50:
                assert not s.needs_flush()
        assert peak < 64 << 10
        assert s.entry_log_ids()  # flushed on its own
        assert s.get_range(1, 0, 1999, 1 << 30) == [body(1, e, 500) for e in range(2000)]
    finally:
        s.close()


def test_delete_ledger(storage: LedgerStorage) -> None:
    fill(storage, 1, 10)
    fill(storage, 2, 10)
    storage.flush()
    fill(storage, 1, 5, start=10)  # some still cached
    storage.delete_ledger(1)
    assert not storage.ledger_exists(1)
    with pytest.raises(NoLedgerError):
        storage.get_entry(1, 0)
    storage.flush()
    s2 = reopen(storage)
    try:
        assert s2.ledger_ids() == [2]
        s2.set_master_key(1, b"again")  # a re-created ledger starts empty
        assert s2.last_entry_id(1) == -1
        with pytest.raises(NoEntryError):
            s2.get_entry(1, 3)
        assert s2.get_entry(2, 9) == body(2, 9)
    finally:
        s2.close()


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_compression_round_trip(tmp_path: Path, compression: str) -> None:
    s = LedgerStorage(tmp_path, compression=compression)
    s.open()
    fill(s, 1, 500, 1000)
    s.add_entry(1, 500, random.Random(1).randbytes(3000))  # incompressible
    s2 = reopen(s, compression=compression)
    try:
        assert s2.get_range(1, 0, 499, 1 << 30) == [body(1, e, 1000) for e in range(500)]
        assert s2.get_entry(1, 500) == random.Random(1).randbytes(3000)
    finally:
        s2.close()


def test_lz4_makes_compressible_data_smaller(tmp_path: Path) -> None:
    sizes = {}
    for compression in ("none", "lz4"):
        s = LedgerStorage(tmp_path / compression, compression=compression)
        s.open()
        fill(s, 1, 1000, 1000)
        s.flush()
        sizes[compression] = s.entry_logger.total_bytes()
        s.close()
    assert sizes["lz4"] < sizes["none"] / 3


def test_switching_compression_between_restarts(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path, compression="lz4")
    s.open()
    fill(s, 1, 100)
    s2 = reopen(s, compression="none")
    fill(s2, 1, 100, start=100)
    s3 = reopen(s2, compression="lz4")
    try:
        assert s3.get_range(1, 0, 199, 1 << 30) == [body(1, e) for e in range(200)]
    finally:
        s3.close()


def test_entry_log_rolls_by_size(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path, entry_log_size_bytes_max=64 << 10, entry_log_block_bytes=8 << 10)
    s.open()
    fill(s, 1, 1000, 500)
    s.flush()
    ids = s.entry_log_ids()
    assert len(ids) >= 7
    for log_id in ids[:-1]:
        assert s.entry_logger.log_size(log_id) <= 64 << 10
    s2 = reopen(s)
    try:
        assert s2.get_range(1, 0, 999, 1 << 30) == [body(1, e, 500) for e in range(1000)]
        fill(s2, 1, 10, start=1000)
        s2.flush()
        assert max(s2.entry_log_ids()) > max(ids)  # a restart starts a new log, ids never reused
    finally:
        s2.close()


def test_block_corruption_raises_never_wrong_bytes(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"corruption seed {seed}")
    rng = random.Random(seed)
    s = LedgerStorage(tmp_path, entry_log_block_bytes=4096, compression=rng.choice(["none", "lz4"]))
    s.open()
    fill(s, 1, 400)
    s.close()
    (log_id,) = s.entry_log_ids()
    path = s.entry_logger.log_path(log_id)
    data = bytearray(path.read_bytes())
    pos = rng.randrange(FILE_HEADER.size, len(data))
    data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    s2 = LedgerStorage(tmp_path)
    s2.open()
    try:
        errors = 0
        for e in range(400):
            try:
                got = s2.get_entry(1, e)
            except CorruptDataError as exc:
                assert path.name in str(exc), str(exc)
                errors += 1
                continue
            assert got == body(1, e), f"seed {seed}: wrong bytes for entry {e} (flip at {pos})"
        assert errors > 0, f"seed {seed}: flip at {pos} went unnoticed"
        with pytest.raises(CorruptDataError):
            s2.get_range(1, 0, 399, 1 << 30)
    finally:
        s2.close()


def test_concurrent_reads_during_adds_and_flushes(tmp_path: Path) -> None:
    s = LedgerStorage(tmp_path, write_cache_bytes_max=256 << 10, read_cache_bytes_max=64 << 10)
    s.open()
    s.set_master_key(1, b"k")
    added = -1
    stop = threading.Event()
    failures: list[str] = []
    reads = [0]

    def flusher() -> None:
        while not stop.is_set():
            s.flush()
            time.sleep(0.002)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            top = added
            if top < 0:
                continue
            e = rng.randint(max(0, top - 300), top)
            try:
                if rng.random() < 0.5:
                    got = s.get_entry(1, e)
                    ok = got == body(1, e, 300)
                else:
                    rng_got = s.get_range(1, e, e + 20, 1 << 20)
                    ok = rng_got[0] == body(1, e, 300) and len(rng_got) >= min(21, top - e + 1)
            except Exception as exc:  # noqa: BLE001 - any miss is a failure
                failures.append(f"entry {e} (added up to {top}): {exc!r}")
                return
            if not ok:
                failures.append(f"entry {e}: wrong bytes")
                return
            reads[0] += 1

    threads = [threading.Thread(target=flusher)] + [
        threading.Thread(target=reader, args=(i,)) for i in range(3)
    ]
    for t in threads:
        t.start()
    try:
        for e in range(8000):
            s.add_entry(1, e, body(1, e, 300))
            added = e
    finally:
        time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        s.close()
    assert not failures, failures[:5]
    assert reads[0] > 100


def test_measure_smoke(tmp_path: Path) -> None:
    for compression in ("none", "lz4"):
        r = measure(tmp_path / compression, entries=2000, entry_bytes=512, compression=compression)
        assert r["entries"] == 2000 and float(r["read_entries_per_s"]) > 0
        assert int(r["bytes_on_disk"]) > 0


def test_flush_accounts_each_ledgers_bytes_per_log_across_shared_blocks(tmp_path: Path, seed: int) -> None:
    """GC decides what a log still holds from these per-(log, ledger) byte counts; a flush puts
    several small ledgers in one block and rolls logs mid-flush, and each must be counted right
    (and survive a restart, from the index)."""
    rng = random.Random(seed)
    s = LedgerStorage(tmp_path, write_cache_bytes_max=64 << 20, entry_log_size_bytes_max=32 << 10,
                      entry_log_block_bytes=8 << 10)
    s.open()
    want: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for ledger in range(1, 9):  # the last one always big enough (~60 KB) to roll a 32 KiB log
        n, size = (rng.randrange(1, 60), rng.choice([0, 7, 200, 3000])) if ledger < 8 else (20, 3000)
        fill(s, ledger, n, size)
        sizes[ledger] = size
        want[ledger] = sum(20 + len(body(ledger, e, size)) for e in range(n))  # 20-byte record header
    s.flush()
    s = reopen(s)
    try:
        per_ledger: dict[int, int] = {}
        for by_ledger in s._index.load_log_meta().values():
            for ledger, n in by_ledger.items():
                per_ledger[ledger] = per_ledger.get(ledger, 0) + n
        assert per_ledger == want
        assert len(s._index.load_log_meta()) > 1, "the flush should have rolled the entry log"
        for ledger, size in sizes.items():
            assert s.get_entry(ledger, 0) == body(ledger, 0, size)
    finally:
        s.close()


def test_a_large_flush_gives_way_to_other_threads_and_the_disk_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush hands the log its bytes a slice at a time, starts each slice's writeback and
    pauses after it (so the journals' disk never gets the whole flush queued at once), pauses
    every BACKGROUND_SLICE_BYTES while building the index (so a thread waiting for the GIL runs),
    and the entries all come back afterwards."""
    from spark_bookie.storage import entry_log
    s = LedgerStorage(tmp_path, write_cache_bytes_max=64 << 20)
    s.open()
    try:
        fill(s, 1, 4000, size=1024)  # ~4 MiB, written to the log and then indexed
        pauses: list[float] = []
        writebacks: list[tuple[int, int]] = []
        real_sleep = time.sleep
        real_writeback = entry_log.start_writeback

        def sleep(seconds: float) -> None:
            if seconds in (entry_log.BACKGROUND_PAUSE_S, entry_log.WRITEBACK_PAUSE_S):
                pauses.append(seconds)
            real_sleep(seconds)

        def writeback(fd: int, offset: int, nbytes: int) -> None:
            writebacks.append((offset, nbytes))
            real_writeback(fd, offset, nbytes)
        monkeypatch.setattr(time, "sleep", sleep)
        monkeypatch.setattr(entry_log, "start_writeback", writeback)
        s.flush()
        monkeypatch.undo()
        slice_bytes, block_max = entry_log.BACKGROUND_SLICE_BYTES, 64 << 10  # blocks of 64 KiB raw here
        per_pass = 4000 * (1024 + entry_log.ENTRY_HEADER.size) // (slice_bytes + block_max) - 1
        log_pauses = pauses.count(entry_log.WRITEBACK_PAUSE_S)
        assert log_pauses >= per_pass, f"{log_pauses} pauses writing the log, expected {per_pass} or more"
        assert len(pauses) - log_pauses >= per_pass, f"{pauses} pauses: too few while indexing"
        # every byte written had its writeback started, in slices, contiguously from the header
        assert len(writebacks) > per_pass
        assert all(n < slice_bytes + block_max + 4096 for _, n in writebacks), writebacks
        assert writebacks[0][0] == entry_log.FILE_HEADER.size
        assert all(a + n == b for (a, n), (b, _) in zip(writebacks, writebacks[1:], strict=False)), writebacks
        log_file = max(p for p in (tmp_path / "current").rglob("*.log") if p.parent.name != "index")
        assert sum(n for _, n in writebacks) + entry_log.FILE_HEADER.size == log_file.stat().st_size
        s = reopen(s)
        assert all(s.get_entry(1, e) == body(1, e, 1024) for e in range(4000))
    finally:
        s.close()


def test_a_flush_the_cache_size_forced_is_not_paced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush forced by a half-full write cache must keep up with the adds: it still starts each
    slice's writeback but does not pause for the journals' sake (it still gives way to the GIL)."""
    from spark_bookie.storage import entry_log
    s = LedgerStorage(tmp_path, write_cache_bytes_max=6 << 20)
    s.open()
    try:
        fill(s, 1, 4000, size=1024)  # ~4 MiB: over half of the cache
        assert s.needs_flush()
        pauses: list[float] = []
        writebacks: list[int] = []
        real_sleep = time.sleep
        real_writeback = entry_log.start_writeback

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            real_sleep(seconds)

        def writeback(fd: int, offset: int, nbytes: int) -> None:
            writebacks.append(nbytes)
            real_writeback(fd, offset, nbytes)
        monkeypatch.setattr(time, "sleep", sleep)
        monkeypatch.setattr(entry_log, "start_writeback", writeback)
        s.flush()
        monkeypatch.undo()
        assert entry_log.WRITEBACK_PAUSE_S not in pauses
        assert pauses.count(entry_log.BACKGROUND_PAUSE_S) >= 2 * 10, pauses
        assert len(writebacks) >= 10 and sum(writebacks) >= 4000 * 1024
        s = reopen(s)
        assert all(s.get_entry(1, e) == body(1, e, 1024) for e in range(4000))
    finally:
        s.close()


def test_flush_that_would_eat_the_index_reserve_is_refused_and_loses_nothing(tmp_path: Path) -> None:
    import shutil

    from spark_bookie.errors import DiskFullError

    free = shutil.disk_usage(tmp_path).free
    s = LedgerStorage(tmp_path / "ledgers", index_reserve_bytes=free)   # more than can ever be left
    s.open()
    try:
        s.set_master_key(1, b"k")
        s.add_entry(1, 0, b"x" * 1000)
        with pytest.raises(DiskFullError):
            s.flush()
        assert s.get_entry(1, 0) == b"x" * 1000 and s.unflushed_bytes() > 0 and s.flushed_bytes_total == 0
        assert s.entry_location(1, 0) is None
        s.index_reserve_bytes = 0
        s.flush()
        assert s.unflushed_bytes() == 0 and s.flushed_bytes_total > 0 and s.entry_location(1, 0) is not None
    finally:
        s.close()
