"""A reader's batched commits (stream/commits.py, DESIGN §4.11): at most one write per
``commit_interval_ms`` unless asked to sync, the highest position only, forward only, the last one
written on close, a deleted subscription failing every later commit. The store write is replaced
by a recorder: what is under test is the batching, not ZooKeeper (tests/integration covers that)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from ledger_client import errors
from ledger_client.stream import commits
from ledger_client.stream.commits import Committer

pytestmark = pytest.mark.unit

NS = SimpleNamespace(name="ns")   # the namespace is only named in log lines here
FAR = (10**9, 0, 0)   # the reader's position: every commit below it (no check against the stream's end)


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[float, tuple[int, int, int]]] = []
        self.fail: BaseException | None = None
        self.lock = threading.Lock()

    def __call__(self, ns, stream, name, pos, *, create, view=None) -> None:
        assert not create
        if self.fail is not None:
            raise self.fail
        with self.lock:
            self.writes.append((time.monotonic(), pos))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    r = Recorder()
    monkeypatch.setattr(commits, "commit_position", r)
    return r


def test_at_most_one_write_per_interval_and_only_the_highest(recorder):
    c = Committer(NS, "s", "sub", (1, 0, -1), 50)
    deadline = time.monotonic() + 0.3
    i = 0
    while time.monotonic() < deadline:
        c.commit((1, i, 0), FAR)
        c.commit((1, max(0, i - 5), 0), FAR)     # lower ones: ignored
        i += 1
    starts = [t for t, _p in list(recorder.writes)]
    c.close()                                   # writes the last one, at once
    assert all(b - a >= 0.05 for a, b in zip(starts, starts[1:], strict=False)), starts
    assert len(recorder.writes) <= 0.3 / 0.05 + 2
    positions = [p for _t, p in recorder.writes]
    assert positions == sorted(positions) and positions[-1] == (1, i - 1, 0) and c.committed == (1, i - 1, 0)


def test_sync_writes_now_and_futures_complete_when_written(recorder):
    c = Committer(NS, "s", "sub", (1, 0, -1), 60_000)
    fut = c.commit((1, 3, 0), FAR)
    assert not fut.done() and recorder.writes == []          # waits for the interval (a minute here)
    c.commit((1, 4, 0), FAR, sync=True)
    assert fut.done() and [p for _t, p in recorder.writes] == [(1, 4, 0)]
    assert c.commit((1, 2, 0), FAR).done()                    # lower than written: done at once, no write
    c.close()
    assert len(recorder.writes) == 1


def test_a_deleted_subscription_fails_its_commits_and_a_passing_failure_is_retried(recorder):
    c = Committer(NS, "s", "sub", (1, 0, -1), 0)
    recorder.fail = errors.MetadataServiceError("ZooKeeper unavailable")
    fut = c.commit((1, 1, 0), FAR)
    with pytest.raises(errors.MetadataServiceError):
        c.flush()
    recorder.fail = None
    c.flush()                                    # kept pending: written now, its future done
    assert fut.result(5) is None and [p for _t, p in recorder.writes] == [(1, 1, 0)]
    recorder.fail = errors.NoSuchSubscriptionError("gone")
    fut = c.commit((1, 2, 0), FAR)
    with pytest.raises(errors.NoSuchSubscriptionError):
        fut.result(5)
    with pytest.raises(errors.NoSuchSubscriptionError):
        c.commit((1, 3, 0), FAR)
    c.close()                                    # quiet


def test_bad_interval():
    with pytest.raises(errors.IncorrectParameterError):
        Committer(NS, "s", "sub", (1, 0, -1), -1)
