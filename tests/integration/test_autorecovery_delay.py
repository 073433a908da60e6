"""The lost-bookie delay with real bookie processes: a read-only bookie is not lost, nothing is
marked before the delay unless a second bookie dies, and the delay can be changed at run time."""

from __future__ import annotations

import shutil
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
from client_helpers import bookie_of, client

pytestmark = pytest.mark.integration

ENTRIES = 30
#: A killed bookie's registration lasts its ZooKeeper session (4 s here) plus up to a tick or two.
SESSION_GONE_S = 8


def test_read_only_bookie_is_not_treated_as_lost(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(4, autorecovery_enabled=True, autorecovery_conf=str(conf))
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(5)   # covers the restart below, not the wait after it
    with client(sb) as c:
        lids = [write_ledger(c, ENTRIES, close=True)[0] for _ in range(3)]
        b = bookie_of(sb, c.ledger_metadata(lids[0]).ensembles[0][0])
        named_before = ledgers_naming(sb.store, b.bookie_id)
        usage = shutil.disk_usage(b.root)
        used = (usage.total - usage.free) / usage.total
        b.stop()
        b.settings.update(disk_usage_threshold=used / 2, disk_usage_lwm=used / 4)   # full at once: read-only
        sb.restart(b)
        wait_until(lambda: b.bookie_id in sb.store.cluster.list_bookies(readonly=True)
                   and b.bookie_id not in sb.store.cluster.list_bookies(), 30, "read-only registration only")
        time.sleep(7)   # past the delay counted from the restart's gap
        assert sb.store.underreplication.list_underreplicated() == {}
        assert ledgers_naming(sb.store, b.bookie_id) == named_before
        r = c.open_ledger(lids[0], b"", recovery=False)   # and it still serves its data
        assert len(r.read(0, ENTRIES - 1)) == ENTRIES


def test_nothing_is_marked_before_the_delay_unless_a_second_bookie_dies(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(5, autorecovery_enabled=True, autorecovery_conf=str(conf))
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(600)
    with client(sb) as c:
        # Qw 3: every entry is on three bookies, so it survives losing two.
        lids = [write_ledger(c, ENTRIES, close=True, qw=3)[0] for _ in range(4)]
        first = c.ledger_metadata(lids[0]).ensembles[0][0]
        second = c.ledger_metadata(lids[0]).ensembles[0][1]
        bookie_of(sb, first).kill()
        wait_until(lambda: first not in sb.store.cluster.list_bookies(), 30,
                   "the killed bookie's registration to expire")
        time.sleep(SESSION_GONE_S - 4)
        assert sb.store.underreplication.list_underreplicated() == {} and ledgers_naming(sb.store, first)
        bookie_of(sb, second).kill()
        wait_fully_repaired(sb.store, first, timeout_s=90)
        wait_fully_repaired(sb.store, second, timeout_s=60)
        for lid in lids:
            assert_every_replica_has_every_entry(c, lid, ENTRIES)


def test_delay_changed_at_run_time_takes_effect(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(4, autorecovery_enabled=True, autorecovery_conf=str(conf))
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(600)
    with client(sb) as c:
        lids = [write_ledger(c, ENTRIES, close=True)[0] for _ in range(3)]
        victim = c.ledger_metadata(lids[0]).ensembles[0][2]
        bookie_of(sb, victim).kill()
        wait_until(lambda: victim not in sb.store.cluster.list_bookies(), 30,
                   "the killed bookie's registration to expire")
        time.sleep(3)
        assert sb.store.underreplication.list_underreplicated() == {}
        sb.store.underreplication.set_lost_bookie_recovery_delay_s(0)
        wait_fully_repaired(sb.store, victim, timeout_s=60)
        for lid in lids:
            assert_every_replica_has_every_entry(c, lid, ENTRIES)
