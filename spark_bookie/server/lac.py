"""The bookie's view of each ledger's last-add-confirmed, and long-poll waiters on it.

A bookie learns a ledger's LAC from the header piggybacked on every entry and from explicit LAC
writes; it never goes backwards. Long-poll readers (BookKeeper's readLacAndEntry with a previous
LAC) park here until the LAC passes what they have already seen.

Waiters live on the server's event loop, but adds that arrive on the TCP add port advance the LAC
from whichever thread made them durable (the journal's, or the connection's own when it committed
the group itself; they are answered there, without a hop through the loop), so the table is under
a lock and a waiter is woken through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


def _wake(fut: asyncio.Future[int], lac: int) -> None:
    if not fut.done():
        fut.set_result(lac)


class LacTracker:
    def __init__(self, initial: Callable[[int], int], loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`initial(ledger_id)` derives the LAC from storage the first time a ledger is asked about;
        `loop` is the one long-poll waiters run on (None: the loop running when one first waits)."""
        self._initial = initial
        self._loop = loop
        self._lock = threading.Lock()
        self._lac: dict[int, int] = {}
        self._waiters: dict[int, list[tuple[int, asyncio.Future[int]]]] = {}

    def get(self, ledger_id: int) -> int:
        lac = self._lac.get(ledger_id)
        if lac is None:
            with self._lock:
                lac = self._get_locked(ledger_id)
        return lac

    def _get_locked(self, ledger_id: int) -> int:
        lac = self._lac.get(ledger_id)
        if lac is None:
            lac = self._initial(ledger_id)
            self._lac[ledger_id] = lac
        return lac

    def advance(self, ledger_id: int, lac: int) -> None:
        """Raise the LAC (never lower it) and wake the waiters it passes; any thread."""
        with self._lock:
            if lac <= self._get_locked(ledger_id):
                return
            self._lac[ledger_id] = lac
            waiters = self._waiters.get(ledger_id)
            if not waiters:
                return
            keep = [w for w in waiters if lac <= w[0]]
            ready = [fut for previous, fut in waiters if lac > previous]
            if keep:
                self._waiters[ledger_id] = keep
            else:
                del self._waiters[ledger_id]
            loop = self._loop
        if loop is not None:
            for fut in ready:
                try:
                    loop.call_soon_threadsafe(_wake, fut, lac)
                except RuntimeError:  # the loop is closed (bookie stopping): its waiters went with it
                    return

    def forget(self, ledger_id: int) -> None:
        with self._lock:
            self._lac.pop(ledger_id, None)

    async def wait_past(self, ledger_id: int, previous: int, timeout_s: float) -> int:
        """Return the LAC once it exceeds `previous`, or the unchanged LAC after `timeout_s`."""
        with self._lock:  # the check and the registration as one step: an advance cannot slip between
            lac = self._get_locked(ledger_id)
            if lac > previous or timeout_s <= 0:
                return lac
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            fut: asyncio.Future[int] = self._loop.create_future()
            self._waiters.setdefault(ledger_id, []).append((previous, fut))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return self.get(ledger_id)
        finally:
            with self._lock:
                waiters = self._waiters.get(ledger_id)
                if waiters is not None:
                    waiters[:] = [w for w in waiters if w[1] is not fut]
                    if not waiters:
                        del self._waiters[ledger_id]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())
