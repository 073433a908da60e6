"""AppendFuture keeps concurrent.futures.Future's contract while settling without a lock.

The races that matter are a waiter arriving while the setter settles; each test runs many rounds
with the two threads started together, so a lost wake-up shows up as a timeout.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent import futures

import pytest

from ledger_client.futures import AppendFuture

pytestmark = pytest.mark.unit


def test_unwaited_future_settles_and_reports():
    f: AppendFuture[int] = AppendFuture()
    assert not f.done() and f.running()
    f.set_result(7)
    # a writer holds thousands of these: nothing but the state until someone waits or listens
    assert set(vars(f)) == {"_state", "_result", "_exception"}
    assert f.done() and f.result(timeout=0) == 7 and f.exception(timeout=0) is None
    with pytest.raises(futures.InvalidStateError):
        f.set_result(8)


def test_exception_and_callbacks_before_and_after():
    f: AppendFuture[int] = AppendFuture()
    seen: list[object] = []
    f.add_done_callback(lambda x: seen.append(("before", x.exception())))
    err = ValueError("boom")
    f.set_exception(err)
    f.add_done_callback(lambda x: seen.append(("after", x.exception())))
    assert seen == [("before", err), ("after", err)]
    with pytest.raises(ValueError):
        f.result(timeout=0)


def test_cannot_be_cancelled():
    """An add already sent cannot be taken back; cancel() must say so rather than pretend."""
    f: AppendFuture[int] = AppendFuture()
    assert f.cancel() is False and not f.cancelled()
    f.set_result(1)
    assert f.result() == 1


def _wait(how: str, f: AppendFuture[int], got: list[int], start: threading.Barrier, spin: int) -> None:
    start.wait()
    for _ in range(spin):
        pass
    if how == "result":
        got.append(f.result(timeout=5))
    elif how == "wait":
        futures.wait([f], timeout=5)
        got.append(f.result(timeout=0))
    elif how == "as_completed":
        for x in futures.as_completed([f], timeout=5):
            got.append(x.result())
    else:
        done = threading.Event()
        f.add_done_callback(lambda x: (got.append(x.result()), done.set()))
        done.wait(5)


@pytest.mark.parametrize("how", ["result", "wait", "as_completed", "callback"])
def test_no_lost_wakeup_when_waiter_races_setter(how, seed):
    rng = random.Random(seed)
    for _ in range(300):
        f: AppendFuture[int] = AppendFuture()
        got: list[int] = []
        start = threading.Barrier(2)
        t = threading.Thread(target=_wait, args=(how, f, got, start, rng.randrange(50)))
        t.start()
        start.wait()
        for _ in range(rng.randrange(50)):
            pass
        f.set_result(42)
        t.join(10)
        assert got == [42], f"waiter via {how} saw {got}"


class _WaiterSneaksIn(AppendFuture[int]):
    """Parks a result() waiter at the worst moment: after the setter's first look for a condition
    and before it writes FINISHED. The setter must then notice the waiter and wake it."""

    def __init__(self) -> None:
        self.waiter_result: list[object] = []
        super().__init__()

    @property  # type: ignore[override]
    def _state(self) -> str:
        return self.__dict__["_st"]  # type: ignore[no-any-return]

    @_state.setter
    def _state(self, value: str) -> None:
        if value == "FINISHED" and not self.waiter_result:
            t = threading.Thread(target=self._wait)
            t.start()
            while not self.__dict__.get("_lazy_condition") or not self.__dict__["_lazy_condition"]._waiters:
                if not t.is_alive():
                    break
        self.__dict__["_st"] = value

    def _wait(self) -> None:
        # result() re-reads the state when its wait times out, so a missed wake-up shows up as the
        # whole timeout passing (then the value): measure how long the waiter was parked.
        t0 = time.monotonic()
        value = self.result(timeout=5)
        self.waiter_result.append((value, time.monotonic() - t0 < 2.5))


def test_setter_wakes_a_waiter_that_parked_during_settling():
    f = _WaiterSneaksIn()
    f.set_result(5)
    deadline = threading.Event()
    for _ in range(100):
        if f.waiter_result:
            break
        deadline.wait(0.05)
    assert f.waiter_result == [(5, True)], "the waiter was not woken by set_result"


def test_each_callback_runs_exactly_once_when_adds_race_the_setter(seed):
    """add_done_callback takes no lock: callbacks added while the future settles must each run
    once, none twice and none never, and a future nobody waits on must not get a condition."""
    rng = random.Random(seed)
    for _ in range(200):
        f: AppendFuture[int] = AppendFuture()
        calls: list[int] = []
        start = threading.Barrier(2)

        def adder(f: AppendFuture[int] = f, calls: list[int] = calls, start: threading.Barrier = start) -> None:
            start.wait()
            for k in range(40):
                f.add_done_callback(lambda x, k=k: calls.append(k))

        t = threading.Thread(target=adder)
        t.start()
        start.wait()
        for _ in range(rng.randrange(200)):
            pass
        f.set_result(1)
        t.join(10)
        assert sorted(calls) == list(range(40)), f"callbacks ran {sorted(calls)}"
        assert "_lazy_condition" not in f.__dict__


def test_a_failing_callback_is_logged_and_the_next_still_runs(caplog):
    f: AppendFuture[int] = AppendFuture()
    seen: list[int] = []
    f.add_done_callback(lambda x: 1 / 0)
    f.add_done_callback(lambda x: seen.append(x.result()))
    f.set_result(3)
    assert seen == [3]
    assert "exception calling callback" in caplog.text


def test_result_of_a_settled_future_takes_no_lock_and_builds_nothing():
    """A pipelined writer reads every future's result; on a settled one that must cost what
    done() costs, not a Condition per future."""
    ok: AppendFuture[int] = AppendFuture()
    ok.set_result(3)
    bad: AppendFuture[int] = AppendFuture()
    err = KeyError("gone")
    bad.set_exception(err)
    for _ in range(3):
        assert ok.result() == 3 and ok.exception() is None
        with pytest.raises(KeyError) as caught:
            bad.result()
        assert caught.value is err and bad.exception() is err
    assert set(vars(ok)) == set(vars(bad)) == {"_state", "_result", "_exception"}


def test_the_stock_future_internals_it_relies_on_are_still_there():
    """The assumptions named in ledger_client/futures.py, checked against the pinned Python:
    wait/as_completed/wrap_future drive a Future through these private names."""
    import asyncio
    import inspect
    from concurrent.futures import _base

    stock: futures.Future[int] = futures.Future()
    assert {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"} <= set(vars(stock))
    assert (_base.RUNNING, _base.FINISHED) == ("RUNNING", "FINISHED")
    for fn in (_base.wait, _base.as_completed, _base._AcquireFutures.__enter__):
        src = inspect.getsource(fn)
        assert "_condition" in src or "_waiters" in src or "_state" in src, fn
    f: AppendFuture[int] = AppendFuture()

    async def main() -> int:
        wrapped = asyncio.wrap_future(f)
        asyncio.get_running_loop().call_soon(f.set_result, 11)
        return await wrapped

    assert asyncio.run(main()) == 11


@pytest.mark.parametrize("how", ["result", "wait", "as_completed", "callback"])
def test_without_the_gil_every_future_takes_the_locked_path(how, seed, monkeypatch):
    """On a free-threaded build (_LOCK_FREE false) the same races still never lose a wake-up."""
    import ledger_client.futures as module

    monkeypatch.setattr(module, "_LOCK_FREE", False)
    rng = random.Random(seed)
    for _ in range(100):
        f: AppendFuture[int] = AppendFuture()
        got: list[int] = []
        start = threading.Barrier(2)
        t = threading.Thread(target=_wait, args=(how, f, got, start, rng.randrange(2000)))
        t.start()
        start.wait()
        f.set_result(5)
        t.join(10)
        assert got == [5] and f.result() == 5 and "_lazy_condition" in vars(f)
