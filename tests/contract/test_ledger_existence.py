"""The contract of the existence checks a bookie's GC makes (``Nodes.stat_many``,
``LedgerStore.missing_ledgers`` with and without a :class:`~metadata.ledgers.LedgerPresence`),
against a real ZooKeeper and the in-memory twin."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from contract_helpers import Backend, wait_until

from metadata import MetadataStore
from metadata.ledgers import LedgerPresence
from metadata.model import TOMBSTONE

EDGE_IDS = [0, 1, 9999, 10_000, 99_999_999, 2**31, 2**62, 2**63 - 1]


def _bucket(store: MetadataStore, lid: int) -> str:
    return store.paths.ledger(lid).rsplit("/", 1)[0]


def test_stat_many(store: MetadataStore) -> None:
    nodes, parent = store.nodes, f"{store.paths.root}/stat-test"
    nodes.create(parent, b"abc")
    fresh, absent = nodes.stat_many([parent, f"{parent}/nope"])
    assert absent is None and fresh is not None
    assert (fresh.version, fresh.cversion, fresh.children) == (0, 0, 0)
    nodes.create(f"{parent}/a")
    nodes.create(f"{parent}/b")
    nodes.set(f"{parent}/a", b"changed")   # a child's data is not a change of the children
    two = nodes.stat_many([parent])[0]
    assert two is not None and (two.version, two.cversion, two.children) == (0, 2, 2)
    nodes.set(parent, b"new")
    nodes.delete(f"{parent}/b")
    one = nodes.stat_many([parent])[0]
    assert one is not None and (one.version, one.cversion, one.children) == (1, 3, 1)
    assert one.children_stamp == (fresh.created, 3) and nodes.stat_many([]) == []
    nodes.delete(f"{parent}/a")
    nodes.delete(parent)
    nodes.create(parent)   # a new node of the same path: a new creation, cversion from 0 again
    again = nodes.stat_many([parent])[0]
    assert again is not None and again.cversion == 0 and again.created != fresh.created


def test_missing_ledgers_reads_only_the_ledgers_asked(store: MetadataStore) -> None:
    for lid in EDGE_IDS:
        store.ledgers.create_ledger_node(lid, b"m")
    store.ledgers.write_ledger_node(2**31, TOMBSTONE, 0)   # a role's delete: counts as gone
    asked = [*EDGE_IDS, 5, 2**40]
    assert store.ledgers.missing_ledgers(asked) == {5, 2**40, 2**31}
    assert store.ledgers.missing_ledgers([]) == set()
    assert store.ledgers.missing_ledgers(EDGE_IDS[:3]) == set()


def test_missing_ledgers_since_checks_what_changed(store: MetadataStore) -> None:
    dense = list(range(0, 1000))   # one bucket, most of it ours: listed when it changes
    sparse = [20_000 + i for i in range(0, 3000, 300)]   # a bucket of 3,000, 10 of them ours: read
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda lid: store.ledgers.create_ledger_node(lid, b"m"), dense + list(range(20_000, 23_000))))
    ours = set(dense[:900]) | set(sparse)
    memo = LedgerPresence()
    assert store.ledgers.missing_ledgers(ours, since=memo) == set() and memo.full
    assert memo.requests == 2 + len(ours)   # a stat per bucket, then every ledger read
    assert store.ledgers.missing_ledgers(ours, since=memo) == set() and not memo.full
    assert memo.requests == 2 and memo.nodes_read == 2   # nothing changed: the two stats
    store.ledgers.delete_ledger_node(7)
    store.ledgers.delete_ledger_node(sparse[3])
    store.ledgers.create_ledger_node(50_000, b"m")   # a new bucket, not ours: never looked at
    assert store.ledgers.missing_ledgers(ours, since=memo) == {7, sparse[3]}
    assert memo.requests == 2 + 1 + len(sparse) and not memo.full   # dense listed once, sparse read
    ours -= {7, sparse[3]}
    assert store.ledgers.missing_ledgers(ours | {950}, since=memo) == set()
    assert memo.requests == 3   # a ledger new to us in an unchanged bucket is read, alone
    store.ledgers.write_ledger_node(20_300, TOMBSTONE, 0)   # a tombstone, then its reaping
    store.nodes.create(f"{store.paths.root}/deleted/20300", makepath=True)
    assert store.ledgers.reap_deleted() == 1
    assert store.ledgers.missing_ledgers(ours, since=memo) == {20_300}


def test_missing_ledgers_since_starts_over_in_a_new_session(backend: Backend, store: MetadataStore) -> None:
    ours = {1, 2, 10_001}
    for lid in ours:
        store.ledgers.create_ledger_node(lid, b"m")
    memo = LedgerPresence()
    assert store.ledgers.missing_ledgers(ours, since=memo) == set()
    store.ledgers.write_ledger_node(2, TOMBSTONE, 0)   # no marker, so never reaped: no bucket change
    assert store.ledgers.missing_ledgers(ours, since=memo) == set() and not memo.full
    before = store.nodes.session()
    backend.expire(store)
    wait_until(lambda: store.nodes.session() not in (None, before), what="a new session")
    assert store.ledgers.missing_ledgers(ours, since=memo) == {2} and memo.full
    store.ledgers.delete_ledger_node(10_001)
    assert store.ledgers.missing_ledgers(ours - {2}, since=memo) == {10_001}
    assert store.ledgers.missing_ledgers({1}, since=memo) == set() and memo.buckets.keys() == {_bucket(store, 1)}
