"""Which entries of its share a bookie lacks, from listed reads of ids only and from an older
bookie that answers them as plain listed reads (bodies, cut by its byte limit): the worker's
FragmentChecker.lacking_entries and the auditor's replicas check (ListingWindow). The bookies
here are in-memory twins of ReadRangeRequest's two answers; the real ones are asked in
tests/integration/test_read_connection.py and test_no_spare_bookie.py."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import pytest

from ledger_client import errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester
from metadata import DigestType, LedgerMetadata, LedgerState
from recovery.checker import LIST_IDS_MAX, FragmentChecker
from recovery.replicas_check import ListingWindow

pytestmark = pytest.mark.unit

A, B, C = (f"10.0.0.{i}:3181" for i in range(1, 4))
LID = 7
DIGEST = Digester(DigestType.CRC32C, b"")


def _done(resp: object) -> Future[object]:
    f: Future[object] = Future()
    f.set_result(resp)
    return f


class TwinBookie:
    """Holds ``held`` of ledger LID; ``old``: answers ids_only as a plain listed read would, at
    most ``per_answer`` bodies at a time (its max_bytes); ``silent``: every read times out."""

    def __init__(self, held: set[int], *, old: bool = False, per_answer: int = 3, silent: bool = False,
                 corrupt: frozenset[int] = frozenset()) -> None:
        self.held, self.old, self.per_answer, self.silent, self.corrupt = held, old, per_answer, silent, corrupt
        self.asks = 0

    def _body(self, e: int) -> bytes:
        body = DIGEST.frame(LID, e, e - 1, (e + 1) * 10, b"x" * 10)
        return body[:-1] + bytes([body[-1] ^ 1]) if e in self.corrupt else body

    def held_entries_future(self, ledger_id: int, ids: list[int]) -> Future[object]:
        self.asks += 1
        if self.silent:
            f: Future[object] = Future()
            f.set_exception(TimeoutError("no answer"))
            return f
        found = [e for e in ids if e in self.held]
        if not self.old:
            return _done(pb.ReadRangeResponse(status=pb.EOK, ledger_id=ledger_id, entry_ids=found))
        if not found:
            return _done(pb.ReadRangeResponse(status=pb.ENOENTRY, ledger_id=ledger_id))
        cut = found[:self.per_answer]
        return _done(pb.ReadRangeResponse(status=pb.EOK, ledger_id=ledger_id, entry_ids=cut,
                                          bodies=[self._body(e) for e in cut]))

    def read_future(self, ledger_id: int, entry_id: int) -> Future[object]:
        if self.silent:
            raise errors.BookieUnavailableError("down")
        if entry_id not in self.held:
            return _done(pb.ReadResponse(status=pb.ENOENTRY, ledger_id=ledger_id, entry_id=entry_id))
        return _done(pb.ReadResponse(status=pb.EOK, ledger_id=ledger_id, entry_id=entry_id, body=self._body(entry_id)))


class TwinPool:
    def __init__(self, bookies: dict[str, TwinBookie]) -> None:
        self.bookies = bookies

    def get(self, bookie: str) -> TwinBookie:
        return self.bookies[bookie]


def _ledger(last: int, qw: int = 3, lid: int = LID) -> LedgerMetadata:
    md = LedgerMetadata.new_open(lid, [A, B, C], write_quorum_size=qw, ack_quorum_size=2,
                                 digest_type=DigestType.CRC32C, password=b"")
    return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=last, length=10 * (last + 1))


def _lacking(bookie: TwinBookie, md: LedgerMetadata, position: int = 1) -> list[int] | None:
    checker = FragmentChecker(TwinPool({B: bookie}), sample_fraction=0.0, reads_in_flight_max=2,  # type: ignore[arg-type]
                              timeout_s=1.0)
    return checker.lacking_entries(md, 0, md.last_entry_id, position, B)


@pytest.mark.parametrize("old", [False, True], ids=["ids_only", "older bookie"])
def test_a_gap_in_the_middle_is_found_as_well_as_one_at_the_end(old: bool) -> None:
    md = _ledger(99)
    assert _lacking(TwinBookie(set(range(100)) - set(range(40, 60)), old=old), md) == list(range(40, 60))
    assert _lacking(TwinBookie(set(range(90)), old=old), md) == list(range(90, 100))
    assert _lacking(TwinBookie(set(range(100)), old=old), md) == []
    assert _lacking(TwinBookie(set(), old=old), md) == list(range(100))


def test_only_the_positions_share_is_asked_in_requests_of_bounded_size() -> None:
    md = _ledger(2 * LIST_IDS_MAX + 10, qw=2)   # E3/Qw2: position 1 stores two entries of three
    share = [e for e in range(md.last_entry_id + 1) if (1 - e) % 3 < 2]
    twin = TwinBookie(set(share) - {share[5]})
    assert _lacking(twin, md) == [share[5]]
    assert twin.asks == -(-len(share) // LIST_IDS_MAX)


def test_no_answer_or_a_corrupt_end_tells_nothing() -> None:
    md = _ledger(99)
    assert _lacking(TwinBookie(set(range(100)), silent=True), md) is None
    assert _lacking(TwinBookie(set(range(100)), corrupt=frozenset({99})), md) is None
    assert _lacking(TwinBookie(set(range(100)), corrupt=frozenset({50})), md) == []   # only the ends are read


class LedgersTwin:
    """Bookies holding several ledgers: (bookie, ledger) -> held ids."""

    def __init__(self, held: dict[tuple[str, int], set[int]], old: frozenset[str] = frozenset(),
                 silent: frozenset[str] = frozenset()) -> None:
        self.held, self.old, self.silent = held, old, silent

    def get(self, bookie: str) -> TwinLedgerBookie:
        return TwinLedgerBookie(self, bookie)


class TwinLedgerBookie:
    def __init__(self, twin: LedgersTwin, bookie: str) -> None:
        self.twin, self.bookie = twin, bookie

    def held_entries_future(self, ledger_id: int, ids: list[int]) -> Future[object]:
        held = self.twin.held.get((self.bookie, ledger_id), set())
        one = TwinBookie(held, old=self.bookie in self.twin.old, silent=self.bookie in self.twin.silent)
        return one.held_entries_future(ledger_id, ids)


@pytest.mark.parametrize("window", [1, 2, 64])
def test_replicas_check_marks_each_bookie_lacking_entries_and_counts_ledgers_by_their_worst_entry(
        window: int) -> None:
    full = set(range(100))
    lids = [1, 2, 3, 4, 5]
    held = {(b, lid): set(full) for b in (A, B, C) for lid in lids}
    held[(B, 2)] -= set(range(40, 60))                       # one copy short: below Qw
    held[(A, 3)] -= {7}
    held[(B, 3)] -= {7}                                     # two short of entry 7: below Qa too
    for b in (A, B, C):
        held[(b, 4)] -= {99}                                # nobody has entry 99: no replica
    held[(C, 5)] = set()                                     # C holds nothing of ledger 5
    win = ListingWindow(LedgersTwin(held), window, timeout_s=1.0)  # type: ignore[arg-type]
    for lid in lids:
        win.add(_ledger(99, lid=lid), available={A, B, C})
    bad = win.drain()
    assert {lid: sorted(by) for lid, by in bad.items()} == {2: [B], 3: [A, B], 4: [A, B, C], 5: [C]}
    t = win.tally
    assert (t.ledgers_below_write_quorum, t.ledgers_below_ack_quorum, t.ledgers_no_replica) == (4, 2, 1)
    assert t.entries_lacking == 20 + 2 + 3 + 100 and t.requests == 15


def test_replicas_check_asks_only_available_bookies_and_a_silent_one_proves_nothing() -> None:
    held = {(b, LID): set(range(10)) for b in (A, B)}          # C lacks everything
    win = ListingWindow(LedgersTwin(held, silent=frozenset({B})), 4, timeout_s=1.0)  # type: ignore[arg-type]
    win.add(_ledger(9), available={A, B})
    assert win.drain() == {} and win.tally.requests == 2
    win.add(_ledger(9), available={A, B, C})
    assert win.drain() == {LID: {C: [0]}} and win.tally.ledgers_below_write_quorum == 1


def test_replicas_check_takes_an_older_bookies_answer_for_what_it_speaks_for() -> None:
    """A bookie that predates ids_only answers a plain listed read, cut after a few bodies: the
    entries past its last body are not known lacking (they wait for the bookie's upgrade)."""
    held = {(A, LID): set(range(100)) - {1, 50}, (B, LID): set(), (C, LID): set(range(100))}
    win = ListingWindow(LedgersTwin(held, old=frozenset({A, B})), 8, timeout_s=1.0)  # type: ignore[arg-type]
    win.add(_ledger(99), available={A, B, C})
    assert win.drain() == {LID: {A: [0], B: [0]}}
    assert win.tally.entries_lacking == 1 + 100   # A's 50 is past its answer's last body (3)
