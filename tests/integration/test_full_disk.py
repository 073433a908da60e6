"""A bookie whose ledger disk fills up keeps every acknowledged entry readable, and comes back
after a crash (read-only while the disk stays full, writable again once space is freed).

Real small filesystems: the ledger directory is a 64 MiB tmpfs mounted by the test (CI runs as
root, as `mount` needs). The journal gets a roomy tmpfs of its own: the bookie watches its disk too
(the worst fraction decides), and a host disk past the 90% low-water mark would otherwise keep the
bookie read-only after the test frees its ledger disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bookie_helpers import body, tmpfs_fixture, wait_until  # noqa: F401  (the `tmpfs` fixture)

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import master_key
from ledger_client.transport import BookieClient
from spark_bookie.storage.entry_log import EntryLogger, log_file_name

pytestmark = pytest.mark.integration

ENTRY = 64 * 1024
LEDGER = 21


def _disks(sb, tmpfs) -> Path:
    """The bookie's ledger disk (64 MiB) and a journal disk the host's own usage cannot fill."""
    tmpfs(sb.root / "bookie-0" / "journal", 512)
    return tmpfs(sb.root / "bookie-0" / "ledgers", 64)


def _fill(c: BookieClient, first: int, limit: int) -> list[int]:
    """Add 64 KiB entries until the bookie refuses one; the ids it acknowledged."""
    acked: list[int] = []
    for e in range(first, first + limit):
        r = c.add(LEDGER, e, master_key(b""), body(LEDGER, e, ENTRY)).result(30)
        if r.status != pb.EOK:
            assert r.status == pb.EREADONLY, pb.StatusCode.Name(r.status)
            return acked
        acked.append(e)
    raise AssertionError(f"the bookie took {limit} entries of {ENTRY} B on a 64 MiB disk")


def _read_all(c: BookieClient, ids: list[int]) -> None:
    for e in ids:
        r = c.read(LEDGER, e)
        assert r.status == pb.EOK, f"entry {e}: {pb.StatusCode.Name(r.status)} {r.detail}"
        assert r.body == body(LEDGER, e, ENTRY), f"entry {e} differs"


def test_full_ledger_disk_restarts_read_only_and_recovers(cluster_factory, tmpfs):
    sb = cluster_factory(0)
    disk = _disks(sb, tmpfs)
    filler = disk / "filler.bin"          # space the test frees at the end
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 24 << 20)
    sb.store.ledgers.create_ledger_node(LEDGER, b"")
    b = sb.add_bookie()                   # default thresholds: 95% read-only, 90% writable again
    store = sb.store
    with BookieClient(b.bookie_id) as c:
        acked = _fill(c, 0, 2_000)
        assert len(acked) > 100
        wait_until(lambda: b.bookie_id in store.cluster.list_bookies(readonly=True), what="read-only registration")
        _read_all(c, acked)
    b.kill()
    sb.restart(b)                         # it must start: read-only, serving reads
    assert b.bookie_id in store.cluster.list_bookies(readonly=True) and b.bookie_id not in store.cluster.list_bookies()
    with BookieClient(b.bookie_id) as c:
        _read_all(c, acked)
        assert c.add(LEDGER, acked[-1] + 1, master_key(b""), body(LEDGER, acked[-1] + 1, ENTRY)).result(30).status \
            == pb.EREADONLY
        assert c.info().read_only
        filler.unlink()
        wait_until(lambda: b.bookie_id in store.cluster.list_bookies()
                   and b.bookie_id not in store.cluster.list_bookies(readonly=True),
                   what="writable registration after space was freed")
        more = [acked[-1] + 1 + i for i in range(20)]
        for e in more:
            assert c.add(LEDGER, e, master_key(b""), body(LEDGER, e, ENTRY)).result(30).status == pb.EOK
        _read_all(c, acked + more)
    b.kill()                               # and once more after the writes that followed
    sb.restart(b)
    with BookieClient(b.bookie_id) as c:
        _read_all(c, acked + more)


def test_bookie_starts_read_only_on_a_disk_filled_to_the_last_byte(cluster_factory, tmpfs):
    """Someone else took every byte (the reserves included) while the bookie was down: it still
    starts, read-only, and serves what it acknowledged; freed space makes it writable again."""
    sb = cluster_factory(0)
    disk = _disks(sb, tmpfs)
    sb.store.ledgers.create_ledger_node(LEDGER, b"")
    b = sb.add_bookie(flush_interval_ms=200)
    with BookieClient(b.bookie_id) as c:
        acked = [e for e in range(200)
                 if c.add(LEDGER, e, master_key(b""), body(LEDGER, e, ENTRY)).result(30).status == pb.EOK]
        assert len(acked) == 200
    b.kill()                               # some of it only in the journal (on another disk)
    hog = disk / "hog.bin"
    with open(hog, "wb") as f:             # every free byte
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    sb.restart(b)
    store = sb.store
    assert b.bookie_id in store.cluster.list_bookies(readonly=True)
    with BookieClient(b.bookie_id) as c:
        _read_all(c, acked)
        hog.unlink()
        wait_until(lambda: b.bookie_id in store.cluster.list_bookies()
                   and b.bookie_id not in store.cluster.list_bookies(readonly=True),
                   what="writable after space was freed")
        assert c.add(LEDGER, 200, master_key(b""), body(LEDGER, 200, ENTRY)).result(30).status == pb.EOK
        _read_all(c, acked + [200])


def test_an_entry_log_orphaned_by_a_crash_is_reclaimed_at_once_on_a_full_disk(cluster_factory, tmpfs):
    """A crash in the middle of a flush leaves an entry log the index never heard of (the journal
    replays its entries into a new one). On a nearly full disk that dead space made the bookie
    start read-only and stay so until its next GC round (an hour in these tests); turning
    read-only now runs a GC round at once, as BookKeeper forces GC when its disks fill."""
    sb = cluster_factory(0)
    disk = _disks(sb, tmpfs)
    sb.store.ledgers.create_ledger_node(LEDGER, b"")
    b = sb.add_bookie()
    with BookieClient(b.bookie_id) as c:
        acked = [e for e in range(20)
                 if c.add(LEDGER, e, master_key(b""), body(LEDGER, e, ENTRY)).result(30).status == pb.EOK]
        assert len(acked) == 20
    b.kill()
    current = disk / "current"
    orphan_id = max([int(p.stem, 16) for p in current.glob("*.log")], default=-1) + 1
    orphan = EntryLogger(current, log_size_bytes_max=1 << 30, block_bytes=64 << 10, compression="none",
                         allocate_log_id=lambda: orphan_id)
    # the interrupted flush: 52 MiB of real blocks, synced, never indexed (leaves < 12 MiB free)
    orphan.append([(LEDGER, 1_000 + i, body(LEDGER, 1_000 + i, ENTRY)) for i in range(52 * 16)])
    orphan.sync()
    orphan.close()
    assert (current / log_file_name(orphan_id)).exists()
    sb.restart(b)
    store = sb.store
    with BookieClient(b.bookie_id) as c:
        wait_until(lambda: not c.info().read_only and b.bookie_id in store.cluster.list_bookies()
                   and b.bookie_id not in store.cluster.list_bookies(readonly=True),
                   what="writable again once GC took the orphaned log")
        assert "bookie is now READ-ONLY" in b.log_tail(200)   # it did start read-only
        assert not (current / log_file_name(orphan_id)).exists()
        _read_all(c, acked)
        assert c.add(LEDGER, 20, master_key(b""), body(LEDGER, 20, ENTRY)).result(30).status == pb.EOK
        _read_all(c, acked + [20])
