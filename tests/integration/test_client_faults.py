"""Bookie failures under a writer and readers: ensemble changes, dead replicas, no spare, ZooKeeper."""

from __future__ import annotations

import threading
import time

import pytest
from bookie_helpers import wait_until
from client_helpers import bookie_of, client, data

from ledger_client import LedgerState, errors

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("at_entry", [0, 25])
def test_ensemble_change_at_entry_0_and_mid_ledger(cluster_factory, at_entry):
    sb = cluster_factory(4)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        for i in range(at_entry):
            w.append(data(w.ledger_id, i))
        victim = c.ledger_metadata(w.ledger_id).ensembles[0][1]
        bookie_of(sb, victim).kill()
        futs = [w.append_async(data(w.ledger_id, i)) for i in range(at_entry, at_entry + 50)]
        assert [f.result(30) for f in futs] == list(range(at_entry, at_entry + 50))
        w.close()
        md = c.ledger_metadata(w.ledger_id)
        if at_entry == 0:
            assert list(md.ensembles) == [0] and victim not in md.ensembles[0]  # replaced in place
        else:
            assert sorted(md.ensembles) == [0, at_entry] and victim not in md.ensembles[at_entry]
        r = c.open_ledger(w.ledger_id, b"")
        assert [e.data for e in r.read(0, at_entry + 49)] == [data(w.ledger_id, i) for i in range(at_entry + 50)]


def test_writes_continue_while_a_bookie_dies_mid_stream(cluster_factory, seed):
    import random

    rng = random.Random(seed)
    sb = cluster_factory(4)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        acked: list[int] = []
        futs = []
        kill_at = rng.randrange(200, 800)
        for i in range(1500):
            if i == kill_at:
                bookie_of(sb, c.ledger_metadata(w.ledger_id).ensembles[0][rng.randrange(3)]).kill()
            f = w.append_async(data(w.ledger_id, i))
            f.add_done_callback(lambda f: acked.append(f.result()))
            futs.append(f)
        for f in futs:
            f.result(60)
        assert acked == list(range(1500))  # in order, nothing lost, no error
        w.close()
        r = c.open_ledger(w.ledger_id, b"")
        assert [e.data for e in r.read(0, 1499)] == [data(w.ledger_id, i) for i in range(1500)]


def test_no_spare_bookie_with_delayed_changes_off_closes_the_ledger_at_its_lac(cluster_factory):
    """delay_ensemble_change = false: no spare closes the ledger at once (by default the writer
    goes on without the bookie: tests/integration/test_no_spare_bookie.py)."""
    sb = cluster_factory(3)
    with client(sb, delay_ensemble_change=False) as c:
        w = c.create_ledger(3, 3, 2)
        for i in range(10):
            w.append(data(w.ledger_id, i))
        bookie_of(sb, c.ledger_metadata(w.ledger_id).ensembles[0][0]).kill()
        with pytest.raises(errors.NotEnoughBookiesError):
            for i in range(10, 20):
                w.append(data(w.ledger_id, i))
        wait_until(lambda: c.ledger_metadata(w.ledger_id).state is LedgerState.CLOSED, what="close")
        md = c.ledger_metadata(w.ledger_id)
        assert md.last_entry_id == w.last_add_confirmed >= 9
        r = c.open_ledger(w.ledger_id, b"")
        assert [e.data for e in r.read(0, md.last_entry_id)] == [
            data(w.ledger_id, i) for i in range(md.last_entry_id + 1)]


def test_reads_fail_over_around_dead_replicas(cluster_factory):
    sb = cluster_factory(4)
    with client(sb) as c:
        for e, qw in ((3, 3), (4, 2)):
            w = c.create_ledger(e, qw, 2)
            for i in range(30):
                w.append(data(w.ledger_id, i))
            w.close()
        ids = list(c.list_ledgers())[-2:]
        alive = list(sb.bookies)
        victim = c.ledger_metadata(ids[0]).ensembles[0][0]
        bookie_of(sb, victim).kill()
        for lid in ids:
            r = c.open_ledger(lid, b"")
            t0 = time.monotonic()
            assert [x.data for x in r.read(0, 29)] == [data(lid, i) for i in range(30)]
            assert time.monotonic() - t0 < 20
        assert alive


def test_client_survives_zookeeper_session_expiry(cluster_factory):
    from metadata.zk.testing import expire_session

    sb = cluster_factory(3)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        w.append(b"before")
        expire_session(c.store)
        deadline = time.monotonic() + 30
        while True:  # operations fail cleanly while reconnecting, then work again
            try:
                w2 = c.create_ledger(3, 3, 2)
                break
            except errors.MetadataServiceError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        w2.append(b"after")
        w.append(b"still writing")
        w.close()
        w2.close()
        assert c.ledger_metadata(w.ledger_id).last_entry_id == 1


def test_zookeeper_unreachable_is_a_clear_error(tmp_path):
    from ledger_client import ClientConfig, LedgerClient
    from spark_bookie.local.zookeeper import free_port

    t0 = time.monotonic()
    with pytest.raises(errors.MetadataServiceError):
        LedgerClient(f"127.0.0.1:{free_port()}", config=ClientConfig(zk_connect_timeout_ms=2000))
    assert time.monotonic() - t0 < 20


def test_bookies_unreachable_gives_an_error_not_a_hang(cluster_factory):
    sb = cluster_factory(3)
    with client(sb, add_timeout_ms=2000, operation_timeout_ms=15_000) as c:
        w = c.create_ledger(3, 3, 2)
        w.append(b"x")
        for b in sb.bookies:
            b.kill()
        t0 = time.monotonic()
        with pytest.raises(errors.LedgerError):
            w.append(b"y")
        assert time.monotonic() - t0 < 30


def test_async_client_round_trip(cluster_factory):
    import asyncio

    from ledger_client import AsyncLedgerClient, ClientConfig

    sb = cluster_factory(3)

    async def main():
        async with AsyncLedgerClient(sb.connect_string, config=ClientConfig(zk_session_timeout_ms=4000)) as c:
            w = await c.create_ledger(3, 3, 2, password=b"a")
            ids = await asyncio.gather(*[w.append_async(data(w.ledger_id, i)) for i in range(100)])
            assert list(ids) == list(range(100))
            assert await w.append(b"last") == 100
            await w.close()
            r = await c.open_ledger(w.ledger_id, b"a")
            got = await r.read(0, 100)
            assert [e.data for e in got[:100]] == [data(w.ledger_id, i) for i in range(100)]
            seen = [e.entry_id async for e in r.tail(95, timeout_ms=1000)]
            assert seen == list(range(95, 101))

    asyncio.run(main())
    threading.enumerate()
