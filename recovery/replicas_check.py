"""The auditor's replicas check (BookKeeper's auditorReplicasCheckInterval): does every bookie of
every finished fragment hold *every* entry of its share?

The periodic check of :mod:`recovery.checker` reads a bookie's first and last entry of each
fragment (plus a sampled fraction): a bookie that missed adds in the middle of a fragment (a
connection lost and found again under a writer that then died before marking, or a disk that
lost a stretch of an entry log's index) holds both ends and passes it. Here each bookie is asked,
by listed reads of ids only (``ReadRangeRequest.ids_only``, BookKeeper's GetListOfEntriesOfLedger;
no entry is read), which entries of its share it holds; one that lacks any is marked missing for
that ledger, and a replication worker moves the fragment to a spare bookie or, with none, copies
back exactly what it lacks. Digests are the read check's business, not this one's.

As in BookKeeper, the check also counts the ledgers whose worst entry has fewer copies than the
write quorum, than the ack quorum, or none at all (among the bookies that answered: one that does
not answer is not counted as lacking anything; whether it is lost is the lost-bookie delay's call).
A bookie that predates ids_only answers a plain listed read, cut by its byte limit: only the
entries up to its last body are judged there, the rest once it is upgraded.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from ledger_client import errors
from ledger_client.bookies import BookiePool
from metadata import LedgerMetadata

from .checker import LIST_IDS_MAX, NO_ANSWER, held_answer
from .plan import checkable_fragments, positions_entries

log = logging.getLogger(__name__)


class _Listing(NamedTuple):
    ledger_id: int
    bookie: str
    fragment: int        # first entry id of the fragment
    ids: list[int]       # the entries of the bookie's share asked about
    future: Any          # None when the request could not even be sent


@dataclass
class ReplicasTally:
    """One replicas check's findings (BookKeeper's three ledger counts, and what was asked)."""

    requests: int = 0
    entries_lacking: int = 0            # (entry, bookie) pairs a bookie should hold and does not
    ledgers_no_replica: int = 0         # an entry that no answering bookie of its write set holds
    ledgers_below_ack_quorum: int = 0   # an entry with fewer copies than Qa (none counted here too)
    ledgers_below_write_quorum: int = 0  # an entry with fewer copies than Qw (all of the above too)


class ListingWindow:
    """Listed reads of ids only over many ledgers, up to ``window`` in flight, answers taken oldest
    first (as :class:`recovery.checker.ProbeWindow`'s probes): a check of many ledgers waits about
    once per ``window`` requests, whichever ledgers they belong to."""

    def __init__(self, pool: BookiePool, window: int, timeout_s: float) -> None:
        self._pool = pool
        self._window = max(1, window)
        self._timeout_s = timeout_s
        self._in_flight: deque[_Listing] = deque()
        self._bad: dict[int, dict[str, list[int]]] = {}
        self._pending: deque[LedgerMetadata] = deque()   # ledgers added, in order, whose answers are not all in
        self._lacking_copies: Counter[int] = Counter()   # entry -> bookies lacking it, of the oldest pending ledger
        self.tally = ReplicasTally()

    def add(self, md: LedgerMetadata, available: Collection[str]) -> None:
        """Ask every ``available`` bookie of each finished fragment of ``md`` about its share."""
        asked = False
        for first, last, bookies in checkable_fragments(md):
            for pos, bookie in enumerate(bookies):
                if bookie not in available:
                    continue
                share = list(positions_entries(md, first, last, pos))
                for i in range(0, len(share), LIST_IDS_MAX):
                    ids = share[i:i + LIST_IDS_MAX]
                    if not asked:
                        self._pending.append(md)
                        asked = True
                    while len(self._in_flight) >= self._window:
                        self._settle(self._in_flight.popleft())
                    self._in_flight.append(_Listing(md.ledger_id, bookie, first, ids, self._launch(md, bookie, ids)))
                    self.tally.requests += 1

    def found(self) -> dict[int, dict[str, list[int]]]:
        """Ledger → bookie → first entry ids of the fragments it lacks entries of, as answered so
        far (without waiting); taken."""
        bad, self._bad = self._bad, {}
        return bad

    def drain(self) -> dict[int, dict[str, list[int]]]:
        """Wait for every answer (:meth:`found` then); the tally is complete afterwards."""
        while self._in_flight:
            self._settle(self._in_flight.popleft())
        while self._pending:
            self._close_ledger()
        return self.found()

    def _launch(self, md: LedgerMetadata, bookie: str, ids: list[int]) -> Any:
        try:
            return self._pool.get(bookie).held_entries_future(md.ledger_id, ids)
        except errors.LedgerError:
            return None

    def _settle(self, lst: _Listing) -> None:
        while self._pending and self._pending[0].ledger_id != lst.ledger_id:
            self._close_ledger()   # answers come in the order sent: that ledger's are all in
        lacking = self._lacking(lst)
        if not lacking:
            return
        self._lacking_copies.update(lacking)   # the oldest pending ledger's: the loop above closed older ones
        self.tally.entries_lacking += len(lacking)
        keys = self._bad.setdefault(lst.ledger_id, {}).setdefault(lst.bookie, [])
        if lst.fragment not in keys:
            log.warning("ledger %d: bookie %s lacks %d entries of fragment %d (%d..%d among them)", lst.ledger_id,
                        lst.bookie, len(lacking), lst.fragment, lacking[0], lacking[-1])
            keys.append(lst.fragment)

    def _lacking(self, lst: _Listing) -> list[int]:
        """The listed entries the answer shows the bookie lacks; none when it tells nothing."""
        if lst.future is None:
            return []
        try:
            told = held_answer(lst.ids, lst.future.result(timeout=self._timeout_s))
        except NO_ANSWER:
            return []
        if told is None:
            return []
        held, spoken = told
        return [e for e in lst.ids[:spoken] if e not in held]

    def _close_ledger(self) -> None:
        """The oldest pending ledger's answers are all in: count its worst entry."""
        md = self._pending.popleft()
        if not self._lacking_copies:
            return
        copies = md.write_quorum_size - max(self._lacking_copies.values())
        self._lacking_copies.clear()
        t = self.tally
        t.ledgers_no_replica += copies <= 0
        t.ledgers_below_ack_quorum += copies < md.ack_quorum_size
        t.ledgers_below_write_quorum += copies < md.write_quorum_size
