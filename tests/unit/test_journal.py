"""The journal on real files with real fsync: round trips, torn tails, group commit, failures."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from ledger_client.protocol.checks import InvariantViolation
from spark_bookie.errors import StorageIOError
from spark_bookie.storage.journal import (
    FIXED_BYTES,
    INLINE_GROUP_BYTES_MAX,
    Journal,
    JournalPosition,
    JournalRecord,
    RecordType,
    encode_record,
    iter_records,
    list_journal_files,
)

pytestmark = pytest.mark.unit

WAIT_S = 10.0
Callback = Callable[[BaseException | None], None]


class Completions:
    """Collects callback results; `wait()` blocks until `expected` callbacks have run."""

    def __init__(self) -> None:
        self.results: list[tuple[int, BaseException | None]] = []
        self._cond = threading.Condition()

    def callback(self, tag: int) -> Callback:
        def cb(err: BaseException | None) -> None:
            with self._cond:
                self.results.append((tag, err))
                self._cond.notify_all()
        return cb

    def wait(self, expected: int) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.results) >= expected, timeout=WAIT_S)
        assert ok, f"only {len(self.results)} of {expected} callbacks ran"


def all_types(ledger_id: int, n: int, rnd: random.Random) -> list[JournalRecord]:
    out = [JournalRecord(RecordType.MASTER_KEY, ledger_id, -1, b"key-%d" % ledger_id)]
    for e in range(n):
        out.append(JournalRecord(RecordType.ADD, ledger_id, e, rnd.randbytes(rnd.randrange(0, 300))))
        if e % 3 == 2:
            out.append(JournalRecord(RecordType.EXPLICIT_LAC, ledger_id, e - 1, b"lac-body-%d" % e))
    out.append(JournalRecord(RecordType.FENCE, ledger_id, -1, b""))
    return out


def write_session(d: Path, batches: Sequence[Sequence[JournalRecord]], **kw: int) -> Journal:
    """Start a journal, submit the batches, wait for all of them, stop; returns the stopped journal."""
    j = Journal(d, **kw)
    j.start()
    done = Completions()
    for i, b in enumerate(batches):
        j.submit(b, done.callback(i))
    done.wait(len(batches))
    j.stop()
    assert all(err is None for _, err in done.results)
    return j


def replay_all(d: Path, mark: JournalPosition | None = None) -> list[JournalRecord]:
    out: list[JournalRecord] = []
    n = Journal(d).replay(mark, out.append)
    assert n == len(out)
    return out


def chunks(records: list[JournalRecord], size: int) -> list[list[JournalRecord]]:
    return [records[i:i + size] for i in range(0, len(records), size)]


def test_encode_and_iter_records_round_trip(tmp_path: Path) -> None:
    recs = all_types(7, 10, random.Random(1))
    data = b"".join(encode_record(r) for r in recs)
    path = tmp_path / "x.txn"
    path.write_bytes(data + bytes(64))  # trailing zeros = preallocated space
    got = list(iter_records(path))
    assert [r for _, r in got] == recs
    offsets = [o for o, _ in got]
    assert offsets[0] == 0
    assert offsets[1] == len(encode_record(recs[0]))
    assert [r for _, r in iter_records(path, offsets[3])] == recs[3:]


def test_round_trip_all_types_across_restart_and_roll(tmp_path: Path) -> None:
    rnd = random.Random(2)
    first = all_types(1, 40, rnd) + all_types(2, 5, rnd)
    kw = {"file_size_bytes_max": 2048, "preallocate_bytes": 1024, "group_commit_bytes_max": 600}
    write_session(tmp_path, chunks(first, 4), **kw)
    assert len(list_journal_files(tmp_path)) > 2, "small file_size_bytes_max must roll files"
    assert replay_all(tmp_path) == first
    second = all_types(3, 30, rnd)
    write_session(tmp_path, chunks(second, 7), **kw)
    assert replay_all(tmp_path) == first + second
    assert {r.type for r in first} == set(RecordType)


def test_restart_opens_a_new_file_and_never_touches_old_ones(tmp_path: Path) -> None:
    recs = all_types(1, 5, random.Random(3))
    write_session(tmp_path, [recs], preallocate_bytes=4096)
    (old_id, old_path), = list_journal_files(tmp_path)
    assert old_path.stat().st_size == sum(len(encode_record(r)) for r in recs), "stop trims preallocation"
    digest = hashlib.sha256(old_path.read_bytes()).digest()
    j = Journal(tmp_path, preallocate_bytes=4096)
    j.start()
    try:
        ids = [i for i, _ in list_journal_files(tmp_path)]
        assert ids == [old_id, old_id + 1]
        assert (tmp_path / f"{old_id + 1:016x}.txn").stat().st_size >= 4096, "new file is preallocated"
        assert j.last_written_position() == JournalPosition(old_id + 1, 0)
    finally:
        j.stop()
    assert hashlib.sha256(old_path.read_bytes()).digest() == digest


def test_replay_from_mark_skips_earlier_records(tmp_path: Path) -> None:
    rnd = random.Random(4)
    before, after = all_types(1, 20, rnd), all_types(2, 20, rnd)
    j = Journal(tmp_path, file_size_bytes_max=1500, preallocate_bytes=512)
    j.start()
    done = Completions()
    for i, b in enumerate(chunks(before, 5)):
        j.submit(b, done.callback(i))
    done.wait(len(chunks(before, 5)))
    mark = j.last_written_position()
    for i, b in enumerate(chunks(after, 5)):
        j.submit(b, done.callback(100 + i))
    j.stop()
    assert len(done.results) == len(chunks(before, 5)) + len(chunks(after, 5))
    assert replay_all(tmp_path, mark) == after
    assert replay_all(tmp_path, JournalPosition(mark.file_id + 1000, 0)) == []
    assert replay_all(tmp_path) == before + after


def test_file_cut_mid_record_replays_exactly_the_complete_records(tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    print(f"seed={seed}")
    rnd = random.Random(seed)
    recs = all_types(1, 12, rnd) + [JournalRecord(RecordType.ADD, 1, 12, rnd.randbytes(300))]
    src = tmp_path / "src"
    write_session(src, chunks(recs, 3))
    (_, path), = list_journal_files(src)
    size = path.stat().st_size
    last_off = size - len(encode_record(recs[-1]))
    cuts = {last_off, last_off + 1, last_off + 7, last_off + 8, last_off + 8 + FIXED_BYTES, size - 1}
    cuts |= {rnd.randrange(last_off, size) for _ in range(8)}
    assert all(last_off <= c < size for c in cuts)
    for cut in sorted(cuts):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(src, d)
        with open(d / path.name, "r+b") as f:
            f.truncate(cut)
        assert replay_all(d) == recs[:-1], f"cut at {cut} (seed {seed})"


def test_file_ending_in_garbage_replays_exactly_the_complete_records(tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    print(f"seed={seed}")
    rnd = random.Random(seed)
    recs = all_types(1, 12, rnd)
    src = tmp_path / "src"
    write_session(src, chunks(recs, 3))
    (_, path), = list_journal_files(src)
    for i in range(10):
        d = tmp_path / f"g{i}"
        shutil.copytree(src, d)
        garbage = rnd.randbytes(rnd.randrange(1, 200))
        if i == 0:
            garbage = b"\x00\x00\x00\x40" + garbage  # a plausible length that runs past the end
        with open(d / path.name, "ab") as f:
            f.write(garbage)
        assert replay_all(d) == recs, f"garbage {garbage.hex()} (seed {seed})"


def test_corrupt_crc_mid_file_stops_that_file_but_next_file_replays(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rnd = random.Random(5)
    first, second = all_types(1, 10, rnd), all_types(2, 10, rnd)
    write_session(tmp_path, chunks(first, 4))
    write_session(tmp_path, chunks(second, 4))
    (_, path1), (_, path2) = list_journal_files(tmp_path)
    k = 6
    offset = sum(len(encode_record(r)) for r in first[:k])
    data = bytearray(path1.read_bytes())
    data[offset + 4] ^= 0xFF  # first byte of record k's crc
    path1.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="spark_bookie.storage.journal"):
        assert replay_all(tmp_path) == first[:k] + second
    assert any(path1.name in m and f"offset {offset}" in m for m in caplog.messages), caplog.messages


def test_corrupt_type_or_short_length_is_a_torn_tail(tmp_path: Path) -> None:
    recs = all_types(1, 3, random.Random(6))
    good = b"".join(encode_record(r) for r in recs)
    bad_type = bytearray(encode_record(JournalRecord(RecordType.ADD, 1, 9, b"x")))
    bad_type[8] = 99  # type byte; fix the crc so only the type is wrong
    import google_crc32c
    bad_type[4:8] = google_crc32c.value(bytes(bad_type[8:])).to_bytes(4, "big")
    short = (5).to_bytes(4, "big") + bytes(4) + b"abcde"
    for tail in (bytes(bad_type), short):
        p = tmp_path / "f.txn"
        p.write_bytes(good + tail + good)
        assert [r for _, r in iter_records(p)] == recs


def test_callbacks_in_order_only_after_fdatasync_and_grouped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fdatasync = os.fdatasync
    durable: set[tuple[int, int]] = set()
    syncs = [0]

    def counting_fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        durable.update((r.ledger_id, r.entry_id) for _, r in iter_records(path))
        syncs[0] += 1

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    j = Journal(tmp_path, group_commit_wait_ms=5.0)
    j.start()
    order: list[int] = []
    violations: list[int] = []
    submits = 300

    def make_cb(i: int, ids: list[tuple[int, int]]) -> Callback:
        def cb(err: BaseException | None) -> None:
            if err is not None or not set(ids) <= durable:
                violations.append(i)
            order.append(i)
        return cb

    for i in range(submits):
        recs = [JournalRecord(RecordType.ADD, 1, i * 4 + k, b"p" * 100) for k in range(4)]
        j.submit(recs, make_cb(i, [(1, r.entry_id) for r in recs]))
    j.stop()
    assert order == list(range(submits))
    assert violations == []
    assert 0 < syncs[0] < submits, f"{syncs[0]} fdatasyncs for {submits} submits: no group commit"
    assert j.groups_synced == syncs[0]


def test_stop_drains_and_later_submits_raise(tmp_path: Path) -> None:
    j = Journal(tmp_path, group_commit_wait_ms=50.0)
    done = Completions()
    with pytest.raises(StorageIOError):
        j.submit([JournalRecord(RecordType.FENCE, 1, -1)], done.callback(-1))  # not started
    j.start()
    recs = [JournalRecord(RecordType.ADD, 1, e, b"d%d" % e) for e in range(500)]
    for i, b in enumerate(chunks(recs, 5)):
        j.submit(b, done.callback(i))
    j.submit([], done.callback(999))  # an empty submit is a barrier: completes after the rest
    j.stop()
    assert [t for t, _ in done.results] == list(range(100)) + [999]
    assert all(err is None for _, err in done.results)
    with pytest.raises(StorageIOError):
        j.submit([JournalRecord(RecordType.FENCE, 1, -1)], done.callback(-2))
    j.stop()  # idempotent
    assert j.failed is None
    assert replay_all(tmp_path) == recs


def test_replay_after_start_is_refused(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.start()
    try:
        with pytest.raises(InvariantViolation):
            j.replay(None, lambda r: None)
    finally:
        j.stop()


def test_back_pressure_blocks_submit_until_the_queue_drains(tmp_path: Path) -> None:
    j = Journal(tmp_path, queue_records_max=4, group_commit_wait_ms=0.0)
    j.start()
    release = threading.Event()
    entered = threading.Event()

    def blocking_cb(err: BaseException | None) -> None:  # stalls the journal thread
        entered.set()
        release.wait(WAIT_S)

    done = Completions()
    j.submit([JournalRecord(RecordType.ADD, 1, 0, b"a")], blocking_cb)
    assert entered.wait(WAIT_S)
    submitted = threading.Event()

    def producer() -> None:
        for i in range(5):
            batch = [JournalRecord(RecordType.ADD, 1, 1 + 2 * i + k, b"b") for k in range(2)]
            j.submit(batch, done.callback(i))
        submitted.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not submitted.wait(0.3), "10 records must not fit a queue of 4 while the journal is stalled"
    release.set()
    assert submitted.wait(WAIT_S)
    t.join()
    done.wait(5)
    j.stop()
    assert [e.entry_id for e in replay_all(tmp_path)] == list(range(11))


def test_remove_files_before_deletes_only_older_files(tmp_path: Path) -> None:
    for s in range(3):
        write_session(tmp_path, [[JournalRecord(RecordType.ADD, 1, s, b"x")]])
    ids = [i for i, _ in list_journal_files(tmp_path)]
    assert len(ids) == 3
    (tmp_path / "VERSION").write_text("cookie")  # other files in the directory are left alone
    j = Journal(tmp_path)
    j.start()
    try:
        removed = j.remove_files_before(JournalPosition(ids[2], 0))
        assert removed == [tmp_path / f"{i:016x}.txn" for i in ids[:2]]
        assert [i for i, _ in list_journal_files(tmp_path)] == [ids[2], ids[2] + 1]
        # even a mark past the current file never deletes the file being written
        assert j.remove_files_before(JournalPosition(ids[2] + 50, 0)) == [tmp_path / f"{ids[2]:016x}.txn"]
        assert [i for i, _ in list_journal_files(tmp_path)] == [ids[2] + 1]
    finally:
        j.stop()
    assert (tmp_path / "VERSION").exists()


def test_fdatasync_failure_reaches_callback_and_fails_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path)
    j.start()
    done = Completions()
    j.submit([JournalRecord(RecordType.ADD, 1, 0, b"ok")], done.callback(0))
    done.wait(1)

    def broken_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken_fdatasync)
    j.submit([JournalRecord(RecordType.ADD, 1, 1, b"lost")], done.callback(1))
    done.wait(2)
    tag, err = done.results[1]
    assert tag == 1 and isinstance(err, StorageIOError)
    assert isinstance(j.failed, StorageIOError)
    with pytest.raises(StorageIOError):
        j.submit([JournalRecord(RecordType.ADD, 1, 2, b"refused")], done.callback(2))
    j.stop()
    assert done.results[0] == (0, None)
    assert len(done.results) == 2


def test_a_function_returned_by_callbacks_runs_once_per_group_after_them(tmp_path: Path) -> None:
    """What lets a bookie connection answer all of its adds in a group with one message: each
    callback only collects, the function they return sends, once, after the group's last callback."""
    j = Journal(tmp_path, group_commit_wait_ms=200.0)  # every submit below lands in one group
    j.start()
    events: list[str] = []
    sent = threading.Event()

    def send() -> None:
        events.append("send")
        sent.set()

    def collect(i: int) -> Callable[[BaseException | None], Callable[[], None]]:
        def cb(err: BaseException | None) -> Callable[[], None]:
            events.append(f"cb{i}:{err}")
            return send
        return cb

    for i in range(3):
        j.submit([JournalRecord(RecordType.ADD, 1, i, b"x")], collect(i))
    assert sent.wait(5)
    j.stop()
    assert j.groups_synced == 1
    assert events == ["cb0:None", "cb1:None", "cb2:None", "send"]


def test_commit_here_writes_a_small_group_on_the_callers_thread_when_idle(tmp_path: Path) -> None:
    j = Journal(tmp_path, group_commit_wait_ms=0.0)
    j.start()
    try:
        ran_on: list[int] = []
        j.submit([JournalRecord(RecordType.ADD, 1, 0, b"small")], lambda err: ran_on.append(threading.get_ident()),
                 wake=False)
        j.commit_here()
        assert ran_on == [threading.get_ident()], "an idle journal's small group was not committed here"
        assert j.groups_synced == 1
        big = b"x" * (INLINE_GROUP_BYTES_MAX + 1)
        done = Completions()
        j.submit([JournalRecord(RecordType.ADD, 1, 1, big)], done.callback(1), wake=False)
        j.commit_here()  # too big to hold up the caller: the journal thread writes it
        done.wait(1)
        assert done.results == [(1, None)]
    finally:
        j.stop()
    assert [r.entry_id for r in replay_all(tmp_path)] == [0, 1]


def test_commit_here_from_many_threads_keeps_submission_order_and_durability(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connection threads committing their own groups, the journal thread taking the rest: one
    group at a time, callbacks in submission order, each only after its records are synced."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    real_fdatasync = os.fdatasync
    durable: set[int] = set()

    def counting_fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        durable.update(r.entry_id for _, r in iter_records(os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    j = Journal(tmp_path, group_commit_wait_ms=0.0)
    j.start()
    submitted: list[int] = []
    completed: list[int] = []
    late: list[int] = []
    order_lock = threading.Lock()

    def worker(w: int) -> None:
        rnd = random.Random(seed + w)
        for i in range(250):
            eid = w * 1000 + i
            size = rnd.choice([10, 100, INLINE_GROUP_BYTES_MAX + 10])

            def cb(err: BaseException | None, eid: int = eid) -> None:
                if err is not None or eid not in durable:
                    late.append(eid)
                completed.append(eid)

            here = rnd.random() < 0.8
            with order_lock:  # the order submits enter the queue, as the test sees it
                j.submit([JournalRecord(RecordType.ADD, 1, eid, b"p" * size)], cb, wake=not here)
                submitted.append(eid)
            if here:
                j.commit_here()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    j.stop()
    assert late == []
    assert completed == submitted
    assert [r.entry_id for r in replay_all(tmp_path)] == submitted
