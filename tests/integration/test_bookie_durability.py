"""A real bookie process under SIGKILL, restart, torn journals: no acknowledged entry is lost."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from bookie_helpers import KEY, add_all, body, check_entry, wait_until

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.transport import BookieClient
from spark_bookie.storage.journal import iter_records

pytestmark = pytest.mark.integration

# Keep everything in the journal (no checkpoint) so that replay is what brings entries back.
JOURNAL_ONLY = {"flush_interval_ms": 3_600_000, "write_cache_bytes_max": 256 << 20}


def test_acked_entries_survive_kill_9_and_restart(cluster_factory, seed):
    rng = random.Random(seed)
    sb = cluster_factory(1)
    b = sb.bookies[0]
    acked: list[int] = []
    lock = threading.Lock()
    stop_after = rng.randrange(2000, 6000)
    client = BookieClient(b.bookie_id)

    class Sink:
        def on_add_results(self, bookie, ok, failed):
            with lock:
                acked.extend(ok)

    sink = Sink()

    def writer():
        for e in range(20_000):
            try:
                client.add_async(1, e, KEY, body(1, e), sink)
            except Exception:
                return

    t = threading.Thread(target=writer)
    t.start()
    wait_until(lambda: len(acked) >= stop_after, what=f"{stop_after} acks")
    b.kill()  # SIGKILL mid-stream, adds still in flight
    t.join(timeout=60)
    client.close()
    with lock:
        survivors = sorted(acked)
    assert len(survivors) >= stop_after
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        for e in survivors:
            check_entry(c, 1, e)
        r = c.read(1, -1)
        assert r.status == pb.EOK and r.entry_id >= survivors[-1]


def _last_journal(b) -> Path:
    files = sorted(Path(b.journal_dir).rglob("*.txn"))
    assert files, "no journal files"
    # The newest file with records in it (a restart opens a new, empty one).
    for f in reversed(files):
        if any(True for _ in iter_records(f)):
            return f
    raise AssertionError("no journal records")


@pytest.mark.parametrize("damage", ["cut_mid_record", "garbage_tail"])
def test_torn_journal_replays_every_complete_record(cluster_factory, seed, damage):
    rng = random.Random(seed)
    sb = cluster_factory(1, **JOURNAL_ONLY)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        assert all(r.status == pb.EOK for r in add_all(c, 5, range(200)))
    b.kill()
    jf = _last_journal(b)
    records = list(iter_records(jf))
    adds = [(off, rec) for off, rec in records if rec.ledger_id == 5 and rec.entry_id >= 0]
    assert len(adds) == 200
    last_off, last_rec = adds[-1]
    end = last_off + 8 + 17 + len(last_rec.payload)
    if damage == "cut_mid_record":
        cut = rng.randrange(last_off + 1, end)  # inside the last record
        with open(jf, "r+b") as f:
            f.truncate(cut)
        expect_present, expect_absent = range(199), [199]
    else:
        with open(jf, "r+b") as f:
            f.seek(end)
            f.write(os.urandom(rng.randrange(1, 4096)))
        expect_present, expect_absent = range(200), []
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        for e in expect_present:
            check_entry(c, 5, e)
        for e in expect_absent:
            assert c.read(5, e).status == pb.ENOENTRY
        # The bookie keeps working after replaying a damaged journal.
        assert add_all(c, 5, range(len(expect_present), 210))[-1].status == pb.EOK
        check_entry(c, 5, 209)


def test_fence_survives_restart(cluster_factory):
    sb = cluster_factory(1, **JOURNAL_ONLY)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        add_all(c, 9, range(10))
        r = c.read(9, 9, fence=True, master_key=KEY)
        assert r.status == pb.EOK
        assert add_all(c, 9, range(10, 11))[0].status == pb.EFENCED
    b.kill()
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        assert add_all(c, 9, range(10, 11))[0].status == pb.EFENCED
        # Recovery adds are still accepted on a fenced ledger.
        assert add_all(c, 9, range(10, 11), recovery=True)[0].status == pb.EOK
        check_entry(c, 9, 10)


def test_fence_of_unknown_ledger_is_recorded(cluster_factory):
    sb = cluster_factory(1, **JOURNAL_ONLY)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        assert c.read(77, 0, fence=True, master_key=KEY).status == pb.ENOENTRY
    b.kill()
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        assert add_all(c, 77, range(1))[0].status == pb.EFENCED


def test_explicit_lac_and_long_poll_survive_restart(cluster_factory):
    from bookie_helpers import DIGEST

    sb = cluster_factory(1, **JOURNAL_ONLY)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        add_all(c, 3, range(5))
        assert c.write_lac(3, 4, KEY, DIGEST.frame_lac(3, 4)).status == pb.EOK
        # Long poll: answered at once when the LAC is already past what the reader saw ...
        assert c.read(3, 5, previous_lac=2, long_poll_timeout_ms=5000).max_lac == 4
        # ... and woken by a later add that piggybacks a higher LAC.
        result = {}
        t = threading.Thread(target=lambda: result.update(r=c.read(
            3, 5, previous_lac=4, long_poll_timeout_ms=20_000, piggyback=True)))
        t.start()
        add_all(c, 3, range(5, 7))  # entry 6 carries lac 5
        t.join(timeout=30)
        assert result["r"].status == pb.EOK and result["r"].max_lac == 5
        assert result["r"].body == body(3, 5)
        # A poll that nothing answers times out with the LAC unchanged.
        assert c.read(3, 7, previous_lac=5, long_poll_timeout_ms=200).max_lac == 5
    b.kill()
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        r = c.read_lac(3)
        assert r.status == pb.EOK and DIGEST.unframe_lac(r.lac_body, 3) == 4
        assert c.read(3, -1).entry_id == 6
