"""jobs.connect.task_client: the client a Python worker keeps between Spark tasks (one ZooKeeper
session and the bookies' channels per cluster, not per task), dropped when a task fails with it,
at most SHARED_CLIENTS_MAX kept and none idle too long."""

from __future__ import annotations

import pytest

import jobs.connect as jc

pytestmark = pytest.mark.unit


class Client:
    """Stands for a LedgerClient: what the cache looks at (closed) and does (close)."""

    made: list[Client] = []

    def __init__(self, zk: str) -> None:
        self.zk, self.closed = zk, False
        Client.made.append(self)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def fake_connect(monkeypatch):
    Client.made.clear()
    monkeypatch.setattr(jc, "connect", lambda zk, conf, **kw: Client(zk))
    monkeypatch.setattr(jc, "_shared", type(jc._shared)())
    yield


def test_tasks_reuse_one_client_per_cluster_and_a_failed_task_drops_it():
    with jc.task_client("a", None) as c1:
        pass
    with jc.task_client("a", None) as c2:
        assert c2 is c1
        with jc.task_client("a", None) as other:   # a second user at the same time gets its own
            assert other is not c1
        assert not other.closed                      # kept, until c2 comes back: one stays, one closes
    assert [c.closed for c in (c2, other)] == [False, True]
    with pytest.raises(RuntimeError), jc.task_client("a", None) as c3:
        raise RuntimeError("the task failed")
    assert c3.closed
    with jc.task_client("a", None) as c4:
        assert c4 is not c3 and not c4.closed


def test_at_most_a_few_clusters_are_kept_and_idle_ones_close(monkeypatch):
    for zk in "abcdef":
        with jc.task_client(zk, None):
            pass
    kept = [c for c in Client.made if not c.closed]
    assert [c.zk for c in kept] == list("cdef") and len(kept) == jc.SHARED_CLIENTS_MAX
    clock = [1e9]
    monkeypatch.setattr(jc.time, "monotonic", lambda: clock[0])
    with jc.task_client("f", None):
        pass
    clock[0] += jc.SHARED_IDLE_S + 1
    with jc.task_client("g", None):
        pass
    assert [c.zk for c in Client.made if not c.closed] == ["g"]
