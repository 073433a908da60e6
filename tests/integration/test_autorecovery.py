"""Autorecovery with real ZooKeeper and real bookie processes, each running an auditor candidate and
a replication worker beside it (``autorecovery_enabled``): a bookie killed with SIGKILL is replaced
in every ledger, closed and open, and every entry reads back from every replica with it still down."""

from __future__ import annotations

import random
import threading
import time

import pytest
from autorecovery_helpers import (
    assert_every_replica_has_every_entry,
    ledgers_naming,
    wait_fully_repaired,
    write_autorecovery_conf,
    write_ledger,
)
from bookie_helpers import wait_until
from client_helpers import bookie_of, client, data

from ledger_client import errors
from metadata import LedgerState

pytestmark = pytest.mark.integration

ENTRIES = 60


def test_killed_bookie_is_replaced_in_closed_and_open_ledgers(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(5, autorecovery_enabled=True, autorecovery_conf=str(conf))
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(1)
    with client(sb) as c:
        open_ids, writers = [], []
        for _ in range(2):
            lid, w = write_ledger(c, ENTRIES, close=False)
            open_ids.append(lid)
            writers.append(w)
        # a bookie of both open ledgers (two E3 ensembles of five bookies always share one): each must
        # then be fenced and closed by the worker (an open ledger not on the victim stays open)
        common = set(c.ledger_metadata(open_ids[0]).ensembles[0]) & set(c.ledger_metadata(open_ids[1]).ensembles[0])
        victim = sorted(common)[0]
        closed_ids: list[int] = []
        # closed ledgers, until at least four of them are on the victim: each E3 ensemble of five bookies
        # names it with p = 0.6, so 15 tries missed four about once in 500 runs (seen), 40 once in 10^11
        for _ in range(40):
            closed_ids.append(write_ledger(c, ENTRIES, close=True)[0])
            if sum(1 for lid in closed_ids if victim in c.ledger_metadata(lid).bookies()) >= 4:
                break
        on_victim = ledgers_naming(sb.store, victim)
        assert set(open_ids) <= set(on_victim) and len(on_victim) >= 6

        bookie_of(sb, victim).kill()
        took = wait_fully_repaired(sb.store, victim, timeout_s=120)
        print(f"\n{len(on_victim)} ledgers repaired {took:.1f}s after the kill")

        assert not bookie_of(sb, victim).alive
        for lid in open_ids + closed_ids:
            assert_every_replica_has_every_entry(c, lid, ENTRIES)
            r = c.open_ledger(lid, b"", recovery=False)
            assert [e.data for e in r.read(0, ENTRIES - 1)] == [data(lid, i, 200) for i in range(ENTRIES)]
        # The worker fenced and closed the open ledger on the victim: its writer can no longer add.
        assert c.ledger_metadata(open_ids[0]).state is LedgerState.CLOSED
        with pytest.raises(errors.LedgerFencedError):
            writers[0].append(b"after the repair")
        assert c.ledger_metadata(open_ids[0]).last_entry_id == ENTRIES - 1


def test_deleted_ledger_is_dropped_from_the_queue(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(4, autorecovery_enabled=True, autorecovery_conf=str(conf))
    with client(sb) as c:
        keep = write_ledger(c, 20, close=True)[0]
        gone = write_ledger(c, 20, close=True)[0]
        victim = c.ledger_metadata(gone).ensembles[0][0]
        sb.store.underreplication.set_replication_enabled(False)        # queue them while no worker may take them
        sb.store.underreplication.mark_underreplicated(gone, [victim])
        # names nobody in the ledger: nothing to do
        sb.store.underreplication.mark_underreplicated(keep, ["127.0.0.1:1"])
        c.delete_ledger(gone)
        sb.store.underreplication.set_replication_enabled(True)
        wait_until(lambda: not sb.store.underreplication.list_underreplicated(), 30, "the queue to empty")
        assert c.ledger_metadata(keep).is_closed and gone not in set(c.list_ledgers())


def test_writer_keeps_writing_while_its_older_fragments_are_rereplicated(cluster_factory, tmp_path, seed):
    """Writer ensemble changes and worker swaps on one open ledger, concurrently, through the CAS loop."""
    rng = random.Random(seed)
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(6, autorecovery_enabled=True, autorecovery_conf=str(conf))
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(0)
    with client(sb) as c:
        w = c.create_ledger(3, 2, 2)
        acked: list[int] = []
        stop = threading.Event()

        def write() -> None:
            i = 0
            while not stop.is_set():
                futs = [w.append_async(data(w.ledger_id, i + k, 200)) for k in range(20)]
                acked.extend(f.result(60) for f in futs)
                i += 20
                time.sleep(0.02)

        t = threading.Thread(target=write)
        t.start()
        try:
            wait_until(lambda: len(acked) >= 200, 60, "the first entries")
            first = c.ledger_metadata(w.ledger_id).ensembles[0][rng.randrange(3)]
            bookie_of(sb, first).kill()
            wait_fully_repaired(sb.store, first, timeout_s=90)
            current = c.ledger_metadata(w.ledger_id)   # each entry still has a live copy: lose another
            second = current.ensembles[max(current.ensembles)][rng.randrange(3)]
            bookie_of(sb, second).kill()
            wait_fully_repaired(sb.store, second, timeout_s=90)
        finally:
            stop.set()
            t.join(120)
        w.close()
        n = len(acked)
        assert acked == list(range(n)) and n > 200
        md = c.ledger_metadata(w.ledger_id)
        assert md.last_entry_id == n - 1 and not md.bookies() & {first, second}
        assert len(md.ensembles) >= 3   # the writer changed its ensemble twice; the worker kept every change
        assert_every_replica_has_every_entry(c, w.ledger_id, n)
