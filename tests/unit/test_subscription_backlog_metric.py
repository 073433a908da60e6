"""The auditor's subscription backlog gauges (recovery/subscription_backlog.py, recovery/metrics.py)
over a fake client: one read per stream per pass, the figures replaced at the end of a pass, a
stream whose read fails keeping its previous figures, deleted streams and namespaces dropped, the
series bound, and the scrape reading nothing but the last pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from ledger_client import errors
from recovery.metrics import autorecovery_registry
from recovery.subscription_backlog import SubscriptionBacklog
from recovery.worker import WorkerStats

pytestmark = pytest.mark.unit


class FakeNamespace:
    def __init__(self, name: str, streams: dict[str, dict[str, tuple[int, int]]], reads: list[str]) -> None:
        self.name, self.streams, self.reads = name, streams, reads
        self.failing: set[str] = set()

    def list_streams(self) -> list[str]:
        return sorted(self.streams)

    def subscriptions(self, stream: str) -> dict[str, SimpleNamespace]:
        self.reads.append(f"{self.name}/{stream}")
        if stream in self.failing:
            raise errors.BookieUnavailableError("no bookie answered")
        if stream not in self.streams:
            raise errors.NoSuchStreamError(stream)
        return {n: SimpleNamespace(backlog_records=r, backlog_bytes=b) for n, (r, b) in self.streams[stream].items()}


class FakeClient:
    def __init__(self, spaces: dict[str, dict[str, dict[str, tuple[int, int]]]]) -> None:
        self.reads: list[str] = []
        self.spaces = {n: FakeNamespace(n, s, self.reads) for n, s in spaces.items()}

    def list_namespaces(self) -> list[str]:
        return sorted(self.spaces)

    def namespace(self, name: str) -> FakeNamespace:
        if name not in self.spaces:
            raise errors.NoSuchNamespaceError(name)
        return self.spaces[name]


def test_a_pass_reads_each_stream_once_and_replaces_the_figures():
    client = FakeClient({"pay": {"orders": {"billing": (10, 1_000), "audit": (0, 0)}, "refunds": {}},
                         "misc": {"log": {"etl": (3, 300)}}})
    b = SubscriptionBacklog(client, 60_000)  # type: ignore[arg-type]
    assert b.snapshot() == {}
    b.refresh()
    assert sorted(client.reads) == ["misc/log", "pay/orders", "pay/refunds"]
    assert b.snapshot() == {("pay/orders", "billing"): (10, 1_000), ("pay/orders", "audit"): (0, 0),
                            ("misc/log", "etl"): (3, 300)}
    # A failing read keeps that stream's last figures; a deleted subscription, stream or
    # namespace disappears with the next pass.
    client.spaces["pay"].failing.add("orders")
    client.spaces["pay"].streams["orders"]["billing"] = (99, 9_900)
    del client.spaces["misc"]
    client.spaces["pay"].streams["refunds"]["new"] = (1, 100)
    b.refresh()
    assert b.snapshot() == {("pay/orders", "billing"): (10, 1_000), ("pay/orders", "audit"): (0, 0),
                            ("pay/refunds", "new"): (1, 100)}
    assert b.errors == 1 and b.passes == 2
    client.spaces["pay"].failing.clear()
    b.refresh()
    assert b.snapshot()[("pay/orders", "billing")] == (99, 9_900)


def test_the_series_are_bounded():
    client = FakeClient({"pay": {f"s{i}": {f"sub{j}": (i, j) for j in range(4)} for i in range(5)}})
    b = SubscriptionBacklog(client, 60_000, series_max=10)  # type: ignore[arg-type]
    b.refresh()
    got = b.snapshot()
    assert len(got) == 10 and all(k[0] in ("pay/s0", "pay/s1", "pay/s2") for k in got)


def test_the_gauges_show_the_last_pass_and_read_nothing_at_scrape():
    client = FakeClient({"pay": {"orders": {"billing": (10, 1_000)}}})
    b = SubscriptionBacklog(client, 60_000)  # type: ignore[arg-type]
    b.refresh()
    ar = SimpleNamespace(worker=SimpleNamespace(stats=WorkerStats()), elections_won=1, is_auditor=True,
                         auditor_stats=None, store=None, subscription_backlogs=b.snapshot())
    registry: CollectorRegistry = autorecovery_registry(ar)  # type: ignore[arg-type]
    before = len(client.reads)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in registry.collect() for s in f.samples
           if s.name.startswith("stream_subscription_backlog")}
    assert len(client.reads) == before
    labels = (("stream", "pay/orders"), ("subscription", "billing"))
    assert got == {("stream_subscription_backlog_records", labels): 10.0,
                   ("stream_subscription_backlog_bytes", labels): 1_000.0}
