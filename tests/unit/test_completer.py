"""The in-order completer (ledger_client/completer.py): completions queued under the owner's lock
come out in that order, outside the lock, one delivering thread at a time."""

from __future__ import annotations

import threading
import time

import pytest

from ledger_client.completer import InOrderCompleter

pytestmark = pytest.mark.unit


class Owner:
    """A writer-like owner: queues numbers under its lock, records what it is handed."""

    def __init__(self, slow_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.delivered: list[int] = []
        self.taken_under_lock: list[bool] = []
        self.delivered_under_lock: list[bool] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self.slow_s = slow_s
        self.completer: InOrderCompleter[int, list[int]] = InOrderCompleter(self.lock, self.take, self.deliver)

    def take(self, batch: list[int]) -> list[int]:
        self.taken_under_lock.append(self.lock.locked())
        return [x for x in batch]

    def deliver(self, items: list[int]) -> None:
        self.delivered_under_lock.append(self.lock.locked())
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        if self.slow_s:
            time.sleep(self.slow_s)   # let other threads queue and try to deliver meanwhile
        self.delivered += items
        self.concurrent -= 1

    def complete(self, *items: int) -> None:
        with self.lock:
            self.completer.add(items)
        self.completer.run()


def test_delivered_in_order_taken_under_the_lock_and_handed_over_outside_it():
    o = Owner()
    o.complete(1, 2)
    o.complete(3)
    assert o.delivered == [1, 2, 3]
    assert all(o.taken_under_lock) and not any(o.delivered_under_lock)
    with o.lock:
        assert not o.completer.busy


def test_many_threads_one_order_one_deliverer_at_a_time():
    o = Owner(slow_s=0.0005)
    counter = iter(range(10**9))
    added: list[int] = []

    def producer() -> None:
        for _ in range(200):
            with o.lock:   # the order the owner decided is the order under its lock
                n = next(counter)
                added.append(n)
                o.completer.add([n])
            o.completer.run()

    threads = [threading.Thread(target=producer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert o.delivered == added and len(added) == 1200
    assert o.max_concurrent == 1


def test_a_run_while_another_thread_delivers_leaves_its_items_to_that_thread():
    o = Owner()
    entered, release = threading.Event(), threading.Event()

    def blocking(items: list[int]) -> None:
        if items == [1]:
            entered.set()
            release.wait(5)
        o.delivered += items

    o.completer = InOrderCompleter(o.lock, o.take, blocking)
    first = threading.Thread(target=o.complete, args=(1,))
    first.start()
    assert entered.wait(5)
    o.complete(2)                  # returns at once: thread "first" is delivering
    assert o.delivered == []
    release.set()
    first.join(5)
    assert o.delivered == [1, 2]   # delivered by "first", after what it had


def test_a_delivery_that_completes_more_does_not_recurse_or_deadlock():
    o = Owner()

    def chained(items: list[int]) -> None:
        o.delivered += items
        if items[-1] < 5:          # a future's callback calling the writer again
            o.complete(items[-1] + 1)
        assert len(o.delivered) <= 5

    o.completer = InOrderCompleter(o.lock, o.take, chained)
    o.complete(1)
    assert o.delivered == [1, 2, 3, 4, 5]


def test_idle_is_notified_once_everything_is_delivered():
    o = Owner(slow_s=0.05)
    with o.lock:
        o.completer.add([1, 2])
    t = threading.Thread(target=o.completer.run)
    t.start()
    with o.lock:
        while o.completer.busy:
            assert o.completer.idle.wait(2), "not woken when the queue emptied"
    assert o.delivered == [1, 2]
    t.join(5)


def test_a_failing_delivery_leaves_the_rest_to_the_next_run():
    o = Owner()
    calls = []

    def flaky(items: list[int]) -> None:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("a callback bug")
        o.delivered += items

    o.completer = InOrderCompleter(o.lock, o.take, flaky)
    with pytest.raises(RuntimeError):
        o.complete(1)
    o.complete(2)
    assert calls == [[1], [2]] and o.delivered == [2]
    with o.lock:
        assert not o.completer.busy


def test_claim_under_the_lock_makes_this_thread_the_deliverer():
    o = Owner()
    with o.lock:
        o.completer.add([1])
        taken = o.completer.claim()
        assert taken == [1] and o.completer.busy
        assert o.completer.claim() is None     # one deliverer at a time
    o.complete(2)                              # queued behind the claim: not delivered by this run
    assert o.delivered == []
    o.completer.deliver(taken)                 # the claimed batch, then what came meanwhile
    assert o.delivered == [1, 2]
    with o.lock:
        assert not o.completer.busy and o.completer.claim() is None
