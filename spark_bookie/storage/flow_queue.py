"""The journal's queue of submits: first come first served, or in turns per flow (DESIGN §4.10).

A flow is whoever should get a fair share of the journal: the bookie names a namespace (or, for a
ledger outside any, the ledger). With turns, a journal group takes one submit of each flow in
round-robin order until it is full, so a submit of a quiet flow goes into the next group however
much a flooding flow has queued. Within a flow, submits keep their order. A ledger's records must
keep theirs too (replay skips an add of a ledger whose key record it has not met yet), so each
submit names its one ledger, and a ledger with submits queued is pinned to their flow: a submit
for it joins that flow whatever flow the caller named (the bookie learns a ledger's namespace a
few adds late, and its flow then changes, but only once nothing of it is queued). Without turns
(`fair=False`) there is one queue, as before.

Not thread-safe: the journal holds its lock around every call.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from ledger_client.protocol.checks import invariant


class Sized(Protocol):
    """What the queue needs of a submit: its encoded bytes, when it arrived, its ledger (None: of
    no ledger, or of several, which only a queue without turns may take)."""

    data: bytes
    enqueued: float
    ledger_id: int | None


P = TypeVar("P", bound=Sized)
FIFO_FLOW = None   # the one flow of a queue without turns


class FlowQueue(Generic[P]):
    def __init__(self, fair: bool) -> None:
        self.fair = fair
        # flow -> its submits, in the order flows take turns (a flow with nothing queued is dropped)
        self._flows: collections.OrderedDict[Hashable, collections.deque[P]] = collections.OrderedDict()
        self._bytes: dict[Hashable, int] = {}
        self._pins: dict[int, list] = {}   # ledger id -> [its flow, its submits queued]
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def put(self, flow: Hashable, item: P) -> Hashable:
        """Queue ``item``; returns the flow it joined."""
        key = flow if self.fair else FIFO_FLOW
        if self.fair:
            lid = item.ledger_id
            invariant(lid is not None, "a journal with turns queues one ledger's records per submit")
            pin = self._pins.get(lid)   # type: ignore[arg-type]
            if pin is None:
                self._pins[lid] = [key, 1]   # type: ignore[index]
            else:
                key = pin[0]
                pin[1] += 1
        q = self._flows.get(key)
        if q is None:
            q = self._flows[key] = collections.deque()
        q.append(item)
        self._bytes[key] = self._bytes.get(key, 0) + len(item.data)
        self._count += 1
        return key

    def queued_bytes(self, flow: Hashable) -> int:
        """What `flow` has queued (without turns: everything queued)."""
        return self._bytes.get(flow if self.fair else FIFO_FLOW, 0)

    def oldest_enqueued(self) -> float:
        """When the longest-waiting submit arrived (the queue must not be empty)."""
        return min(q[0].enqueued for q in self._flows.values())

    def only_item(self) -> P | None:
        """The single queued submit, if exactly one is queued."""
        if self._count != 1:
            return None
        return next(iter(self._flows.values()))[0]

    def take(self, budget_bytes: int, took_any: bool) -> list[P]:
        """Submits for a group, at most `budget_bytes` of them (at least one unless `took_any`):
        one of each flow per turn, the flows that gave one moving to the back of the order."""
        out: list[P] = []
        size = 0
        while self._flows:
            progressed = False
            for key in list(self._flows):
                q = self._flows[key]
                nbytes = len(q[0].data)
                if (out or took_any) and size + nbytes > budget_bytes:
                    continue
                item = q.popleft()
                out.append(item)
                size += nbytes
                self._count -= 1
                progressed = True
                self._bytes[key] -= nbytes
                if self.fair:
                    self._unpin(item.ledger_id)   # type: ignore[arg-type]
                if q:
                    self._flows.move_to_end(key)
                else:
                    del self._flows[key]
                    del self._bytes[key]
            if not progressed:
                break
        return out

    def _unpin(self, ledger_id: int) -> None:
        pin = self._pins[ledger_id]
        pin[1] -= 1
        if not pin[1]:
            del self._pins[ledger_id]

    def drain(self) -> list[P]:
        """Everything queued, flow by flow (a failed journal answers them all)."""
        out = [item for q in self._flows.values() for item in q]
        self._flows.clear()
        self._bytes.clear()
        self._pins.clear()
        self._count = 0
        return out
