"""`spark-bookie stream subscriptions|reset-subscription|delete-subscription`, run in this process
over the in-memory metadata twin (``--zk memory://...``) and the subscriptions stand-in
(subscription_fakes.py): what they print (text and --json), DLSNs parsed as `stream truncate`
parses them, one-line errors with exit status 2, and reset and delete taking the admin role."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest
from subscription_fakes import FakeSubscriptions, Info

from ledger_client import DLSN, LedgerClient
from metadata import connect
from spark_bookie.cli.main import main

pytestmark = pytest.mark.unit


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str], subs: FakeSubscriptions) -> None:
        self.zk = f"memory://subs-cli-{uuid.uuid4().hex}/ledgers"
        store = connect(self.zk)
        store.cluster.init_cluster()
        store.close()
        self.capsys, self.subs = capsys, subs

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["stream", "--zk", self.zk, *args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    root, kazoo = logging.getLogger(), logging.getLogger("kazoo")
    levels = root.level, kazoo.level   # the commands quieten logging for their own output
    subs = FakeSubscriptions()
    subs.install(monkeypatch)
    c = Cli(capsys, subs)
    with LedgerClient(c.zk) as client:
        client.create_namespace("pay").create_stream("orders")
    subs.data[("pay", "orders")] = {"billing": Info("billing", DLSN(2, 7, 3), 120, 12_000, 1_764_160_000_000),
                                    "audit": Info("audit", DLSN(1, 0, -1), 500, 50_000, 1_764_150_000_000)}
    try:
        yield c
    finally:
        root.setLevel(levels[0])
        kazoo.setLevel(levels[1])


def test_subscriptions_in_text_and_json(cli):
    code, out, _ = cli("subscriptions", "pay/orders")
    assert code == 0
    assert out.splitlines() == [
        "audit\tposition 1/0/-1\tbacklog 500 records 50000 bytes\tupdated 2025-11-26T09:40:00Z",
        "billing\tposition 2/7/3\tbacklog 120 records 12000 bytes\tupdated 2025-11-26T12:26:40Z"]
    code, out, _ = cli("subscriptions", "pay/orders", "--json")
    assert code == 0 and json.loads(out) == {"stream": "pay/orders", "subscriptions": {
        "audit": {"position": "1/0/-1", "backlog_records": 500, "backlog_bytes": 50_000,
                  "updated_ms": 1_764_150_000_000},
        "billing": {"position": "2/7/3", "backlog_records": 120, "backlog_bytes": 12_000,
                    "updated_ms": 1_764_160_000_000}}}


def test_reset_and_delete(cli):
    code, out, _ = cli("reset-subscription", "pay/orders", "billing", "1/2/3")
    assert code == 0 and out.strip() == "subscription billing of pay/orders reset to 1/2/3"
    assert cli.subs.data[("pay", "orders")]["billing"].position == (1, 2, 3)
    code, out, _ = cli("reset-subscription", "pay/orders", "audit", "Latest")
    assert code == 0 and out.strip() == "subscription audit of pay/orders reset to 3/0/5"
    code, out, _ = cli("delete-subscription", "pay/orders", "audit")
    assert code == 0 and out.strip() == "deleted subscription audit of pay/orders"
    code, out, _ = cli("subscriptions", "pay/orders")
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["billing"]


@pytest.mark.parametrize("args,words", [
    (("subscriptions", "pay/nope"), "nope"),
    (("subscriptions", "nope/orders"), "nope"),
    (("reset-subscription", "pay/orders", "billing", "1/x/0"), "not a DLSN"),
    (("reset-subscription", "pay/orders", "billing", "3/1/0"), "after the end"),
    (("reset-subscription", "pay/orders", "nope", "1/0/0"), "nope"),
    (("delete-subscription", "pay/orders", "nope"), "nope"),
])
def test_failures_are_one_line_and_status_2(cli, args, words):
    code, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, (code, out, err)
    assert cli.subs.data[("pay", "orders")]["billing"].position == (2, 7, 3)


def test_reset_and_delete_take_the_admin_role(cli, monkeypatch):
    confirmed: list[str] = []
    monkeypatch.setattr(LedgerClient, "confirm_admin", lambda self: confirmed.append("admin"))
    cli("subscriptions", "pay/orders")
    assert confirmed == []
    cli("reset-subscription", "pay/orders", "billing", "1/2/3")
    cli("delete-subscription", "pay/orders", "audit")
    assert confirmed == ["admin", "admin"]


def test_the_real_client_behind_the_commands(cli, monkeypatch):
    monkeypatch.undo()   # the client's own subscriptions: a stream without any, an unknown one
    code, out, _ = cli("subscriptions", "pay/orders", "--json")
    assert code == 0 and json.loads(out) == {"stream": "pay/orders", "subscriptions": {}}
    code, out, err = cli("delete-subscription", "pay/orders", "nope")
    assert code == 2 and "nope" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli("reset-subscription", "pay/orders", "bad$name", "1/0/0")
    assert code == 2 and "bad subscription name" in err
