"""FragmentChecker.lacking_entries: which entries of its share a bookie lacks, from listed reads of
ids only, and from an older bookie that answers them as plain listed reads (bodies, cut by its
byte limit). The bookie here is an in-memory twin of ReadRangeRequest's two answers; the real
one is asked in tests/integration/test_read_connection.py and test_no_spare_bookie.py."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import pytest

from ledger_client import errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester
from metadata import DigestType, LedgerMetadata, LedgerState
from recovery.checker import LIST_IDS_MAX, FragmentChecker

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


def _ledger(last: int, qw: int = 3) -> LedgerMetadata:
    md = LedgerMetadata.new_open(LID, [A, B, C], write_quorum_size=qw, ack_quorum_size=2,
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
