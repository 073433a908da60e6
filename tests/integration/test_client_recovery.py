"""Fencing and ledger recovery against real bookies, including the TLA+ races (bookkeeper#2614)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from bookie_helpers import module_cluster, wait_until
from client_helpers import bookie_of, client, data

from ledger_client import LedgerState, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType, master_key
from ledger_client.transport import BookieClient
from metadata import transitions

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the tests that stop none (each recovers ledgers of its own); "
                       "a test that kills or restarts a bookie starts bookies of its own.")


def test_writer_is_fenced_by_recovery_open_only(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as wc, client(sb) as rc:
        w = wc.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            w.append(data(w.ledger_id, i))
        rc.open_ledger(w.ledger_id, b"pw", recovery=False)   # a plain open does not fence
        w.append(data(w.ledger_id, 10))
        with pytest.raises(errors.UnauthorizedAccessError):
            rc.open_ledger(w.ledger_id, b"wrong", recovery=True)   # nor a wrong password
        w.append(data(w.ledger_id, 11))
        r = rc.open_ledger(w.ledger_id, b"pw", recovery=True)
        assert r.is_closed and r.last_add_confirmed == 11
        with pytest.raises(errors.LedgerFencedError):
            w.append(data(w.ledger_id, 12))
        assert [e.data for e in r.read(0, 11)] == [data(w.ledger_id, i) for i in range(12)]
        # The fence survives a bookie restart: the old writer still cannot add on it.
        b = sb.bookies[0]
        b.kill()
        sb.restart(b)
        body = Digester(DigestType.CRC32C, b"pw").frame(w.ledger_id, 12, 11, 0, b"x")
        with BookieClient(b.bookie_id) as bc:
            assert bc.add(w.ledger_id, 12, master_key(b"pw"), body).result(10).status == pb.EFENCED


def test_parallel_recovery_opens_agree(sb):
    with client(sb) as wc:
        w = wc.create_ledger(3, 3, 2)
        futs = [w.append_async(data(w.ledger_id, i)) for i in range(300)]
        acked = [f.result(30) for f in futs[:100]]
        clients = [client(sb) for _ in range(3)]
        try:
            with ThreadPoolExecutor(3) as ex:
                handles = list(ex.map(lambda c: c.open_ledger(w.ledger_id, b""), clients))
            ends = {h.last_add_confirmed for h in handles}
            assert len(ends) == 1, ends
            end = ends.pop()
            assert end >= max(acked)
            assert all(f.result(30) <= end for f in futs if f.done() and not f.exception())
            assert wc.ledger_metadata(w.ledger_id).last_entry_id == end
        finally:
            for c in clients:
                c.close()


def test_tail_on_one_bookie_only_is_recovered_and_rereplicated(sb):
    """With Qa = 1 an entry on a single bookie may have been acknowledged: recovery must keep it
    (no write set can show Qw - Qa + 1 = 3 "no such entry" answers) and copy it to all three."""
    with client(sb) as c:
        lid, ensemble = _writer_crashed_leaving(c, 1, {10: [0]})   # entry 10 reached one bookie only
        with client(sb) as rc:
            r = rc.open_ledger(lid, b"pw")
            assert r.last_add_confirmed == 10 and r.length == 11 * 64
            assert r.read(10, 10)[0].data == data(lid, 10)
        for b in ensemble:  # recovery rewrote it to the whole write set
            with BookieClient(b) as bc:
                assert bc.read(lid, 10).status == pb.EOK, b


def _writer_crashed_leaving(c, ack_quorum: int, tail: dict[int, list[int]]) -> tuple[int, list[str]]:
    """A ledger E3/Qw3 with entries 0-9 acknowledged, then what a writer that crashed left behind:
    entry id -> the positions in the ensemble that got it, each framed with LAC 9 (the writer's
    when it sent them). Returns (ledger id, ensemble)."""
    w = c.create_ledger(3, 3, ack_quorum, password=b"pw")
    for i in range(10):
        w.append(data(w.ledger_id, i))
    ensemble = c.ledger_metadata(w.ledger_id).ensembles[0]
    digester = Digester(DigestType.CRC32C, b"pw")
    for e, positions in tail.items():
        body = digester.frame(w.ledger_id, e, 9, (e + 1) * 64, data(w.ledger_id, e))
        for i in positions:
            with BookieClient(ensemble[i]) as bc:
                assert bc.add(w.ledger_id, e, master_key(b"pw"), body).result(10).status == pb.EOK
    return w.ledger_id, ensemble


@pytest.mark.parametrize("window", [1, 3, 64])
def test_recovery_reads_ahead_but_ends_at_the_first_missing_entry(sb, window):
    """A recovery open reads `recovery_read_window_entries` entries ahead. The writer "crashed"
    leaving entries 10 and 11 on every bookie unconfirmed, 12 nowhere and 13 everywhere (sent
    after 12, which never arrived): 13 is read ahead and found, yet the ledger must end at 11, as
    reading one entry at a time decides, and 13 must not become part of the ledger."""
    with client(sb) as c:
        everywhere = [0, 1, 2]
        lid, _ = _writer_crashed_leaving(c, 2, {10: everywhere, 11: everywhere, 13: everywhere})
        with client(sb, recovery_read_window_entries=window) as rc:
            r = rc.open_ledger(lid, b"pw")
            assert r.last_add_confirmed == 11 and r.length == 12 * 64
            assert [e.data for e in r.read(0, 11)] == [data(lid, i) for i in range(12)]
            with pytest.raises(errors.IncorrectParameterError):   # past the end of the closed ledger
                r.read(13, 13)
            assert rc.ledger_metadata(lid).last_entry_id == 11


def test_recovery_with_a_dead_bookie_and_a_spare(cluster_factory):
    sb = cluster_factory(4)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        for i in range(20):
            w.append(data(w.ledger_id, i))
        # Entry 20 reaches one bookie, which then dies: recovery must not wait for it.
        ensemble = c.ledger_metadata(w.ledger_id).ensembles[0]
        bookie_of(sb, ensemble[2]).kill()
        with client(sb) as rc:
            r = rc.open_ledger(w.ledger_id, b"")
            assert r.is_closed and r.last_add_confirmed == 19
            assert [e.data for e in r.read(0, 19)] == [data(w.ledger_id, i) for i in range(20)]


def test_recovery_without_a_spare_waits_for_one_to_join(cluster_factory):
    sb = cluster_factory(3)
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            w.append(data(w.ledger_id, i))
        ensemble = c.ledger_metadata(w.ledger_id).ensembles[0]
        # Entry 5 reached two bookies, then one of the three died: recovery must rewrite entry 5
        # to a full write set, and with no spare bookie it cannot.
        body = Digester(DigestType.CRC32C, b"pw").frame(w.ledger_id, 5, 4, 6 * 64, data(w.ledger_id, 5))
        for b in ensemble[:2]:
            with BookieClient(b) as bc:
                assert bc.add(w.ledger_id, 5, master_key(b"pw"), body).result(10).status == pb.EOK
        bookie_of(sb, ensemble[2]).kill()
        with client(sb) as rc:
            with pytest.raises(errors.NotEnoughBookiesError):
                rc.open_ledger(w.ledger_id, b"pw")
            assert rc.ledger_metadata(w.ledger_id).state is LedgerState.IN_RECOVERY
            sb.add_bookie()
            r = rc.open_ledger(w.ledger_id, b"pw")
            assert r.last_add_confirmed == 5
            md = r.metadata
            assert max(md.ensembles) == 5 and ensemble[2] not in md.ensembles[5]
            assert [e.data for e in r.read(0, 5)] == [data(w.ledger_id, i) for i in range(6)]


def test_old_writer_cannot_commit_after_the_new_close(sb):
    """TLA+ race 1: entries in flight when recovery fences must not be acknowledged afterwards
    beyond the end recovery chose."""
    with client(sb) as wc, client(sb) as rc:
        w = wc.create_ledger(3, 3, 2)
        acked: list[int] = []
        stop = threading.Event()

        def write():
            i = 0
            while not stop.is_set():
                try:
                    acked.append(w.append(data(w.ledger_id, i)))
                except errors.LedgerError:
                    return
                i += 1

        t = threading.Thread(target=write)
        t.start()
        wait_until(lambda: len(acked) > 50, what="writes")
        r = rc.open_ledger(w.ledger_id, b"")
        stop.set()
        t.join(timeout=30)
        end = r.last_add_confirmed
        assert acked and max(acked) <= end, (max(acked), end)
        assert [e.entry_id for e in r.read(0, end)] == list(range(end + 1))


def test_recovery_never_creates_a_fragment_key_below_an_existing_one(cluster_factory):
    """TLA+ race 2: bookies' piggybacked LACs lag the fragment the writer just created."""
    sb = cluster_factory(5)
    with client(sb) as wc:
        w = wc.create_ledger(3, 3, 2)
        for i in range(10):
            w.append(data(w.ledger_id, i))
        first = wc.ledger_metadata(w.ledger_id).ensembles[0]
        bookie_of(sb, first[0]).kill()
        w.append(data(w.ledger_id, 10))  # forces an ensemble change
        # The new fragment starts at LAC + 1 when the failure is seen: 10, or 11 if entry 10's
        # Qa acks arrived first. Either way it is above what the bookies' piggybacked LACs say.
        wait_until(lambda: len(wc.ledger_metadata(w.ledger_id).ensembles) == 2, what="ensemble change")
        md = wc.ledger_metadata(w.ledger_id)
        key = sorted(md.ensembles)[1]
        assert key in (10, 11)
        # Now the new fragment loses a bookie too, before its LAC reaches anyone but the writer.
        new_only = [b for b in md.ensembles[key] if b not in first]
        bookie_of(sb, new_only[0]).kill()
        with client(sb) as rc:
            r = rc.open_ledger(w.ledger_id, b"")
            keys = sorted(r.metadata.ensembles)
            assert keys == sorted(set(keys)) and keys[:2] == [0, key] and all(k >= key for k in keys[1:])
            assert r.last_add_confirmed >= 10
            assert [e.data for e in r.read(0, 10)] == [data(w.ledger_id, i) for i in range(11)]


def test_recovery_close_rebases_over_rereplication_of_an_earlier_fragment(cluster_factory):
    """A replication worker swapping a bookie in an earlier fragment while a recovery open runs
    must not make the open fail (it changed nothing recovery decided about); the close keeps the
    worker's swap and the recovery's end."""
    sb = cluster_factory(5)
    with client(sb) as c:
        w = c.create_ledger(3, 2, 2)
        for i in range(10):
            w.append(data(w.ledger_id, i))
        first = c.ledger_metadata(w.ledger_id).ensembles[0]
        dead = first[0]
        bookie_of(sb, dead).kill()
        for i in range(10, 20):
            w.append(data(w.ledger_id, i))
        md = c.ledger_metadata(w.ledger_id)
        assert len(md.ensembles) == 2
        spare = next(b.bookie_id for b in sb.bookies
                     if b.bookie_id not in first and b.bookie_id not in md.ensembles[max(md.ensembles)])
        with client(sb) as rc:
            original = rc.replace_metadata
            raced: list[bool] = []

            def worker_wins_first(final, version):
                if not raced:  # the worker's CAS lands between recovery's begin and its close
                    raced.append(True)
                    rc.update_metadata(w.ledger_id, lambda m: transitions.replace_bookie(m, 0, dead, spare))
                return original(final, version)

            rc.replace_metadata = worker_wins_first  # type: ignore[method-assign]
            r = rc.open_ledger(w.ledger_id, b"")
            assert raced and r.is_closed and r.last_add_confirmed == 19
            closed = rc.ledger_metadata(w.ledger_id)
            assert closed.ensembles[0] == [spare if b == dead else b for b in first]
            assert closed.ensembles[max(closed.ensembles)] == md.ensembles[max(md.ensembles)]
            assert [e.data for e in r.read(0, 19)] == [data(w.ledger_id, i) for i in range(20)]
        with pytest.raises(errors.LedgerFencedError):
            w.append(b"after recovery")
