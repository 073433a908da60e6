"""A client's start-up and first ledger cost a bounded number of metadata round trips, whatever
the cluster holds (issue 33): it neither lists the ledgers nor reads the bookies one by one."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from ledger_client import LedgerClient
from metadata import InMemoryMetadataStore
from metadata.memory import InMemoryZooKeeper

pytestmark = pytest.mark.unit

READS = ("get", "get_many", "children", "children_many", "exists", "pipeline")


def _cluster(name: str, bookies: int, ledgers: int) -> InMemoryMetadataStore:
    """The cluster's metadata; the returned session holds the bookies' registrations."""
    seed = InMemoryMetadataStore(InMemoryZooKeeper.named(name))
    seed.cluster.init_cluster()
    for i in range(bookies):
        bid = f"10.0.{i // 200}.{i % 200 + 1}:3181"
        seed.cluster.register_bookie(bid, readonly=False, wait_ms_max=0,
                                     data=json.dumps({"id": bid, "network_location": f"/rack-{i % 3}"}).encode())
    for lid in range(1, ledgers + 1):
        seed.ledgers.create_ledger_node(lid * 7, b"")
    return seed


def _round_trips(name: str) -> int:
    """Metadata requests of: a new client, its first ledger created and closed, the client closed."""
    store = InMemoryMetadataStore(InMemoryZooKeeper.named(name))
    calls = {"n": 0}
    for op in READS:
        real: Callable[..., object] | None = getattr(store.nodes, op, None)
        if real is None:
            continue

        def counted(*args: object, _real: Callable[..., object] = real, **kwargs: object) -> object:
            calls["n"] += 1
            return _real(*args, **kwargs)

        setattr(store.nodes, op, counted)
    with LedgerClient(metadata_store=store) as c:
        c.registry.wait_for(lambda w: len(w) >= 3, timeout_s=10)
        c.create_ledger().close()
    store.close()
    return calls["n"]


def test_start_up_reads_do_not_grow_with_bookies_or_ledgers() -> None:
    seeds = [_cluster("startup-small", bookies=3, ledgers=0), _cluster("startup-large", bookies=60, ledgers=3_000)]
    small, large = _round_trips("startup-small"), _round_trips("startup-large")
    for seed in seeds:
        seed.close()
    print(f"metadata reads: {small} (3 bookies, no ledgers), {large} (60 bookies, 3,000 ledgers)")
    assert large <= small + 2, f"{large} reads on a large cluster against {small} on a small one"
