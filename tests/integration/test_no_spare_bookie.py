"""A writer that loses a bookie with no spare to replace it, and one that cannot reach a bookie.

Real bookie processes (SIGKILLed, or SIGSTOPped: alive but answering nothing) on a real
ZooKeeper, each running an auditor candidate and a replication worker beside it. One cluster for
the module, three bookies (every ensemble of three is the whole cluster: no spare) until the last
test, which adds a fourth. Every test leaves the bookies it stopped running again.

- E3/Qw3/Qa2, one bookie killed: every append still succeeds on the two others (delayed ensemble
  change); the bookie comes back with its id and disk, the writer takes it back, and the
  replication worker copies back what it missed: every entry is then on every bookie of its
  write set (read from each one);
- two bookies killed (fewer than Qa live): an append waits for a bookie to come back within the
  operation timeout, and fails with NotEnoughBookiesError after it, the ledger closed at its LAC;
- a bookie that stops answering while entries complete without it (Qw3/Qa2) is replaced after
  add_timeout_ms, and what it never acknowledged is re-replicated;
- a bookie that lacks entries in the middle of its share, which no writer marked, is found by the
  auditor's replicas check and gets exactly those entries back.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator

import pytest
from autorecovery_helpers import assert_every_replica_has_every_entry, ledger_with_gap, write_autorecovery_conf
from bookie_helpers import wait_until
from client_helpers import bookie_of, client, data

from ledger_client import LedgerClient, errors
from spark_bookie.local.sandbox import Sandbox

pytestmark = pytest.mark.integration

SIZE = 200   # assert_every_replica_has_every_entry's payload size


@pytest.fixture(scope="module")
def sb(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    import uuid

    root = tmp_path_factory.mktemp("no-spare")
    conf = write_autorecovery_conf(root / "autorecovery.toml", replicas_check_interval_ms=1000)
    cluster = Sandbox(root / "cluster", 3, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                      bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000,
                                       "autorecovery_enabled": True, "autorecovery_conf": str(conf)})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _heal(sb: Sandbox) -> None:
    """Start every bookie that is down again (same id, same disk) and wait for its registration."""
    for b in sb.bookies:
        if not b.alive:
            sb.restart(b)


def _replicated(c: LedgerClient, ledger_id: int, entries: int) -> bool:
    try:
        assert_every_replica_has_every_entry(c, ledger_id, entries, SIZE)
    except (AssertionError, errors.LedgerError):
        return False
    return True


def _append(w, i: int) -> int:  # type: ignore[no-untyped-def]
    return w.append(data(w.ledger_id, i, SIZE))


def test_writer_goes_on_without_a_spare_and_the_bookie_back_gets_every_entry(sb: Sandbox) -> None:
    try:
        with client(sb) as c:
            w = c.create_ledger(3, 3, 2)
            lid = w.ledger_id
            for i in range(50):
                _append(w, i)
            victim = bookie_of(sb, w.metadata.ensembles[0][1])
            victim.kill()
            # No spare: the writer keeps the dead bookie in its ensemble and goes on with the other two.
            assert [_append(w, i) for i in range(50, 200)] == list(range(50, 200))
            assert list(c.ledger_metadata(lid).ensembles) == [0]
            sb.restart(victim)   # the same id and disk, back after its old session expired
            wait_until(lambda: len(c.ledger_metadata(lid).ensembles) == 2, 60, "the writer to take the bookie back")
            md = c.ledger_metadata(lid)
            assert md.ensembles[max(md.ensembles)] == md.ensembles[0]   # a new fragment, the same bookies
            assert [_append(w, i) for i in range(200, 300)] == list(range(200, 300))
            w.close()
            # The writer marked the ledger under-replicated for what the bookie missed (entries
            # 50.. of the first fragment); the worker copied it back: every copy is there.
            wait_until(lambda: _replicated(c, lid, 300), 120, "every entry on every bookie of its write set")
            wait_until(lambda: lid not in sb.store.underreplication.list_underreplicated(), 60, "the mark to clear")  # type: ignore[union-attr]
            r = c.open_ledger(lid, b"")
            assert [e.data for e in r.read(0, 299)] == [data(lid, i, SIZE) for i in range(300)]
    finally:
        _heal(sb)


def test_a_bookie_lacking_the_middle_of_its_share_gets_just_that_back_in_place(sb: Sandbox) -> None:
    """Both ends of its share held, entries 40..59 not (adds a writer's connection to it lost
    while the writer went on, and the writer died before it marked the ledger): the auditor's
    replicas check (every second here) asks each bookie which entries of its share it holds and
    marks the ledger; with no spare bookie the worker copies back the twenty it lacks. Reading
    first and last entries, as the periodic check and the worker did before, finds nothing."""
    with client(sb) as c:
        lid, victim = ledger_with_gap(c, range(40, 60), size=SIZE)
        assert not _replicated(c, lid, 100)
        wait_until(lambda: _replicated(c, lid, 100), 120, "entries 40..59 back on the bookie that lacked them")
        wait_until(lambda: lid not in sb.store.underreplication.list_underreplicated(), 60, "the mark to clear")  # type: ignore[union-attr]
        said = (f"ledger {lid} fragment 0: no spare bookie for ['{victim}'], which is back: "
                "20 entries copied back in place")
        logs = "".join(b.log_path.read_text(errors="replace") for b in sb.bookies)
        assert f"ledger {lid}: bookie {victim} lacks 20 entries of fragment 0 (40..59 among them)" in logs
        assert said in logs   # what it lacked, not its whole share


def test_a_write_short_of_qa_waits_for_a_bookie_to_come_back(sb: Sandbox) -> None:
    try:
        with client(sb, operation_timeout_ms=90_000) as c:
            w = c.create_ledger(3, 3, 2)
            lid = w.ledger_id
            for i in range(10):
                _append(w, i)
            first, second = (bookie_of(sb, b) for b in w.metadata.ensembles[0][1:])
            first.kill()
            second.kill()
            fut = w.append_async(data(lid, 10, SIZE))
            with pytest.raises(concurrent.futures.TimeoutError):
                fut.result(timeout=3)   # one live bookie is not Qa: nothing acknowledged, no error either
            sb.restart(second)
            assert fut.result(timeout=60) == 10   # taken back: the entry reaches Qa
            assert [_append(w, i) for i in range(11, 30)] == list(range(11, 30))
            w.close()
            assert c.ledger_metadata(lid).last_entry_id == 29
            r = c.open_ledger(lid, b"")
            assert [e.data for e in r.read(0, 29)] == [data(lid, i, SIZE) for i in range(30)]
    finally:
        _heal(sb)


def test_a_write_short_of_qa_fails_after_the_operation_timeout(sb: Sandbox) -> None:
    try:
        with client(sb, operation_timeout_ms=4_000) as c:
            w = c.create_ledger(3, 3, 2)
            lid = w.ledger_id
            for i in range(10):
                _append(w, i)
            for b in w.metadata.ensembles[0][1:]:
                bookie_of(sb, b).kill()
            t0 = time.monotonic()
            with pytest.raises(errors.NotEnoughBookiesError):
                _append(w, 10)
            waited = time.monotonic() - t0
            assert 3.5 <= waited < 30, waited   # the operation timeout, not at once and not forever
            with pytest.raises(errors.NotEnoughBookiesError):
                _append(w, 11)
            md = c.ledger_metadata(lid)
            assert md.is_closed and md.last_entry_id == 9   # closed at the LAC: nothing beyond was acknowledged
            r = c.open_ledger(lid, b"")
            assert [e.data for e in r.read(0, 9)] == [data(lid, i, SIZE) for i in range(10)]
    finally:
        _heal(sb)


def test_a_bookie_that_stops_answering_is_replaced_though_entries_complete_without_it(sb: Sandbox) -> None:
    """Qw3/Qa2: every entry completes on the other two, so no pending entry ever times out; the
    add timeout must still see the silent bookie (it owes acks of completed entries)."""
    sb.add_bookie()   # a spare, from here on
    with client(sb, add_timeout_ms=2_000) as c:
        w = c.create_ledger(3, 3, 2)
        lid = w.ledger_id
        for i in range(50):
            _append(w, i)
        victim = bookie_of(sb, w.metadata.ensembles[0][2])
        assert victim.proc is not None
        os.killpg(victim.proc.pid, signal.SIGSTOP)   # alive, its connections open, answering nothing
        try:
            i, deadline = 50, time.monotonic() + 20
            while victim.bookie_id in w.metadata.ensembles[max(w.metadata.ensembles)] and time.monotonic() < deadline:
                assert _append(w, i) == i
                i += 1
            md = c.ledger_metadata(lid)
            assert victim.bookie_id not in md.ensembles[max(md.ensembles)], "the silent bookie was never replaced"
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)
        end = i + 50
        while i < end:
            assert _append(w, i) == i
            i += 1
        w.close()
        # The fragment it was part of lacks what it never acknowledged: marked, re-replicated.
        wait_until(lambda: _replicated(c, lid, end), 120, "every entry on every bookie of its write set")
