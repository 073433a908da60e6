"""Group commit: concurrent requests share a batch, each gets its own outcome."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from metadata.errors import MetadataUnavailableError, NodeExistsError
from metadata.group_commit import GroupCommit

pytestmark = pytest.mark.unit


def test_concurrent_callers_share_batches_and_get_their_own_answers() -> None:
    batches: list[list[int]] = []
    gate = threading.Event()

    def serve(items: list[int]) -> list[int | BaseException]:
        batches.append(items)
        gate.wait(5)   # the first batch is slow: everyone else queues behind it
        return [NodeExistsError(f"{i} exists") if i % 7 == 0 else i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(serve, batch_max=64)

    def call(i: int) -> int | str:
        try:
            return gc.submit(i)
        except NodeExistsError as e:
            return str(e)

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(call, i) for i in range(1, 101)]
        threading.Timer(0.2, gate.set).start()
        got = [f.result(10) for f in futures]
    assert got == [f"{i} exists" if i % 7 == 0 else i * 10 for i in range(1, 101)]
    assert sorted(i for b in batches for i in b) == list(range(1, 101))
    assert len(batches) < 100 and max(len(b) for b in batches) > 1 and all(len(b) <= 64 for b in batches)


def test_a_failing_batch_fails_each_of_its_callers_and_the_next_batch_runs() -> None:
    calls = {"n": 0}

    def serve(items: list[int]) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise MetadataUnavailableError("ZooKeeper is away")
        return items

    gc: GroupCommit[int, int] = GroupCommit(serve)
    with pytest.raises(MetadataUnavailableError):
        gc.submit(1)
    assert gc.submit(2) == 2
