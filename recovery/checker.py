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
from collections.abc import Collection
from typing import Any

import grpc

from ledger_client import errors
from ledger_client.bookies import BookiePool
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, FramingError
from metadata import DigestType, LedgerMetadata

from .plan import checkable_fragments, sample_entries

log = logging.getLogger(__name__)


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
        """
        probes: list[tuple[str, int, int]] = []   # (bookie, fragment key, entry id)
        for first, last, bookies in checkable_fragments(md):
            for pos, bookie in enumerate(bookies):
                if bookie not in available:
                    continue
                for e in sample_entries(md, first, last, pos, self._fraction, self._rng):
                    probes.append((bookie, first, e))
        bad: dict[str, list[int]] = {}
        digester = Digester(md.digest_type, b"") if md.digest_type is not DigestType.HMAC else None
        for start in range(0, len(probes), self._window):
            chunk = probes[start:start + self._window]
            futures = [self._launch(md.ledger_id, b, e) for b, _k, e in chunk]
            for (bookie, key, e), fut in zip(chunk, futures, strict=True):
                if self._missing(md.ledger_id, e, fut, digester) and key not in bad.get(bookie, []):
                    log.warning("ledger %d: bookie %s does not have entry %d of fragment %d",
                                md.ledger_id, bookie, e, key)
                    bad.setdefault(bookie, []).append(key)
        return bad

    def holds_ends(self, md: LedgerMetadata, first: int, last: int, position: int, bookie: str) -> bool:
        """Does ``bookie`` (at ``position`` of the fragment [first, last]) answer its first and last
        entry of the fragment with a valid copy? A writer that wrote on without a bookie (a delayed
        ensemble change) left it without the fragment's last entries, so a bookie passing this has
        what such a writer skipped; anything but a valid copy (an error included) is a no."""
        wanted = sample_entries(md, first, last, position, 0.0, self._rng)
        futures = [self._launch(md.ledger_id, bookie, e) for e in wanted]
        digester = Digester(md.digest_type, b"") if md.digest_type is not DigestType.HMAC else None
        for e, fut in zip(wanted, futures, strict=True):
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
        try:
            return self._pool.get(bookie).read_future(ledger_id, entry_id)
        except errors.LedgerError:
            return None

    def _missing(self, ledger_id: int, entry_id: int, fut: Any, digester: Digester | None) -> bool:
        if fut is None:
            return False
        try:
            resp = fut.result(timeout=self._timeout_s)
        except (grpc.RpcError, grpc.FutureTimeoutError):
            return False
        if resp.status in (pb.ENOENTRY, pb.ENOLEDGER):
            return True
        if resp.status != pb.EOK or digester is None:
            return False
        try:
            digester.unframe(resp.body, ledger_id, entry_id)
        except FramingError:
            return True
        return False
