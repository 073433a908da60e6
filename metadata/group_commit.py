"""Group commit of metadata requests that many threads of one client make at the same time.

A Python ZooKeeper client pays per request, not per byte: each one is a wake-up of kazoo's
connection thread, a select and a send, and ZooKeeper logs it as a transaction of its own. When
16 threads of one client each create a ledger, most of the client's CPU went there (issue 33).
Here the first caller becomes the leader of a batch: it takes every request queued at that moment
and serves them together (one multi-op, one claim of ids); callers that arrive meanwhile queue for
the next batch. A caller alone is served at once, as before, so nothing waits for company.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from metadata.errors import MetadataError

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``submit(item)`` returns the item's result from ``serve(batch)``, which gets the items
    queued together (in order, at most ``batch_max``) and returns one outcome per item. An
    exception raised by ``serve`` itself is every item's outcome."""

    def __init__(self, serve: Callable[[list[T]], Sequence[R | BaseException]], *, batch_max: int = 256) -> None:
        self._serve = serve
        self._batch_max = batch_max
        self._cond = threading.Condition()
        self._queue: list[_Slot[T, R]] = []
        self._leading = False

    def submit(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._cond:
            self._queue.append(slot)
            while not slot.done:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                batch, self._queue = self._queue[:self._batch_max], self._queue[self._batch_max:]
                self._cond.release()
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._leading = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]   # done without an error: a result

    def _run(self, batch: list[_Slot[T, R]]) -> None:
        try:
            outcomes = list(self._serve([s.item for s in batch]))
            if len(outcomes) != len(batch):
                raise MetadataError(f"a batch of {len(batch)} requests got {len(outcomes)} answers")
        except BaseException as e:  # every caller of the batch learns why, the leader too
            outcomes = [e] * len(batch)
        for s, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                s.error = outcome
            else:
                s.result = outcome
            s.done = True
