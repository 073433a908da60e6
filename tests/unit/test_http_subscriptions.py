"""The subscription endpoints of the admin API (spark_bookie/http/subscriptions.py) without
processes: routes, who may do what, status codes and JSON bodies over the in-memory metadata twin
with real tokens. The subscriptions themselves are a stand-in with the client's surface and typed
errors (Namespace.subscriptions, reset_subscription, delete_subscription): this checks the API's
layer, the client's own tests check the subscriptions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from subscription_fakes import FakeSubscriptions, Info

from ledger_client import DLSN, ClientConfig
from metadata import connect
from spark_bookie.http.routes import AdminContext, build_routes
from spark_bookie.http.security import token_guard
from spark_bookie.http.server import Request, dispatch
from spark_bookie.server.auth import TokenVerifier, mint_token

pytestmark = pytest.mark.unit

SECRET = b"the-subscription-api-unit-test-secret-0123"
CLAIMS = {"root": "admin", "acme-admin": "client", "billing": "client", "intruder": "client"}

class Api:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        self.routes = build_routes(ctx)
        self.guard = token_guard(ctx.verifier) if ctx.verifier is not None else None

    def __call__(self, method: str, path: str, role: str | None = None, body: Any = None) -> tuple[int, Any]:
        token = mint_token(SECRET, role, CLAIMS[role], 600) if role is not None else None
        raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        resp = dispatch(self.routes, self.ctx.registry,
                        Request(method, path, {}, raw, f"Bearer {token}" if token else None), self.guard)
        return resp.status, json.loads(resp.body) if resp.body else None


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Api, FakeSubscriptions]]:
    """Tenant acme (admin acme-admin) owns namespace payments with stream orders (subscriptions
    billing and audit); role billing may consume payments; namespace misc is public's."""
    zk = f"memory://subs-{uuid.uuid4().hex}/ledgers"
    store = connect(zk)
    store.cluster.init_cluster()
    store.close()
    ctx = AdminContext(zk, CollectorRegistry(), verifier=TokenVerifier(SECRET, "HS256"),
                       client_config=ClientConfig(auth_token=mint_token(SECRET, "bookie", "service", 600)))
    c = ctx.tenancy_client()
    c.create_tenant("acme", admin_roles=["acme-admin"])
    pay = c.create_namespace("payments", tenant="acme")
    pay.create_stream("orders")
    pay.grant_permission("billing", ["consume"])
    c.create_namespace("misc").create_stream("log")
    subs = FakeSubscriptions()
    subs.install(monkeypatch)
    subs.data[("payments", "orders")] = {"billing": Info("billing", DLSN(2, 7, 3), 120, 12_000, 1_000),
                                         "audit": Info("audit", DLSN(1, 0, -1), 500, 50_000, 900)}
    try:
        yield Api(ctx), subs
    finally:
        ctx.close()


P = "/admin/v2/persistent"
ORDERS = f"{P}/acme/payments/orders"


def test_list_and_stats_show_positions_and_backlogs(api):
    call, _ = api
    assert call("GET", f"{ORDERS}/subscriptions", "root") == (200, ["audit", "billing"])
    status, stats = call("GET", f"{ORDERS}/stats", "acme-admin")
    assert status == 200 and stats == {"subscriptions": {
        "audit": {"msgBacklog": 500, "backlogSize": 50_000, "position": "1/0/-1", "updatedMs": 900},
        "billing": {"msgBacklog": 120, "backlogSize": 12_000, "position": "2/7/3", "updatedMs": 1_000}}}
    assert call("GET", f"{P}/public/misc/log/subscriptions", "root") == (200, [])


def test_managers_reset_and_delete(api):
    call, subs = api
    reset = f"{ORDERS}/subscription/billing/resetcursor"
    assert call("POST", reset, "acme-admin", {"position": "1/2/3"}) == (204, None)
    assert subs.data[("payments", "orders")]["billing"].position == (1, 2, 3)
    assert call("POST", f"{ORDERS}/subscription/audit/resetcursor", "root", {"position": "3/0/5"}) == (204, None)
    assert call("POST", reset, "root", {"position": "earliest"}) == (204, None)
    assert subs.data[("payments", "orders")]["billing"].position == (1, 0, -1)
    assert call("DELETE", f"{ORDERS}/subscription/audit", "acme-admin") == (204, None)
    assert call("GET", f"{ORDERS}/subscriptions", "root") == (200, ["billing"])
    status, err = call("DELETE", f"{ORDERS}/subscription/audit", "root")
    assert status == 404 and "audit" in err["error"]


def test_consumers_read_but_do_not_change_and_others_are_refused(api):
    call, subs = api
    assert call("GET", f"{ORDERS}/stats", "billing")[0] == 200
    assert call("GET", f"{ORDERS}/subscriptions", "billing")[0] == 200
    for method, path, body in (("POST", f"{ORDERS}/subscription/billing/resetcursor", {"position": "1/0/0"}),
                               ("DELETE", f"{ORDERS}/subscription/billing", None)):
        status, err = call(method, path, "billing", body)
        assert status == 403 and "'billing'" in err["error"], (method, path, status, err)
    for method, path, body in (("GET", f"{ORDERS}/stats", None), ("GET", f"{ORDERS}/subscriptions", None),
                               ("POST", f"{ORDERS}/subscription/billing/resetcursor", {"position": "1/0/0"}),
                               ("DELETE", f"{ORDERS}/subscription/billing", None),
                               ("GET", f"{P}/public/misc/log/stats", None)):
        status, err = call(method, path, "intruder", body)
        assert status == 403 and "'intruder'" in err["error"], (method, path, status, err)
    assert call("GET", f"{P}/public/misc/log/stats", "acme-admin")[0] == 403   # another tenant's namespace
    assert call("GET", f"{P}/public/misc/log/stats", "billing")[0] == 403     # no grant on misc
    assert subs.data[("payments", "orders")]["billing"].position == (2, 7, 3)
    assert call("GET", f"{ORDERS}/stats")[0] == 401


@pytest.mark.parametrize("method,path,body,words", [
    ("GET", f"{P}/acme/payments/nope/stats", None, "nope"),
    ("GET", f"{P}/acme/misc/log/subscriptions", None, "not in tenant 'acme'"),
    ("GET", f"{P}/nobody/payments/orders/stats", None, "nobody"),
    ("GET", f"{P}/acme/gone/orders/stats", None, "gone"),
    ("POST", f"{ORDERS}/subscription/nope/resetcursor", {"position": "1/0/0"}, "nope"),
    ("DELETE", f"{ORDERS}/subscription/nope", None, "nope"),
])
def test_unknown_things_are_404(api, method, path, body, words):
    status, err = api[0](method, path, "root", body)
    assert status == 404 and words in err["error"], (status, err)


@pytest.mark.parametrize("method,path,body,words", [
    ("POST", f"{ORDERS}/subscription/billing/resetcursor", {"position": "3/1/0"}, "after the end"),
    ("POST", f"{ORDERS}/subscription/billing/resetcursor", {"position": "1/x/0"}, "not a DLSN"),
    ("POST", f"{ORDERS}/subscription/billing/resetcursor", {"dlsn": "1/0/0"}, '"position"'),
    ("POST", f"{ORDERS}/subscription/billing/resetcursor", b"{oops", "not JSON"),
    ("POST", f"{ORDERS}/subscription/bad$name/resetcursor", {"position": "1/0/0"}, "bad subscription name"),
    ("DELETE", f"{ORDERS}/subscription/..", None, "bad subscription name"),
    ("GET", f"{P}/acme/payments/bad$stream/stats", None, "bad stream name"),
])
def test_bad_input_is_400_and_changes_nothing(api, method, path, body, words):
    call, subs = api
    status, err = call(method, path, "root", body)
    assert status == 400 and words in err["error"], (status, err)
    assert set(subs.data[("payments", "orders")]) == {"audit", "billing"}
    assert subs.data[("payments", "orders")]["billing"].position == (2, 7, 3)


def test_wrong_methods_are_405(api):
    call, _ = api
    assert call("GET", f"{ORDERS}/subscription/billing/resetcursor", "root")[0] == 405
    assert call("DELETE", f"{ORDERS}/subscriptions", "root")[0] == 405


def test_the_real_client_behind_the_routes(api, monkeypatch):
    call, _ = api
    monkeypatch.undo()   # the client's own subscriptions: a stream without any, an unknown one
    assert call("GET", f"{ORDERS}/stats", "root") == (200, {"subscriptions": {}})
    assert call("GET", f"{ORDERS}/subscriptions", "billing") == (200, [])
    status, err = call("DELETE", f"{ORDERS}/subscription/nope", "root")
    assert status == 404 and "nope" in err["error"]
    status, err = call("POST", f"{ORDERS}/subscription/nope/resetcursor", "root", {"position": "1/0/0"})
    assert status == 400 and "after its last record" in err["error"]   # an empty stream has no record 1/0/0
