"""In-order completion outside a lock: the hand-off between a writer's protocol and its callers.

A writer decides under its lock what completed, in order (a ledger's entries, a stream's records),
and must then settle the callers' futures. Not under the lock: a future's done-callbacks are the
caller's code, which may call the writer again. Not concurrently either: two threads settling
batches side by side could settle a later entry's future before an earlier one's. So completions
are queued here under the owner's lock, and delivered by one thread at a time, after it let go of
the lock: whoever calls ``run`` while another thread is delivering leaves its completions to that
thread, which takes them after what it had, so nothing overtakes.

``take`` runs under the lock for each batch taken off the queue (the owner's bookkeeping: the
futures the completions name, room for more appends) and returns what ``deliver`` gets outside it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")   # what the owner queues (its completions)
R = TypeVar("R")   # what ``take`` makes of a batch of them, for ``deliver``


class InOrderCompleter(Generic[T, R]):
    """Completions queued under ``lock`` (``add``), delivered in that order outside it (``run``, or
    ``claim`` under the lock and ``deliver`` after it).

    ``idle`` (a condition on ``lock``) is notified whenever a delivering thread has emptied the
    queue, for owners that wait until every completion was delivered (``settled``)."""

    __slots__ = ("_deliver", "_deliverer", "_lock", "_queue", "_running", "_take", "idle")

    def __init__(self, lock: threading.Lock, take: Callable[[list[T]], R], deliver: Callable[[R], object]) -> None:
        self._lock = lock
        self._take = take
        self._deliver = deliver
        self._queue: deque[T] = deque()   # guarded by lock
        self._running = False             # guarded by lock: a thread is delivering
        self._deliverer = 0               # guarded by lock: which (its ident), while one is
        self.idle = threading.Condition(lock)

    def add(self, completions: Iterable[T]) -> None:
        """Under the lock: queue completions, after every one queued before."""
        self._queue.extend(completions)

    @property
    def busy(self) -> bool:
        """Under the lock: completions are queued or being delivered."""
        return self._running or bool(self._queue)

    def settled(self) -> bool:
        """Under the lock: every completion queued so far was delivered, as far as the calling
        thread can wait for it: on the delivering thread itself (a user callback that waits for
        its own writer) what is left is delivered once it returns, so waiting would never end."""
        return not self.busy or (self._running and self._deliverer == threading.get_ident())

    def claim(self) -> R | None:
        """Under the lock: take what is queued for this thread to deliver, after letting go of the
        lock, with ``deliver``; None when nothing is queued or another thread is delivering (it
        delivers this too). Saves ``run`` taking the lock again, for owners that hold it anyway."""
        if self._running or not self._queue:
            return None
        self._running, self._deliverer = True, threading.get_ident()
        batch = list(self._queue)
        self._queue.clear()
        return self._take(batch)

    def deliver(self, taken: R) -> None:
        """Not under the lock: deliver what ``claim`` took, then whatever was queued meanwhile."""
        try:
            while True:
                self._deliver(taken)
                with self._lock:
                    if not self._queue:
                        self._running = False
                        self.idle.notify_all()
                        return
                    batch = list(self._queue)
                    self._queue.clear()
                    taken = self._take(batch)
        except BaseException:
            with self._lock:   # a failing delivery must not leave the queue without a deliverer
                self._running = False
                self.idle.notify_all()
            raise

    def run(self) -> None:
        """Not under the lock: deliver what is queued, unless another thread is delivering (it
        delivers these too, before it stops)."""
        with self._lock:
            taken = self.claim()
        if taken is not None:
            self.deliver(taken)
