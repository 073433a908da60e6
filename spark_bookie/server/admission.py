"""Whose turn an add batch is and how long it waits: the bookie's side of isolation (DESIGN §4.10).

Before a connection applies a batch it asks :meth:`Admission.assess`: the batch's *flow* (its
namespace, or its ledger when outside any: the journal takes flows in turns, storage/flow_queue.py)
and how long to *hold* it for its namespace's write rates (server/rates.py). Both come from caches
that never block an add on ZooKeeper (server/namespace_view.py): a ledger seen for the first time
goes in its own flow, unthrottled, until its metadata has been read.

Rates count what the writer wrote: a stream record set's records and their payload bytes (its
header names the count; the per-record txid and length are not counted), or else an entry's
payload (not its framing) as one record. A bookie sees Qw/E of a
striped ledger's entries, so each is charged E/Qw of itself (LedgerFacts.share).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from ledger_client.protocol.framing import HEADER_BYTES
from spark_bookie.server.adds import AddGroup
from spark_bookie.server.namespace_view import LedgerFacts, NamespaceView
from spark_bookie.server.rates import NO_LIMITS, NamespaceRates, RateLimits

# A stream record set's header (ledger_client.stream.records): magic, version, flags, pad, count.
_RECORD_SET = struct.Struct("<BBBxI")
_RECORD_SET_MAGIC, _RECORD_SET_VERSION = 0xD1, 1
_RECORD_OVERHEAD_BYTES = 12       # a record's txid and length
_RECORD_SET_HEADER_BYTES = 16


def written(body: bytes, digest_bytes: int) -> tuple[int, int]:
    """What the writer wrote in an entry body: (bytes, records). For a stream record set (when it
    plausibly is one) its records' payload bytes and count; else the entry's payload and 1."""
    at = HEADER_BYTES + digest_bytes
    payload = len(body) - at
    if payload < _RECORD_SET_HEADER_BYTES:
        return max(payload, 0), 1
    magic, version, _flags, count = _RECORD_SET.unpack_from(body, at)
    if magic != _RECORD_SET_MAGIC or version != _RECORD_SET_VERSION or count < 1:
        return payload, 1
    records_bytes = payload - _RECORD_SET_HEADER_BYTES - count * _RECORD_OVERHEAD_BYTES
    if records_bytes < 0:
        return payload, 1   # not a record set after all: no count this body could hold
    return records_bytes, count


def _flow(ledger_id: int, facts: LedgerFacts | None) -> Hashable:
    """A ledger's flow: its namespace, else the ledger itself (outside any, or not known yet)."""
    return facts.namespace if facts is not None and facts.namespace else ("ledger", ledger_id)


class Piece(NamedTuple):
    """Part of an add batch, applied once ``hold_s`` (from when the batch was assessed) is over."""

    groups: list[AddGroup]
    hold_s: float


class Admission:
    """Thread-safe. ``view`` None: every ledger is its own flow and nothing is held."""

    def __init__(self, view: NamespaceView | None, rates: NamespaceRates | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_hold: Callable[[str, float], None] | None = None) -> None:
        self.view = view
        self.rates = rates or NamespaceRates()
        self._clock = clock
        self._on_hold = on_hold   # (namespace, seconds held): the bookie's metrics
        if view is not None:
            view.on_namespace_change.append(self._namespace_changed)

    def _namespace_changed(self, name: str | None) -> None:
        if name is not None:
            self.rates.forget(name)

    def flow_of(self, ledger_id: int) -> Hashable:
        """The ledger's flow as far as known now (its namespace, else itself)."""
        return _flow(ledger_id, None if self.view is None else self.view.peek_ledger(ledger_id))

    def assess(self, groups: Sequence[AddGroup]) -> tuple[Hashable, list[Piece]]:
        """(the batch's flow, its pieces): each piece is applied once its hold (seconds from now)
        is over. Groups of unlimited ledgers make one piece, held for nothing; a rate-limited
        namespace's adds are charged one entry at a time, each its own piece, so that a batch
        the client gathered while waiting is answered entry by entry as the rate allows instead
        of all at once at the end (which would make the rate as lumpy as the batches are big)."""
        if not groups:
            return None, []
        view = self.view
        if view is None:
            return _flow(groups[0].ledger_id, None), [Piece(list(groups), 0.0)]
        flow: Hashable = None
        free: list[AddGroup] = []
        held: list[Piece] = []
        for g in groups:
            facts = view.peek_ledger(g.ledger_id)
            ns = facts.namespace if facts is not None else ""
            if flow is None:
                flow = _flow(g.ledger_id, facts)
            limits = view.peek_limits(ns) if facts is not None and ns else NO_LIMITS
            # (a malformed group goes through unheld: process_adds answers each of its adds why)
            # (an announced LAC carries no entry: nothing to charge)
            if (facts is None or limits.unlimited or not g.entry_ids
                    or not len(g.entry_ids) == len(g.request_ids) == len(g.bodies)):
                free.append(g)
                continue
            held.extend(self._charge(ns, limits, facts, g))
            if self._on_hold is not None and held[-1].hold_s > 0:
                self._on_hold(ns, held[-1].hold_s)
        return flow, ([Piece(free, 0.0)] if free else []) + held

    def _charge(self, ns: str, limits: RateLimits, facts: LedgerFacts, g: AddGroup) -> list[Piece]:
        weight = 1.0 / facts.share
        now = self._clock()
        pieces = []
        for eid, rid, body in zip(g.entry_ids, g.request_ids, g.bodies, strict=True):
            nbytes, records = written(body, facts.digest_bytes)
            hold = self.rates.charge(ns, limits, nbytes * weight, records * weight, now)
            pieces.append(Piece([AddGroup(g.ledger_id, g.flag, g.master_key, [eid], [rid], [body])], hold))
        return pieces
