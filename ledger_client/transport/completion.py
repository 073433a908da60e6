"""Waiting on several gRPC futures: yield each as it finishes, without polling.

Quorum reads (LAC, fencing, recovery reads, long polls) ask every bookie at once and act on the
answers in arrival order; done-callbacks feed a queue, so the waiting thread sleeps until an
answer (or the deadline) instead of spinning over `done()`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Mapping
from typing import TypeVar

import grpc

K = TypeVar("K")


def as_completed(futures: Mapping[K, grpc.Future], deadline: float) -> Iterator[tuple[K, grpc.Future]]:
    """(key, future) pairs in completion order, until all finished or `deadline` (monotonic) passed."""
    done: queue.SimpleQueue[tuple[K, grpc.Future]] = queue.SimpleQueue()
    for key, fut in futures.items():
        fut.add_done_callback(lambda f, k=key: done.put((k, f)))
    for _ in range(len(futures)):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            yield done.get(timeout=left)
        except queue.Empty:
            return
