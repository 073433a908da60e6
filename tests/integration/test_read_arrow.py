"""ReadHandle.read_arrow against real bookies: same entries as read(), same failover, exact schema."""

from __future__ import annotations

import asyncio
import random

import pyarrow as pa
import pytest
from bookie_helpers import module_cluster
from client_helpers import bookie_of, client, data

from ledger_client import AsyncLedgerClient, DigestType, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER_BYTES, Digester, master_key
from ledger_client.transport import BookieClient

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the module: each test reads ledgers of its own and none stops a "
                       "bookie (the dead-replica test starts four bookies of its own).")

SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary())])


def _as_rows(batch: pa.RecordBatch) -> list[tuple[int, int, bytes]]:
    d = batch.to_pydict()
    return list(zip(d["ledger_id"], d["entry_id"], d["payload"], strict=True))


def _check_same(r, first: int, last: int) -> None:
    batch = r.read_arrow(first, last)
    assert batch.schema == SCHEMA
    assert _as_rows(batch) == [(x.ledger_id, x.entry_id, x.data) for x in r.read(first, last)]


def test_same_entries_as_read_plain_and_striped(sb, seed):
    rng = random.Random(seed)
    # Small range reads: a 700-entry ledger takes many chunks, read in parallel from all replicas.
    with client(sb, read_batch_entries_max=64) as c:
        for e, qw in ((3, 3), (3, 2)):
            w = c.create_ledger(e, qw, 2, DigestType.CRC32C, b"pw")
            sizes = [rng.choice((0, 1, 100, 1024, 5000)) for _ in range(700)]
            for fut in [w.append_async(data(w.ledger_id, i, n)) for i, n in enumerate(sizes)]:
                fut.result(30)
            w.close()
            r = c.open_ledger(w.ledger_id, b"pw")
            _check_same(r, 0, 699)
            _check_same(r, 63, 64)       # across a chunk boundary
            _check_same(r, 5, 5)         # one entry
            a = rng.randrange(700)
            _check_same(r, a, rng.randrange(a, 700))
            assert r.read_arrow(700, 699).num_rows == 0   # empty range just past the end


def test_dead_replica_is_skipped(cluster_factory):
    sb = cluster_factory(4)
    with client(sb, read_batch_entries_max=50) as c:
        ids = []
        for e, qw in ((3, 3), (4, 2)):
            w = c.create_ledger(e, qw, 2)
            for fut in [w.append_async(data(w.ledger_id, i)) for i in range(300)]:
                fut.result(30)
            w.close()
            ids.append(w.ledger_id)
        bookie_of(sb, c.ledger_metadata(ids[0]).ensembles[0][0]).kill()
        for lid in ids:
            r = c.open_ledger(lid, b"")
            for _ in range(3):  # every rotation of the starting replica
                assert r.read_arrow(0, 299).column("payload").to_pylist() == [data(lid, i) for i in range(300)]


def _hand_written_ledger(c, digest_type: DigestType, corrupt: dict[int, set[int]], n: int = 40) -> int:
    """Entries 0..n (lac = id - 1) added to each bookie by hand; bookie i gets a flipped payload byte
    on the entries in corrupt[i]. The reader's LAC is then n - 1."""
    w = c.create_ledger(3, 3, 2, digest_type, b"pw")
    lid = w.ledger_id
    dg = Digester(digest_type, b"pw")
    for i, bookie in enumerate(w.metadata.ensembles[0]):
        with BookieClient(bookie) as bc:
            futs = []
            for e in range(n + 1):
                body = bytearray(dg.frame(lid, e, e - 1, 64 * (e + 1), data(lid, e)))
                if e in corrupt.get(i, set()):
                    body[HEADER_BYTES + dg.digest_type.digest_bytes + 3] ^= 0xFF
                futs.append(bc.add(lid, e, master_key(b"pw"), bytes(body)))
            assert all(f.result(10).status == pb.EOK for f in futs)
    return lid


@pytest.mark.parametrize("digest_type", [DigestType.CRC32C, DigestType.CRC32, DigestType.HMAC])
def test_corrupt_copies_are_skipped(sb, digest_type):
    with client(sb, read_batch_entries_max=16) as c:
        # Every replica is corrupt somewhere, never two on the same entry: only failover gets it all.
        lid = _hand_written_ledger(c, digest_type, {0: {3, 20}, 1: {7, 21}, 2: {0, 39}})
        r = c.open_ledger(lid, b"pw", recovery=False)
        assert r.last_add_confirmed == 39
        for _ in range(3):
            assert r.read_arrow(0, 39).column("payload").to_pylist() == [data(lid, i) for i in range(40)]
        bad = _hand_written_ledger(c, digest_type, {0: {5}, 1: {5}, 2: {5}})
        r = c.open_ledger(bad, b"pw", recovery=False)
        with pytest.raises(errors.DigestMismatchError):
            r.read_arrow(0, 39)
        assert r.read_arrow(0, 4).num_rows == 5


def test_range_rules_and_async(sb):
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        r0 = c.open_ledger(w.ledger_id, b"", recovery=False)
        empty = r0.read_arrow(0, r0.last_add_confirmed)   # 0..-1: an empty ledger scans as no rows
        assert empty.num_rows == 0 and empty.schema == SCHEMA
        for i in range(10):
            w.append(data(w.ledger_id, i))
        r = c.open_ledger(w.ledger_id, b"", recovery=False)
        lac = r.read_last_add_confirmed()
        assert lac >= 8
        with pytest.raises(errors.IncorrectParameterError, match="past the last add confirmed"):
            r.read_arrow(0, lac + 1)
        for first, last in ((-1, 3), (5, 2), (0, "3")):
            with pytest.raises(errors.IncorrectParameterError):
                r.read_arrow(first, last)
        one = r.read_arrow(lac, lac)
        assert _as_rows(one) == [(w.ledger_id, lac, data(w.ledger_id, lac))]
        w.close()

    async def main() -> list[bytes]:
        async with AsyncLedgerClient(sb.connect_string) as ac:
            h = await ac.open_ledger(w.ledger_id, b"")
            return (await h.read_arrow(0, 9)).column("payload").to_pylist()

    assert asyncio.run(main()) == [data(w.ledger_id, i) for i in range(10)]
