"""What a bookie's GC round asks of the metadata store: in proportion to the ledgers the bookie
holds and to what changed, never to every ledger of the cluster (issue 33). An in-process bookie
on the in-memory twin, whose node layer counts the requests and the nodes they return."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from memory_bookie import started_bookie

from metadata import InMemoryMetadataStore, InMemoryZooKeeper
from metadata.errors import MetadataAccessDeniedError, NoNodeError
from metadata.layout import DELETED
from metadata.model import TOMBSTONE
from spark_bookie.server.bookie import Bookie

pytestmark = pytest.mark.unit

OTHERS = 5000


@dataclass
class Count:
    requests: int = 0
    nodes: int = 0   # nodes read or stat'ed, and names listed

    def take(self) -> tuple[int, int]:
        got = (self.requests, self.nodes)
        self.requests = self.nodes = 0
        return got


def _size(outcome: Any) -> int:
    if outcome is None or isinstance(outcome, Exception):
        return 0
    if isinstance(outcome, tuple) and outcome and isinstance(outcome[0], list):
        return len(outcome[0])   # children_versioned: (names, cversion)
    return len(outcome) if isinstance(outcome, list) else 1


def count_requests(store: InMemoryMetadataStore) -> Count:
    """Wrap the session's node layer: every read method counts its paths and what came back."""
    count = Count()
    nodes = store.nodes
    for name in ("get_many", "children_many", "children_versioned", "stat_many", "pipeline"):
        inner = getattr(nodes, name, None)
        if inner is None:
            continue

        def counted(paths: list[Any], *args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            out = _inner(paths, *args, **kwargs)
            count.requests += len(paths)
            count.nodes += sum(_size(o) for o in out)
            return out

        setattr(nodes, name, counted)
    return count


def create_others(store: InMemoryMetadataStore, ids: range | list[int]) -> None:
    for lid in ids:
        store.ledgers.create_ledger_node(lid, b"m")


def spread_ids(n: int, base: int = 10_000_000) -> list[int]:
    """One ledger in each of ``n`` leaf buckets (a bucket holds ids of one 10,000)."""
    return [base + k * 10_000 + 5 for k in range(n)]


@pytest.fixture
def zk() -> InMemoryZooKeeper:
    return InMemoryZooKeeper()


@pytest.fixture
def store(zk: InMemoryZooKeeper) -> Iterator[InMemoryMetadataStore]:
    with InMemoryMetadataStore(zk) as s:
        s.cluster.init_cluster()
        yield s


@pytest.fixture
def bookie(store: InMemoryMetadataStore, tmp_path: Path) -> Iterator[Bookie]:
    """A started bookie whose GC thread sleeps: the test runs its rounds (``_gc_round``)."""
    with started_bookie(store, tmp_path) as b:
        yield b


def hold(bookie: Bookie, *ids: int) -> None:
    for lid in ids:
        bookie.storage.set_master_key(lid, b"k")
        bookie.storage.add_entry(lid, 0, f"entry of {lid}".encode())


def gc_round(bookie: Bookie, count: Count) -> tuple[int, int]:
    count.take()
    bookie._gc_round()
    return count.take()


def test_a_round_costs_the_same_whatever_else_the_cluster_holds(store: InMemoryMetadataStore,
                                                                bookie: Bookie) -> None:
    mine = 1_234
    create_others(store, [mine])
    hold(bookie, mine)
    create_others(store, range(2_000, 2_000 + OTHERS // 2))   # the bucket of ours...
    create_others(store, spread_ids(OTHERS // 2))              # ...and 2,500 buckets not ours
    count = count_requests(store)
    first = gc_round(bookie, count)   # full check: list the markers, stat our bucket, read our ledger
    assert first[0] <= 3 and first[1] <= 3, first
    assert gc_round(bookie, count) == (2, 1)   # nothing changed: the markers' listing and one stat
    create_others(store, spread_ids(OTHERS, base=100_000_000))   # thousands more, none near ours
    assert gc_round(bookie, count) == (2, 1)
    create_others(store, [1_235])   # our bucket changed: our one ledger is read again
    assert gc_round(bookie, count) == (3, 2)
    assert bookie.storage.ledger_ids() == [mine]


def test_an_unchanged_round_costs_a_request_per_bucket(store: InMemoryMetadataStore, bookie: Bookie) -> None:
    mine = [b * 10_000 + i for b in (1, 2, 3) for i in range(0, 1000, 10)]   # 300 in 3 buckets
    create_others(store, mine)
    hold(bookie, *mine)
    create_others(store, spread_ids(OTHERS))
    count = count_requests(store)
    requests, nodes = gc_round(bookie, count)
    assert requests <= 1 + 3 + len(mine) and nodes <= 3 + len(mine)   # full check: ours only
    assert gc_round(bookie, count) == (1 + 3, 3)
    presence = bookie._gc_presence   # what it keeps between rounds: our buckets and ledgers only
    assert len(presence.buckets) == 3 and sum(len(ids) for _, ids in presence.buckets.values()) == len(mine)


def test_deleted_and_tombstoned_ledgers_go_live_ones_stay(store: InMemoryMetadataStore, bookie: Bookie) -> None:
    mine = list(range(1, 41)) + [20_001, 20_002, 30_001]
    create_others(store, mine)
    create_others(store, range(20_100, 20_300))   # so only 2 of the bucket's 202 are ours
    hold(bookie, *mine)
    count = count_requests(store)
    gc_round(bookie, count)
    assert bookie.storage.ledger_ids() == mine
    store.ledgers.delete_ledger_node(5)                      # a dense bucket: listed
    store.ledgers.delete_ledger_node(20_002)                 # a sparse one: our 2 are read
    assert gc_round(bookie, count) == (1 + 3 + 1 + 2, 3 + 39 + 1)   # markers, stats, a listing, reads
    store.ledgers.write_ledger_node(30_001, TOMBSTONE, 0)    # a role's delete: tombstone and marker
    store.nodes.create(f"{store.paths.root}/{DELETED}/30001", makepath=True)
    gc_round(bookie, count)   # the reap deletes the node: its bucket changed
    assert bookie.storage.ledger_ids() == sorted(set(mine) - {5, 20_002, 30_001})
    assert store.ledgers.read_ledger_node(30_001) is None and store.nodes.get(store.paths.ledger(30_001)) is None
    store.ledgers.write_ledger_node(6, TOMBSTONE, 0)   # no marker (its writer died): seen by the next full check
    gc_round(bookie, count)
    assert 6 in bookie.storage.ledger_ids()
    store.expire_session()
    gc_round(bookie, count)
    assert 6 not in bookie.storage.ledger_ids() and 7 in bookie.storage.ledger_ids()


def test_a_tombstone_without_marker_goes_at_the_hourly_full_check(store: InMemoryMetadataStore, bookie: Bookie,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    create_others(store, [1, 2])
    hold(bookie, 1, 2)
    count = count_requests(store)
    gc_round(bookie, count)
    store.ledgers.write_ledger_node(1, TOMBSTONE, 0)   # its role's client died before the marker
    gc_round(bookie, count)
    assert bookie.storage.ledger_ids() == [1, 2]       # the stamps cannot see it
    monkeypatch.setattr(bookie, "_gc_full_check_at", 0.0)   # an hour later
    gc_round(bookie, count)
    assert bookie.storage.ledger_ids() == [2]


def test_nothing_is_deleted_while_the_store_is_unreachable(zk: InMemoryZooKeeper, store: InMemoryMetadataStore,
                                                           bookie: Bookie) -> None:
    create_others(store, [1, 2])
    hold(bookie, 1, 2)
    count = count_requests(store)
    gc_round(bookie, count)
    store.ledgers.delete_ledger_node(2)
    zk.set_available(False)
    gc_round(bookie, count)
    assert bookie.storage.ledger_ids() == [1, 2]
    zk.set_available(True)
    gc_round(bookie, count)
    assert bookie.storage.ledger_ids() == [1]


def test_a_retried_role_delete_leaves_the_marker(store: InMemoryMetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A role's delete whose marker could not be created is retried: the retry (which finds the
    tombstone) leaves the marker, so a bookie reaps the node and every GC sees its bucket change."""
    store.ledgers.create_ledger_node(9, b"m")
    nodes = store.nodes
    real_create = nodes.create

    def denied(path: str, version: int = -1, *, retry: bool = True) -> None:
        raise MetadataAccessDeniedError("members may not delete")

    def lost_marker(path: str, *args: Any, **kwargs: Any) -> str:
        if f"/{DELETED}/" in path:
            raise MetadataAccessDeniedError("lost")
        return real_create(path, *args, **kwargs)

    monkeypatch.setattr(nodes, "tenant_acls_active", lambda: True)
    monkeypatch.setattr(nodes, "delete", denied)
    monkeypatch.setattr(nodes, "create", lost_marker)
    with pytest.raises(MetadataAccessDeniedError):
        store.ledgers.delete_ledger_node(9)
    monkeypatch.setattr(nodes, "create", real_create)
    with pytest.raises(NoNodeError):
        store.ledgers.delete_ledger_node(9)   # the retry
    assert nodes.children(f"{store.paths.root}/{DELETED}") == ["9"]
