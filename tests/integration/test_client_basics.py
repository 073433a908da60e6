"""The replicated ledger end to end: real ZooKeeper, real bookie processes, the public client API."""

from __future__ import annotations

import threading
from functools import partial

import pytest
from bookie_helpers import module_cluster
from client_helpers import client, data

from ledger_client import DigestType, LedgerEntry, LedgerState, errors
from ledger_client.machines import write_set
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.transport import BookieClient

pytestmark = pytest.mark.integration

sb = module_cluster(3, "Three bookies for the module: each test writes ledgers of its own and none stops a "
                       "bookie (the striping test starts four bookies of its own).")


def test_write_read_close_reopen(sb):
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2, DigestType.CRC32C, b"pw", {"app": b"test"})
        ids = [w.append(data(w.ledger_id, i)) for i in range(50)]
        assert ids == list(range(50))
        assert w.last_add_confirmed == 49 and w.length == 50 * 64
        w.close()
        w.close()  # double close is fine
        with pytest.raises(errors.LedgerClosedError):
            w.append(b"late")
        md = c.ledger_metadata(w.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 49 and md.length == 50 * 64
        assert md.custom_metadata == {"app": b"test"} and md.digest_type is DigestType.CRC32C
        assert list(md.ensembles) == [0] and len(md.ensembles[0]) == 3
        r = c.open_ledger(w.ledger_id, b"pw")
        assert r.is_closed and r.last_add_confirmed == 49
        got = r.read(0, 49)
        assert got == [LedgerEntry(w.ledger_id, i, data(w.ledger_id, i)) for i in range(50)]
        assert w.ledger_id in list(c.list_ledgers())
        c.delete_ledger(w.ledger_id)
        c.delete_ledger(w.ledger_id)  # idempotent
        with pytest.raises(errors.NoSuchLedgerError):
            c.open_ledger(w.ledger_id, b"pw")


@pytest.mark.parametrize("digest", list(DigestType))
def test_every_digest_type_round_trips(sb, digest):
    with client(sb) as c, c.create_ledger(3, 2, 2, digest, b"secret") as w:
        for i in range(20):
            w.append(data(1, i, 300))
        r = c.open_ledger(w.ledger_id, b"secret", recovery=False)
        assert [e.data for e in r.read(0, r.read_last_add_confirmed())] == [data(1, i, 300) for i in range(19)]


def test_parameter_validation_and_bad_input(sb):
    with client(sb) as c:
        for bad in [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)]:
            with pytest.raises(errors.IncorrectParameterError):
                c.create_ledger(*bad)
        with pytest.raises(errors.IncorrectParameterError):
            c.create_ledger(3, 3, 2, digest_type="CRC32C")
        with pytest.raises(errors.IncorrectParameterError):
            c.create_ledger(3, 3, 2, password="text, not bytes")
        with pytest.raises(errors.NotEnoughBookiesError):
            c.create_ledger(5, 3, 2)
        with pytest.raises(errors.NoSuchLedgerError):
            c.open_ledger(123456789)
        with pytest.raises(errors.IncorrectParameterError):
            c.ledger_metadata(-1)
        w = c.create_ledger(3, 3, 2, password=b"right")
        with pytest.raises(errors.IncorrectParameterError):
            w.append("not bytes")
        with pytest.raises(errors.IncorrectParameterError):
            w.append(b"x" * (c.config.entry_size_bytes_max + 1))
        w.append(b"ok")
        with pytest.raises(errors.UnauthorizedAccessError):
            c.open_ledger(w.ledger_id, b"wrong")
        r = c.open_ledger(w.ledger_id, b"right", recovery=False)
        with pytest.raises(errors.IncorrectParameterError):
            r.read(2, 1)
        with pytest.raises(errors.IncorrectParameterError):
            r.read(0, 5)  # past the LAC
        w.append(b"still writable: the bad calls changed nothing")


def test_striping_puts_each_entry_on_its_write_set(cluster_factory):
    sb = cluster_factory(4)
    with client(sb) as c:
        w = c.create_ledger(4, 2, 2, password=b"p")
        for i in range(40):
            w.append(data(w.ledger_id, i))
        w.close()
        ensemble = c.ledger_metadata(w.ledger_id).ensembles[0]
        from ledger_client.protocol.framing import master_key  # noqa: F401  (same key derivation)

        for idx, bookie in enumerate(ensemble):
            with BookieClient(bookie) as bc:
                for e in range(40):
                    has = bc.read(w.ledger_id, e).status == pb.EOK
                    assert has == (idx in write_set(e, 4, 2)), (bookie, e)
        r = c.open_ledger(w.ledger_id, b"p")
        assert [x.data for x in r.read(0, 39)] == [data(w.ledger_id, i) for i in range(40)]


def test_ten_thousand_async_appends_complete_in_order(sb):
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        order: list[int] = []
        lock = threading.Lock()
        futs = []
        for i in range(10_000):
            f = w.append_async(data(w.ledger_id, i, 100))
            f.add_done_callback(lambda f: (lock.acquire(), order.append(f.result()), lock.release()))
            futs.append(f)
        assert [f.result(timeout=60) for f in futs] == list(range(10_000))
        assert order == list(range(10_000))
        w.close()
        r = c.open_ledger(w.ledger_id, b"")
        assert r.last_add_confirmed == 9_999
        assert [e.data for e in r.read(9_990, 9_999)] == [data(w.ledger_id, i, 100) for i in range(9_990, 10_000)]


def test_appends_from_several_threads_at_once_all_land_under_their_ids(sb):
    """A handle is shared by threads: each add is sent after the writer's lock is released, so two
    threads' adds may reach a bookie in either order; every entry must still be stored under the
    id its future returned, and complete in id order."""
    threads_n, per_thread = 4, 500
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2)
        written: dict[int, bytes] = {}
        completed: list[int] = []   # in the order the client completed them
        late: list[int] = []        # done before their callback was attached: it ran on the attaching thread
        lock = threading.Lock()

        def done(me: threading.Thread, f) -> None:
            with lock:
                (late if threading.current_thread() is me else completed).append(f.result())

        def writer(t: int) -> None:
            futs = []
            me = threading.current_thread()
            for i in range(per_thread):
                payload = f"thread {t} entry {i}".encode()
                f = w.append_async(payload)
                f.add_done_callback(partial(done, me))
                futs.append((f, payload))
            for f, payload in futs:
                eid = f.result(timeout=60)
                with lock:
                    written[eid] = payload

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(120)
        total = threads_n * per_thread
        assert sorted(written) == list(range(total))
        assert completed == sorted(completed) and sorted(completed + late) == list(range(total))
        w.close()
        r = c.open_ledger(w.ledger_id, b"")
        assert r.last_add_confirmed == total - 1
        assert {e.entry_id: e.data for e in r.read(0, total - 1)} == written


def _written(writer_client, reader_client, entries: int):
    """A ledger with ``entries`` entries, and another client's handle on it, opened without recovery."""
    w = writer_client.create_ledger(3, 3, 2)
    for i in range(entries):
        w.append(data(w.ledger_id, i))
    return w, reader_client.open_ledger(w.ledger_id, b"", recovery=False)


def test_reader_lac_lags_by_one_and_explicit_lac_closes_the_gap(sb):
    with client(sb) as writer_client, client(sb) as reader_client:
        w, r = _written(writer_client, reader_client, 10)
        # Entry 9 carries LAC 8: a reader learns about an entry only from the next one.
        assert r.read_last_add_confirmed() == 8
        assert r.try_read_last_add_confirmed() <= 8
        assert [e.entry_id for e in r.read(0, 8)] == list(range(9))
        with pytest.raises(errors.IncorrectParameterError):
            r.read(9, 9)
        assert r.read_unconfirmed(9, 9)[0].data == data(w.ledger_id, 9)
        with pytest.raises(errors.NoSuchEntryError):
            r.read_unconfirmed(10, 10)
        assert not r.is_closed
    with client(sb, explicit_lac_interval_ms=100) as writer_client, client(sb) as reader_client:
        w, r = _written(writer_client, reader_client, 10)
        from bookie_helpers import wait_until

        wait_until(lambda: r.read_last_add_confirmed() == 9, what="explicit LAC 9 to reach the reader")
        assert r.read(9, 9)[0].data == data(w.ledger_id, 9)


def test_an_announced_lac_wakes_a_long_poll_and_adds_no_entry(sb):
    """What an idle stream writer sends instead of a control record: the LAC on the add
    connections, which another client's long poll and LAC read see at once."""
    with client(sb) as wc, client(sb) as rc:
        w, r = _written(wc, rc, 5)
        assert r.read_last_add_confirmed() == 3
        got: list[list[int]] = []
        poll = threading.Thread(target=lambda: got.append([e.entry_id for e in r.poll_entries(4, 9, 20_000)]))
        poll.start()
        w.send_explicit_lac(journaled=False)
        poll.join(10)   # without the announcement the poll would wait out its 20 s
        assert got == [[4]]
        assert rc.open_ledger(w.ledger_id, b"", recovery=False).read_last_add_confirmed() == 4
        with pytest.raises(errors.NoSuchEntryError):   # no control entry was written
            r.read_unconfirmed(5, 5)


def test_tail_follows_a_ledger_being_written(sb):
    with client(sb) as wc, client(sb) as rc:
        w = wc.create_ledger(3, 3, 2)
        seen: list[int] = []

        def follow():
            r = rc.open_ledger(w.ledger_id, b"", recovery=False)
            for entry in r.tail(0, timeout_ms=20_000):
                assert entry.data == data(w.ledger_id, entry.entry_id)
                seen.append(entry.entry_id)

        t = threading.Thread(target=follow)
        t.start()
        for i in range(200):
            w.append(data(w.ledger_id, i))
        w.close()
        t.join(timeout=60)
        assert not t.is_alive()
        assert seen == list(range(200))


def test_read_last_add_confirmed_and_entry_long_polls(sb):
    with client(sb) as wc, client(sb) as rc:
        w = wc.create_ledger(3, 3, 2)
        w.append(b"zero")
        w.append(b"one")
        r = rc.open_ledger(w.ledger_id, b"", recovery=False)
        assert r.last_add_confirmed == 0
        lac, entry = r.read_last_add_confirmed_and_entry(2, 200)
        assert entry is None and lac == 0  # nothing new: times out
        got = {}
        t = threading.Thread(target=lambda: got.update(r=r.read_last_add_confirmed_and_entry(1, 10_000)))
        t.start()
        w.append(b"two")  # carries LAC 1
        t.join(timeout=30)
        lac, entry = got["r"]
        assert lac >= 1 and entry is not None and entry.data == b"one"
