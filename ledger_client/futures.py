"""A cheaper ``concurrent.futures.Future`` for appends.

A writer makes one Future per entry and most are never waited on (a pipelined writer waits on the
last one, or on none). ``Future()`` builds a ``threading.Condition`` up front, which was a quarter
of ``append_async``'s CPU; here the condition is made on first use by a waiter, and settling a
future nobody waits on takes no lock at all.

Why the lock-free path is safe (CPython's GIL makes the dict, list and attribute operations below
atomic and sequentially consistent): every waiter — ``result()``, ``exception()``, ``wait()``,
``as_completed()`` — first creates the condition and only then reads the state, under the
condition. The setter first writes the state and only then looks for the condition. So either the
waiter reads FINISHED, or the setter sees the condition and notifies under it (the slow path)
after the waiter has parked.

Callbacks take no lock either (asyncio's wrap_future and most pipelined writers add one to every
future, and making a condition for each was ~5 us per append): ``add_done_callback`` appends, then
reads the state; settling writes the state, then runs callbacks. Each callback is taken off the
list by an atomic ``pop`` before it runs, so when the two race both may run callbacks, but each
callback runs exactly once, and none is missed (whoever reads the state after the other's write
sees the callback). The future is RUNNING from birth, so
``cancel()`` returns False: an add on its way to the bookies cannot be taken back, and a cancelled
future would otherwise break the in-order completion of the ones after it.

``result()`` and ``exception()`` on a settled future read the state and return, like ``done()``:
the stock ones take the condition first, and here that would build one per future (2.7-12 us on
a future the writer already settled, a third of a pipelined append's client cost).

What this leans on, and why no public API serves: ``concurrent.futures.wait``, ``as_completed``
and ``asyncio.wrap_future`` accept only ``Future`` instances and drive them through the private
attributes ``_condition``, ``_waiters``, ``_state`` (with ``concurrent.futures._base``'s state
constants) and ``_done_callbacks``. Those are the names below; tests/unit/test_append_future.py
checks each against the pinned Python (3.11). With the GIL disabled (free-threaded builds) the
lock-free path is not safe, so there every future takes the stock, locked path (``_LOCK_FREE``).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, RUNNING  # the stock Future's state names (see above)
from typing import Any, TypeVar

T = TypeVar("T")


def gil_enabled() -> bool:
    """False only on a free-threaded build running without the GIL (Python 3.13t and later)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


_LOCK_FREE = gil_enabled()

_COND = "_lazy_condition"
_WAITERS = "_lazy_waiters"
_CALLBACKS = "_lazy_callbacks"
log = logging.getLogger("concurrent.futures")  # where the stock Future reports a failing callback


class AppendFuture(Future[T]):
    """A Future settled exactly once, by one thread (the writer's completion drainer)."""

    def __init__(self) -> None:  # noqa: D107 - deliberately not calling Future.__init__
        self._state = RUNNING
        self._result = None
        self._exception = None
        # _waiters and _done_callbacks are made on first use too: a pipelined writer holds
        # thousands of futures at once, and two lists each were a third of the objects the cyclic
        # GC had to walk per outstanding append.

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return self._lazy_list(_WAITERS)

    @property
    def _done_callbacks(self) -> list[Any]:  # type: ignore[override]
        return self._lazy_list(_CALLBACKS)

    def _lazy_list(self, name: str) -> list[Any]:
        d = self.__dict__
        got = d.get(name)
        if got is None:
            got = d.setdefault(name, [])  # atomic: racing creators agree
        return got  # type: ignore[no-any-return]

    @property  # type: ignore[override]
    def _condition(self) -> threading.Condition:
        d = self.__dict__
        cond = d.get(_COND)
        if cond is None:
            cond = d.setdefault(_COND, threading.Condition())  # atomic: racing creators agree
        return cond  # type: ignore[no-any-return]

    @_condition.setter
    def _condition(self, value: threading.Condition) -> None:
        self.__dict__[_COND] = value

    def _settle(self, result: Any, exception: BaseException | None) -> None:
        # getattr, not self.__dict__: reading __dict__ makes CPython build a dict object for an
        # instance whose attributes it keeps inline (one more object per append for the GC)
        if not _LOCK_FREE or getattr(self, _COND, None) is not None:
            # Someone waits (or waited), or no GIL orders our reads and writes: the stock path.
            if exception is None:
                super().set_result(result)
            else:
                super().set_exception(exception)
            return
        if self._state == FINISHED:
            raise InvalidStateError(f"{self._state}: {self!r}")
        self._result, self._exception = result, exception
        self._state = FINISHED
        cond = getattr(self, _COND, None)
        if cond is not None:
            with cond:  # a waiter arrived between our two looks: wake it
                for waiter in self._waiters:
                    if exception is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                cond.notify_all()
        if getattr(self, _CALLBACKS, None):
            self._invoke_callbacks()

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        self._done_callbacks.append(fn)
        if self._state == FINISHED:
            self._invoke_callbacks()

    def _invoke_callbacks(self) -> None:
        """Run each registered callback once, whichever thread gets to it (see the module doc)."""
        callbacks = self._done_callbacks
        while True:
            try:
                fn = callbacks.pop(0)
            except IndexError:
                return
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)

    # Reading the state needs no lock (see the module doc); the stock ones take the condition.
    def result(self, timeout: float | None = None) -> T:
        if _LOCK_FREE and self._state == FINISHED:
            if self._exception is None:
                return self._result  # type: ignore[return-value]
            try:
                raise self._exception
            finally:
                self = None  # type: ignore[assignment]  # as the stock one: no cycle via the traceback
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if _LOCK_FREE and self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def done(self) -> bool:
        return self._state == FINISHED  # never cancelled

    def running(self) -> bool:
        return self._state == RUNNING

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: T) -> None:
        self._settle(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle(None, exception if exception is not None else RuntimeError("no exception given"))

