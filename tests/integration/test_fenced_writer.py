"""A writer that lost its ledger learns it was fenced, whatever happened to its connections
(BookKeeper's TestFencing.testFencingAndRestartBookies): that is how a write-ahead-log user learns
it lost leadership. And a broken connection to a bookie that is back is not a dead bookie."""

from __future__ import annotations

import pytest
from client_helpers import bookie_of, client, data

from ledger_client import LedgerState, errors

pytestmark = pytest.mark.integration


def _restart_all(sb) -> None:
    for b in sb.bookies:
        b.stop()
    for b in sb.bookies:
        sb.restart(b, wait=False)
    for b in sb.bookies:
        b.wait_registered(sb.store)


def test_fenced_writer_whose_bookies_restarted_is_told_fenced(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c1, client(sb) as c2:
        w = c1.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            w.append(data(w.ledger_id, i))
        r = c2.open_ledger(w.ledger_id, b"pw")           # recovery: fences and closes
        assert r.is_closed and r.last_add_confirmed == 4
        _restart_all(sb)
        with pytest.raises(errors.LedgerFencedError):
            w.append(data(w.ledger_id, 5))
        with pytest.raises(errors.LedgerFencedError):  # and stays so
            w.append(data(w.ledger_id, 6))
        md = c2.ledger_metadata(w.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 4
        assert [e.data for e in c2.open_ledger(w.ledger_id, b"pw").read(0, 4)] == \
            [data(w.ledger_id, i) for i in range(5)]


def test_fenced_writer_with_every_bookie_dead_is_told_fenced(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c1, client(sb) as c2:
        w = c1.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            w.append(data(w.ledger_id, i))
        c2.open_ledger(w.ledger_id, b"pw")
        for b in sb.bookies:
            b.kill()
        with pytest.raises(errors.LedgerFencedError):
            w.append(data(w.ledger_id, 5))


def test_writer_reconnects_to_restarted_bookies_and_carries_on(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            w.append(data(w.ledger_id, i))
        ensemble = list(c.ledger_metadata(w.ledger_id).ensembles[0])
        b = bookie_of(sb, ensemble[1])
        b.stop()
        sb.restart(b)
        # No spare bookie exists: only reconnecting to the restarted one lets the writer go on.
        for i in range(5, 25):
            assert w.append(data(w.ledger_id, i)) == i
        _restart_all(sb)
        for i in range(25, 40):
            assert w.append(data(w.ledger_id, i)) == i
        w.close()
        md = c.ledger_metadata(w.ledger_id)
        assert list(md.ensembles) == [0] and md.ensembles[0] == ensemble   # no ensemble change
        assert [e.data for e in c.open_ledger(w.ledger_id, b"pw").read(0, 39)] == \
            [data(w.ledger_id, i) for i in range(40)]
