"""The contract of the node layer (``store.nodes``, :mod:`metadata.nodes`), the one thing the two
backends implement each: the stores above are written once on it, so it is what keeps the twin
and ZooKeeper alike. Every test runs on a real ZooKeeper and on the in-memory twin."""

from __future__ import annotations

import threading

import pytest
from contract_helpers import Backend, wait_until

from metadata import (
    BadVersionError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    StoreClosedError,
)
from metadata.errors import NotEmptyError
from metadata.nodes import MultiOpFailed, Op


class Wakes:
    """A wake that records the paths of its events (thread-safe) and lets a test wait for one."""

    def __init__(self) -> None:
        self.paths: list[str | None] = []
        self._cond = threading.Condition()

    def __call__(self, event: object) -> None:
        with self._cond:
            self.paths.append(getattr(event, "path", None))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[str | None]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.paths) >= count, timeout_s), self.paths
            return list(self.paths)


@pytest.fixture
def base(store: MetadataStore) -> str:
    """An empty persistent node of the test's own."""
    path = f"{store.paths.root}/node-test"
    store.nodes.create(path)
    return path


def test_create_get_set_delete_with_versions(store: MetadataStore, base: str) -> None:
    nodes = store.nodes
    assert nodes.create(f"{base}/a", b"x") == f"{base}/a"
    assert nodes.get(f"{base}/a") == (b"x", 0, None)
    with pytest.raises(NodeExistsError):
        nodes.create(f"{base}/a", b"again")
    assert nodes.set(f"{base}/a", b"y", 0) == 1
    with pytest.raises(BadVersionError):
        nodes.set(f"{base}/a", b"lost", 0)
    assert nodes.set(f"{base}/a", b"z") == 2  # -1: any version
    assert nodes.get_many([f"{base}/a", f"{base}/none"]) == [(b"z", 2, None), None]
    with pytest.raises(NoNodeError):
        nodes.set(f"{base}/none", b"")
    with pytest.raises(NoNodeError):
        nodes.create(f"{base}/none/child")
    assert nodes.create(f"{base}/deep/er/child", b"c", makepath=True) == f"{base}/deep/er/child"
    assert nodes.children(f"{base}/deep") == ["er"] and nodes.get(f"{base}/deep/er") == (b"", 0, None)
    with pytest.raises(NotEmptyError):
        nodes.delete(f"{base}/deep/er")
    with pytest.raises(BadVersionError):
        nodes.delete(f"{base}/a", 1)
    nodes.delete(f"{base}/a", 2)
    with pytest.raises(NoNodeError):
        nodes.delete(f"{base}/a")
    assert sorted(nodes.children(base) or []) == ["deep"] and nodes.children(f"{base}/none") is None
    assert nodes.children_many([base, f"{base}/none"]) == [["deep"], None]


def test_ephemeral_and_sequential_nodes(backend: Backend, store: MetadataStore, base: str) -> None:
    nodes = store.nodes
    other = backend.make()
    first = nodes.create(f"{base}/seq-", b"1", ephemeral=True, sequential=True, retry=False)
    second = other.nodes.create(f"{base}/seq-", b"2", ephemeral=True, sequential=True, retry=False)
    assert first.startswith(f"{base}/seq-") and len(first) == len(f"{base}/seq-") + 10
    assert int(second.rsplit("-", 1)[1]) > int(first.rsplit("-", 1)[1])
    assert nodes.get(first) == (b"1", 0, nodes.session()) and nodes.get(second) == (b"2", 0, other.nodes.session())
    assert nodes.session() != other.nodes.session() and nodes.live_session() == nodes.session()
    other.close()
    assert nodes.get(second) is None and nodes.get(first) is not None  # ephemerals go with their session


def test_take_sequence_hands_out_increasing_numbers(backend: Backend, store: MetadataStore, base: str) -> None:
    other = backend.make()
    numbers = [s.nodes.take_sequence(f"{base}/ID-") for _ in range(5) for s in (store, other)]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    wait_until(lambda: store.nodes.children(base) == [], 10, "nothing left behind (deletes are not awaited)")
    with pytest.raises(NoNodeError):
        store.nodes.take_sequence(f"{base}/none/ID-")


def test_children_versioned_grow_with_children(store: MetadataStore, base: str) -> None:
    nodes = store.nodes
    [(names, v0)] = nodes.children_versioned([base])  # type: ignore[misc]
    nodes.create(f"{base}/a")
    nodes.set(f"{base}/a", b"data")  # a child's data is not a change of the listing
    [(names, v1)] = nodes.children_versioned([base])  # type: ignore[misc]
    nodes.delete(f"{base}/a")
    [(later, v2)] = nodes.children_versioned([base])  # type: ignore[misc]
    assert names == ["a"] and later == [] and v0 < v1 < v2
    assert nodes.children_versioned([f"{base}/none"]) == [None]


def test_a_multi_applies_all_of_a_group_or_none_of_it(store: MetadataStore, base: str) -> None:
    """The primitive under marking and unmarking and every stream change: groups go together,
    each atomic, and a failed one says which op failed and why."""
    nodes = store.nodes
    lock = f"{base}/lock"
    outcomes = nodes.multi([
        [Op("create", f"{base}/a"), Op("create", f"{base}/a/b", b"x")],           # parent first: fine
        [Op("create", f"{base}/c"), Op("create", f"{base}/nope/b")],                # 2nd fails: no /c either
        [Op("create", lock, ephemeral=True), Op("delete", f"{base}/a/b", version=7)],  # bad version: no lock
        [Op("create", f"{base}/a/d"), Op("delete", f"{base}/a")],                    # not empty
        [Op("check", f"{base}/a", version=0), Op("set", f"{base}/a/b", b"y", version=0)],
    ], retry=True)
    assert outcomes[0] is None and outcomes[4] is None
    failures = [(o.index, type(o.cause)) for o in outcomes[1:4] if isinstance(o, MultiOpFailed)]
    assert failures == [(1, NoNodeError), (1, BadVersionError), (1, NotEmptyError)]
    assert nodes.children_many([base, f"{base}/a"]) == [["a"], ["b"]]
    assert nodes.get_many([lock, f"{base}/a/b"]) == [None, (b"y", 1, None)]
    outcome = nodes.multi([[Op("set", f"{base}/a/b", b"z", version=1), Op("set", f"{base}/a/b", b"w", version=2),
                            Op("delete", f"{base}/a/b", version=3), Op("delete", f"{base}/a")]], retry=False)
    assert outcome == [None]  # versions move within the multi, a parent goes after its child
    assert nodes.children(base) == []
    failed = nodes.multi([[Op("create", f"{base}/e"), Op("create", f"{base}/e")]], retry=False)[0]
    assert failed is not None and failed.index == 1 and isinstance(failed.cause, NodeExistsError)
    with pytest.raises(ValueError):
        nodes.multi([[Op("get", f"{base}/a")]], retry=True)


def test_a_pipeline_answers_each_op_in_order(store: MetadataStore, base: str) -> None:
    nodes = store.nodes
    nodes.create(f"{base}/full")
    nodes.create(f"{base}/full/child")
    got = nodes.pipeline([Op("create", f"{base}/a", b"x", ephemeral=True), Op("get", f"{base}/a"),
                          Op("create", f"{base}/a"), Op("delete", f"{base}/none"), Op("get", f"{base}/none"),
                          Op("delete", f"{base}/full"), Op("delete", f"{base}/a", version=5),
                          Op("delete", f"{base}/a", version=0)], retry=True)
    assert got[0] == f"{base}/a" and got[1] == (b"x", 0, nodes.session()) and got[4] is None and got[7] is None
    assert [type(g) for g in (got[2], got[3], got[5], got[6])] == [NodeExistsError, NoNodeError, NotEmptyError,
                                                                   BadVersionError]


def test_a_data_watch_fires_once_on_the_next_change(backend: Backend, store: MetadataStore, base: str) -> None:
    nodes, other = store.nodes, backend.make().nodes
    path = f"{base}/w"
    wakes = Wakes()
    assert nodes.watch(path, wakes) is None  # absent: fires when created
    other.create(path, b"1")
    assert wakes.wait_for(1) == [path]
    assert nodes.watch(path, wakes) == (b"1", 0, None)
    assert nodes.watch(path, wakes) == (b"1", 0, None)  # the same wake again: still one registration
    other.set(path, b"2")
    other.set(path, b"3")  # one-shot: fired once, not again until re-armed
    assert wakes.wait_for(2) == [path, path]
    nodes.watch(path, wakes)
    other.delete(path)
    assert wakes.wait_for(3) == [path] * 3
    quiet = Wakes()
    assert nodes.watch(path, quiet, absent=False) is None  # absent, and nothing armed
    other.create(path)
    other.delete(path)
    assert wakes.wait_for(3) == [path] * 3 and quiet.paths == []


def test_a_child_watch_fires_on_children_and_on_the_node(backend: Backend, store: MetadataStore, base: str) -> None:
    nodes, other = store.nodes, backend.make().nodes
    wakes = Wakes()
    assert nodes.children_many([base, f"{base}/later"], watch=wakes) == [[], None]
    other.create(f"{base}/later")  # a child of base, and the absent node itself
    assert sorted(str(p) for p in wakes.wait_for(2)) == sorted([base, f"{base}/later"])
    nodes.children_many([f"{base}/later"], watch=wakes)
    other.set(f"{base}/later", b"data")  # data is not a child change: nothing fires
    other.create(f"{base}/later/kid")
    assert wakes.wait_for(3)[2] == f"{base}/later"


def test_a_closed_session_refuses_every_call(backend: Backend) -> None:
    s = backend.make()
    nodes = s.nodes
    s.close()
    assert nodes.closed
    for call in (lambda: nodes.get("/x"), lambda: nodes.children("/x"), lambda: nodes.create("/x"),
                 lambda: nodes.set("/x", b""), lambda: nodes.delete("/x"), lambda: nodes.ensure_live("look"),
                 lambda: nodes.multi([[Op("create", "/x")]], retry=True)):
        with pytest.raises(StoreClosedError):
            call()
