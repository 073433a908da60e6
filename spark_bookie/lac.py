"""The bookie's view of each ledger's last-add-confirmed, and long-poll waiters on it.

A bookie learns a ledger's LAC from the header piggybacked on every entry and from explicit LAC
writes; it never goes backwards. Long-poll readers (BookKeeper's readLacAndEntry with a previous
LAC) park here until the LAC passes what they have already seen. Everything here runs on the
server's event loop thread, so no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LacTracker:
    def __init__(self, initial: Callable[[int], int]) -> None:
        """`initial(ledger_id)` derives the LAC from storage the first time a ledger is asked about."""
        self._initial = initial
        self._lac: dict[int, int] = {}
        self._waiters: dict[int, list[tuple[int, asyncio.Future[int]]]] = {}

    def get(self, ledger_id: int) -> int:
        lac = self._lac.get(ledger_id)
        if lac is None:
            lac = self._initial(ledger_id)
            self._lac[ledger_id] = lac
        return lac

    def advance(self, ledger_id: int, lac: int) -> None:
        if lac <= self.get(ledger_id):
            return
        self._lac[ledger_id] = lac
        waiters = self._waiters.get(ledger_id)
        if not waiters:
            return
        keep = []
        for previous, fut in waiters:
            if fut.done():
                continue
            if lac > previous:
                fut.set_result(lac)
            else:
                keep.append((previous, fut))
        if keep:
            self._waiters[ledger_id] = keep
        else:
            del self._waiters[ledger_id]

    def forget(self, ledger_id: int) -> None:
        self._lac.pop(ledger_id, None)

    async def wait_past(self, ledger_id: int, previous: int, timeout_s: float) -> int:
        """Return the LAC once it exceeds `previous`, or the unchanged LAC after `timeout_s`."""
        lac = self.get(ledger_id)
        if lac > previous or timeout_s <= 0:
            return lac
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ledger_id, []).append((previous, fut))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return self.get(ledger_id)
        finally:
            waiters = self._waiters.get(ledger_id)
            if waiters is not None:
                waiters[:] = [w for w in waiters if w[1] is not fut]
                if not waiters:
                    del self._waiters[ledger_id]

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())
