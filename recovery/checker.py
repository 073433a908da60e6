"""The fragment checker: does each bookie of a finished fragment still have its entries?

BookKeeper's LedgerChecker as the auditor's periodic "check all ledgers" uses it: for every
finished fragment and every bookie of it, read that bookie's first and last entry of the fragment
(plus a sampled fraction of the others). A definite "no such entry / no such ledger", or a copy
that fails its digest, means the bookie lost data it was trusted with: the ledger is marked with
that bookie missing, and a replication worker moves the fragment to another bookie. A bookie that
does not answer is left alone here: whether it is lost is the lost-bookie delay's business.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Collection
from typing import Any, NamedTuple

import grpc

from ledger_client import errors
from ledger_client.bookies import BookiePool
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, FramingError
from metadata import DigestType, LedgerMetadata

from .plan import checkable_fragments, positions_entries, sample_entries

log = logging.getLogger(__name__)
LIST_IDS_MAX = 10_000   # entry ids per ids-only listed read (~50 KB of request; the bookie takes 65,536)


class _Probe(NamedTuple):
    ledger_id: int
    bookie: str
    fragment: int        # first entry id of the fragment
    entry_id: int
    digester: Digester | None
    future: Any          # None when the read could not even be sent


class ProbeWindow:
    """The checker's reads of many ledgers with up to ``window`` of them in flight at once.

    Before, a full check launched one ledger's probes and waited for them before the next ledger:
    one round trip per ledger with entries (10,000 round trips and as many idle gRPC channels
    for 100,000 ledgers, a tenth of them with entries). Here a read is sent as soon as its ledger
    is added and answers are taken oldest first only once ``window`` reads are outstanding (and
    at :meth:`drain`), so a scan waits about ``ceil(probes / window)`` times, whichever ledgers the
    probes belong to. What a probe means is unchanged (:func:`_missing`): a definite "no such
    entry / ledger" or a copy failing its digest is a loss; an error or a timeout proves nothing.
    """

    def __init__(self, pool: BookiePool, window: int, timeout_s: float, fraction: float,
                 rng: random.Random) -> None:
        self._pool = pool
        self._window = max(1, window)
        self._timeout_s = timeout_s
        self._fraction = fraction
        self._rng = rng
        self._in_flight: deque[_Probe] = deque()
        self._digesters: dict[DigestType, Digester] = {}
        self._bad: dict[int, dict[str, list[int]]] = {}
        self.probes = 0

    def add(self, md: LedgerMetadata, available: Collection[str]) -> None:
        """Send the probes of every finished fragment of ``md`` on its ``available`` bookies."""
        digester = self._digester(md.digest_type)
        for first, last, bookies in checkable_fragments(md):
            for pos, bookie in enumerate(bookies):
                if bookie not in available:
                    continue
                for e in sample_entries(md, first, last, pos, self._fraction, self._rng):
                    while len(self._in_flight) >= self._window:
                        self._settle(self._in_flight.popleft())
                    self._in_flight.append(_Probe(md.ledger_id, bookie, first, e, digester,
                                                  _launch_listed(self._pool, md.ledger_id, bookie, e)))
                    self.probes += 1

    def found(self) -> dict[int, dict[str, list[int]]]:
        """What the probes answered so far showed (as :meth:`drain`), without waiting; taken."""
        bad, self._bad = self._bad, {}
        return bad

    def drain(self) -> dict[int, dict[str, list[int]]]:
        """Wait for every probe; ledger → bookie → first entry ids of the fragments it lacks
        (in the order the probes were sent). The window is empty and reusable afterwards."""
        while self._in_flight:
            self._settle(self._in_flight.popleft())
        return self.found()

    def _settle(self, p: _Probe) -> None:
        if not _missing(p.ledger_id, p.entry_id, p.future, p.digester, self._timeout_s):
            return
        keys = self._bad.setdefault(p.ledger_id, {}).setdefault(p.bookie, [])
        if p.fragment not in keys:
            log.warning("ledger %d: bookie %s does not have entry %d of fragment %d",
                        p.ledger_id, p.bookie, p.entry_id, p.fragment)
            keys.append(p.fragment)

    def _digester(self, digest_type: DigestType) -> Digester | None:
        """One digester per digest type (without a password it keeps no per-ledger state); None
        for HMAC, whose key the auditor does not have: such copies are checked for presence only."""
        if digest_type is DigestType.HMAC:
            return None
        d = self._digesters.get(digest_type)
        if d is None:
            d = self._digesters[digest_type] = Digester(digest_type, b"")
        return d


class FragmentChecker:
    def __init__(self, pool: BookiePool, *, sample_fraction: float, reads_in_flight_max: int,
                 timeout_s: float, rng: random.Random | None = None) -> None:
        self._pool = pool
        self._fraction = sample_fraction
        self._window = max(1, reads_in_flight_max)
        self._timeout_s = timeout_s
        self._rng = rng or random.Random()

    def check(self, md: LedgerMetadata, available: Collection[str]) -> dict[str, list[int]]:
        """Bookie → first entry ids of the fragments where it is missing (or corrupts) entries.

        Only bookies in ``available`` are asked; a read that errors or times out proves nothing.
        One ledger on its own: a scan of many uses :meth:`window` so reads of many ledgers overlap.
        """
        win = self.window()
        win.add(md, available)
        return win.drain().get(md.ledger_id, {})

    def window(self) -> ProbeWindow:
        """A window of probe reads over many ledgers (the auditor's full check)."""
        return ProbeWindow(self._pool, self._window, self._timeout_s, self._fraction, self._rng)

    def lacking_entries(self, md: LedgerMetadata, first: int, last: int, position: int,
                        bookie: str) -> list[int] | None:
        """The entries of the fragment [first, last] that ``bookie`` (at ``position``) should hold
        and does not, asked by listed reads of ids only (no bodies travel); None when it cannot
        tell (no answer, an error) or when an end it holds is not a valid copy (a bookie that
        corrupts data gets all of its share again). Every entry counts, not only the ends the
        auditor's probes read: a bookie that missed adds in the middle of a fragment (a connection
        lost and found again under a writer) holds both ends and still lacks entries."""
        share = list(positions_entries(md, first, last, position))
        lacking: list[int] = []
        i = 0
        while i < len(share):
            told = self._held(md.ledger_id, bookie, share[i:i + LIST_IDS_MAX])
            if told is None:
                return None
            held, spoken = told
            lacking.extend(e for e in share[i:i + spoken] if e not in held)
            i += spoken
        gone = set(lacking)
        ends = [e for e in dict.fromkeys(share[:1] + share[-1:]) if e not in gone]
        return lacking if self._valid_copies(md, bookie, ends) else None

    def _held(self, ledger_id: int, bookie: str, ids: list[int]) -> tuple[set[int], int] | None:
        """:func:`held_answer` of ``bookie``'s answer; None without one."""
        try:
            resp = self._pool.get(bookie).held_entries_future(ledger_id, ids).result(timeout=self._timeout_s)
        except NO_ANSWER:
            return None
        return held_answer(ids, resp)

    def _valid_copies(self, md: LedgerMetadata, bookie: str, entry_ids: list[int]) -> bool:
        """Does ``bookie`` answer each of ``entry_ids`` with a copy that passes its digest
        (presence only for HMAC ledgers, whose key the checker does not have)?"""
        futures = [self._launch(md.ledger_id, bookie, e) for e in entry_ids]
        digester = Digester(md.digest_type, b"") if md.digest_type is not DigestType.HMAC else None
        for e, fut in zip(entry_ids, futures, strict=True):
            if fut is None:
                return False
            try:
                resp = fut.result(timeout=self._timeout_s)
                if resp.status != pb.EOK:
                    return False
                if digester is not None:
                    digester.unframe(resp.body, md.ledger_id, e)
            except (grpc.RpcError, grpc.FutureTimeoutError, FramingError):
                return False
        return True

    def _launch(self, ledger_id: int, bookie: str, entry_id: int) -> Any:
        return _launch(self._pool, ledger_id, bookie, entry_id)


def _launch(pool: BookiePool, ledger_id: int, bookie: str, entry_id: int) -> Any:
    try:
        return pool.get(bookie).read_future(ledger_id, entry_id)
    except errors.LedgerError:
        return None


def _launch_listed(pool: BookiePool, ledger_id: int, bookie: str, entry_id: int) -> Any:
    """A probe as a listed read of one entry: on the bookie's TCP read port (the pool's default
    read transport) it costs a fifth of a gRPC call's CPU, which is what a check of tens of
    thousands of probes spends. With one id listed the answer is unambiguous (the first entry
    found is always returned, whatever its size; ENOENTRY when it is not held). A bookie the
    listed read cannot be sent to (no TCP read port) is probed with a plain gRPC read instead."""
    try:
        return pool.get(bookie).read_entries_future(ledger_id, [entry_id])
    except errors.LedgerError:
        return _launch(pool, ledger_id, bookie, entry_id)


def held_answer(ids: list[int], resp: pb.ReadRangeResponse) -> tuple[set[int], int] | None:
    """What an ids-only listed read of ``ids`` answered: (the held ones, how many of ``ids`` the
    answer speaks for: all, or for a bookie that predates ids_only and answered a plain listed
    read cut by its byte limit, those up to its last body); None when it tells nothing."""
    if resp.status in (pb.ENOLEDGER, pb.ENOENTRY):   # ENOENTRY: an older bookie holding none of them
        return set(), len(ids)
    if resp.status != pb.EOK:
        return None
    held = set(resp.entry_ids)
    if not resp.bodies:
        return held, len(ids)
    last = resp.entry_ids[-1] if resp.entry_ids else None
    return (held, ids.index(last) + 1) if last in ids else None


#: what a probe's future may raise; none of it says anything about the bookie's copy
NO_ANSWER = (grpc.RpcError, grpc.FutureTimeoutError, TimeoutError, errors.LedgerError)


def _missing(ledger_id: int, entry_id: int, fut: Any, digester: Digester | None, timeout_s: float) -> bool:
    """Does this probe's answer prove the bookie lacks the entry (or holds a corrupt copy)? The
    answer is a ReadResponse (plain read) or a ReadRangeResponse (listed read of that entry)."""
    if fut is None:
        return False
    try:
        resp = fut.result(timeout=timeout_s)
    except NO_ANSWER:
        return False
    if resp.status in (pb.ENOENTRY, pb.ENOLEDGER):
        return True
    if resp.status != pb.EOK or digester is None:
        return False
    if isinstance(resp, pb.ReadRangeResponse):
        if list(resp.entry_ids[:1]) != [entry_id] or not resp.bodies:
            return False   # not an answer about this entry: proves nothing
        body = resp.bodies[0]
    else:
        body = resp.body
    try:
        digester.unframe(body, ledger_id, entry_id)
    except FramingError:
        return True
    return False
