"""Striped ledgers (E > Qw) read with listed reads to every bookie at once, against real bookies:
the same entries as an unstriped ledger, a handful of requests rather than one per entry, and
failover when replicas are dead, lack entries or hold corrupt copies."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from client_helpers import bookie_of, client, data

from ledger_client import DigestType, errors
from ledger_client.machines import write_set
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER_BYTES, Digester, master_key
from ledger_client.transport import BookieClient

pytestmark = pytest.mark.integration


@pytest.fixture
def read_calls(monkeypatch):
    """How many per-entry and listed reads the client sends (wrapping BookieClient's methods)."""
    calls: Counter[str] = Counter()
    for name in ("read_future", "read_entries_future", "read_range"):
        orig = getattr(BookieClient, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(BookieClient, name, counted)
    return calls


def _write(c, e: int, qw: int, n: int, size: int = 1024) -> int:
    w = c.create_ledger(e, qw, 2, DigestType.CRC32C, b"pw")
    for fut in [w.append_async(data(w.ledger_id, i, size)) for i in range(n)]:
        fut.result(30)
    w.close()
    return w.ledger_id


def test_striped_read_is_one_listed_read_per_bookie(cluster_factory, read_calls):
    sb = cluster_factory(5)
    with client(sb) as c:
        lid = _write(c, 5, 2, 1_000)
        r = c.open_ledger(lid, b"pw")
        read_calls.clear()
        assert [x.data for x in r.read(0, 999)] == [data(lid, i, 1024) for i in range(1_000)]
        # 200 entries per bookie, 200 KiB answers: one listed read each, no per-entry reads.
        assert read_calls["read_future"] == 0
        assert read_calls["read_entries_future"] == 5
        read_calls.clear()
        assert r.read_arrow(0, 999).column("payload").to_pylist() == [data(lid, i, 1024) for i in range(1_000)]
        assert read_calls["read_future"] == 0 and read_calls["read_entries_future"] == 5


@pytest.mark.parametrize(("e", "qw"), [(5, 2), (3, 2), (4, 3)])
def test_striped_shapes_with_a_dead_replica(cluster_factory, seed, e, qw):
    rng = random.Random(seed)
    sb = cluster_factory(e)
    with client(sb, read_batch_entries_max=rng.choice((7, 64, 2_000)), read_batch_bytes_max=64 << 10) as c:
        lid = _write(c, e, qw, 600, size=rng.choice((10, 1024, 3000)))
        expect = [x.data for x in c.open_ledger(lid, b"pw").read(0, 599)]
        assert expect == [data(lid, i, len(expect[0])) for i in range(600)]
        bookie_of(sb, c.ledger_metadata(lid).ensembles[0][rng.randrange(e)]).kill()
        r = c.open_ledger(lid, b"pw")
        for _ in range(qw):  # every rotation of the first replica
            a = rng.randrange(600)
            b = rng.randrange(a, 600)
            assert [x.data for x in r.read(a, b)] == expect[a:b + 1]
            assert r.read_arrow(0, 599).column("payload").to_pylist() == expect


def _hand_striped(c, e: int, qw: int, n: int, corrupt: dict[int, set[int]], lacks: dict[int, set[int]]) -> int:
    """A striped ledger written by hand: entry i on the bookies of its write set, except bookie b
    lacks the entries in lacks[b] and holds a flipped payload byte on those in corrupt[b]."""
    w = c.create_ledger(e, qw, 2, DigestType.CRC32C, b"pw")
    lid, ensemble = w.ledger_id, w.metadata.ensembles[0]
    dg = Digester(DigestType.CRC32C, b"pw")
    futs = []
    clients = [BookieClient(b) for b in ensemble]
    try:
        for i in range(n + 1):
            for b in write_set(i, e, qw):
                if i in lacks.get(b, set()):
                    continue
                body = bytearray(dg.frame(lid, i, i - 1, 64 * (i + 1), data(lid, i)))
                if i in corrupt.get(b, set()):
                    body[HEADER_BYTES + 4 + 3] ^= 0xFF
                futs.append(clients[b].add(lid, i, master_key(b"pw"), bytes(body)))
        assert all(f.result(10).status == pb.EOK for f in futs)
    finally:
        for bc in clients:
            bc.close()
    return lid


def test_striped_gaps_and_corrupt_copies_fail_over(cluster_factory):
    sb = cluster_factory(4)
    with client(sb, read_batch_entries_max=8) as c:
        # E4/Qw3: entry i is on bookies i, i+1, i+2 (mod 4). Each bad copy has two good ones beside it.
        lid = _hand_striped(c, 4, 3, 60, corrupt={0: {0, 12, 40}, 1: {13, 41}, 2: {2}},
                            lacks={1: {1, 5, 9}, 3: {3, 35}, 2: {34}})
        r = c.open_ledger(lid, b"pw", recovery=False)
        assert r.last_add_confirmed == 59
        for _ in range(3):
            assert [x.data for x in r.read(0, 59)] == [data(lid, i) for i in range(60)]
            assert r.read_arrow(0, 59).column("payload").to_pylist() == [data(lid, i) for i in range(60)]
        bad = _hand_striped(c, 4, 3, 20, corrupt={5 % 4: {5}, 6 % 4: {5}, 7 % 4: {5}}, lacks={})
        r = c.open_ledger(bad, b"pw", recovery=False)
        with pytest.raises(errors.DigestMismatchError):
            r.read(0, 19)
        with pytest.raises(errors.DigestMismatchError):
            r.read_arrow(0, 19)
        assert [x.data for x in r.read(0, 4)] == [data(bad, i) for i in range(5)]
        gone = _hand_striped(c, 4, 3, 20, corrupt={}, lacks={7 % 4: {7}, 8 % 4: {7}, 9 % 4: {7}})
        r = c.open_ledger(gone, b"pw", recovery=False)
        with pytest.raises(errors.NoSuchEntryError):
            r.read_unconfirmed(0, 19)
