"""Znode paths and connect strings: BookKeeper's exact names, both directions, and strict parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadata.errors import InvalidConnectStringError
from metadata.layout import (
    LAYOUT_TEXT,
    MAX_LEDGER_ID,
    ConnectInfo,
    ZkLayout,
    is_bucket_name,
    ledger_id_from_components,
    ledger_path_components,
    parse_connect_string,
)

pytestmark = pytest.mark.unit

L = ZkLayout()


@pytest.mark.parametrize(
    ("ledger_id", "path"),
    [
        (0, "/ledgers/000/0000/0000/0000/L0000"),
        (1, "/ledgers/000/0000/0000/0000/L0001"),
        (9999, "/ledgers/000/0000/0000/0000/L9999"),
        (10_000, "/ledgers/000/0000/0000/0001/L0000"),
        (2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
        (1234567890123456789, "/ledgers/123/4567/8901/2345/L6789"),
        (MAX_LEDGER_ID, "/ledgers/922/3372/0368/5477/L5807"),
    ],
)
def test_ledger_path_matches_bookkeeper(ledger_id: int, path: str) -> None:
    assert L.ledger(ledger_id) == path
    assert L.ledger_id(path) == ledger_id


def test_ledger_path_under_a_custom_root() -> None:
    layout = ZkLayout("/a/b")
    assert layout.ledger(2) == "/a/b/000/0000/0000/0000/L0002"
    assert layout.ledger_id("/a/b/000/0000/0000/0000/L0002") == 2
    with pytest.raises(ValueError):
        layout.ledger_id("/ledgers/000/0000/0000/0000/L0002")


@given(st.integers(min_value=0, max_value=MAX_LEDGER_ID))
def test_ledger_path_round_trip(ledger_id: int) -> None:
    parts = ledger_path_components(ledger_id)
    assert [len(p) for p in parts] == [3, 4, 4, 4, 5] and parts[4][0] == "L"
    assert ledger_id_from_components(parts) == ledger_id
    assert L.ledger_id(L.ledger(ledger_id)) == ledger_id


@given(st.integers(min_value=0, max_value=MAX_LEDGER_ID), st.integers(min_value=0, max_value=MAX_LEDGER_ID))
def test_path_order_is_id_order(a: int, b: int) -> None:
    """Zero padding makes lexicographic path order equal numeric id order (range scans rely on it)."""
    assert (L.ledger(a) < L.ledger(b)) == (a < b)


@pytest.mark.parametrize("bad", [-1, 2**63, True, 1.0, "1"])
def test_bad_ledger_ids_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        L.ledger(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        "/ledgers/000/0000/0000/0000/0001",  # no L
        "/ledgers/000/0000/0000/L0001",  # a level short
        "/ledgers/00/0000/0000/0000/L0001",  # short-hierarchical bucket
        "/ledgers/999/9999/9999/9999/L9999",  # > 2**63-1
        "/ledgers/available/0000/0000/0000/L0001",
        "/ledgers/000/0000/0000/0000/L0001/x",
    ],
)
def test_bad_ledger_paths_are_rejected(path: str) -> None:
    with pytest.raises(ValueError):
        L.ledger_id(path)


def test_special_nodes_are_not_buckets() -> None:
    for name in (
        "available",
        "cookies",
        "INSTANCEID",
        "LAYOUT",
        "underreplication",
        "idgen",
        "idgen-long",
        "00",
    ):
        assert not is_bucket_name(0, name)
    assert is_bucket_name(0, "000") and is_bucket_name(1, "0000") and not is_bucket_name(1, "000")


def test_cluster_paths() -> None:
    assert L.available == "/ledgers/available"
    assert L.available_readonly == "/ledgers/available/readonly"
    assert L.bookie("10.0.0.1:3181") == "/ledgers/available/10.0.0.1:3181"
    assert L.bookie("10.0.0.1:3181", readonly=True) == "/ledgers/available/readonly/10.0.0.1:3181"
    assert L.cookie("h:1") == "/ledgers/cookies/h:1"
    assert L.instance_id == "/ledgers/INSTANCEID"
    assert L.layout == "/ledgers/LAYOUT"
    assert L.underreplication == "/ledgers/underreplication"
    assert L.idgen == "/ledgers/idgen-long"
    assert LAYOUT_TEXT.splitlines() == [
        "2",
        "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
    ]
    for bad in ("", "a/b", "readonly", ".."):
        with pytest.raises(ValueError):
            L.bookie(bad)


@pytest.mark.parametrize(
    ("text", "hosts", "root"),
    [
        ("127.0.0.1:2181", ("127.0.0.1:2181",), "/ledgers"),
        ("zk://127.0.0.1:2181", ("127.0.0.1:2181",), "/ledgers"),
        ("zk://a:1,b:2/custom", ("a:1", "b:2"), "/custom"),
        ("a:1,b:2,c:3/x/y/ledgers", ("a:1", "b:2", "c:3"), "/x/y/ledgers"),
        ("zk-1.example.com", ("zk-1.example.com:2181",), "/ledgers"),
        ("a:1/", ("a:1",), "/ledgers"),
        (" a:1/r/ ", ("a:1",), "/r"),
        ("[::1]:2181/r", ("[::1]:2181",), "/r"),
    ],
)
def test_parse_connect_string(text: str, hosts: tuple[str, ...], root: str) -> None:
    assert parse_connect_string(text) == ConnectInfo(hosts, root)


@pytest.mark.parametrize(
    "bad", ["", "zk://", "a:1,,b:2", "a:notaport", "a:0", "a:70000", "a b:1", "a:1/x//y", "a:1/../x"]
)
def test_bad_connect_strings(bad: str) -> None:
    with pytest.raises(InvalidConnectStringError):
        parse_connect_string(bad)
    with pytest.raises(ValueError):  # also a ValueError, for argparse-style callers
        parse_connect_string(bad)
