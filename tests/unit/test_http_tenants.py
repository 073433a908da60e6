"""Pulsar's tenant API (/admin/v2, spark_bookie.http.tenants) without processes: the routes, the
guard and the handlers over the in-memory metadata twin, with real tokens. Who may do what
(superusers, a tenant's admin roles, anyone else), status codes and JSON bodies; the process's
own client holds a service token, which plays no part in what a caller may do."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ledger_client import ClientConfig
from metadata import connect
from spark_bookie.http.routes import AdminContext, build_routes
from spark_bookie.http.security import token_guard
from spark_bookie.http.server import Request, dispatch
from spark_bookie.server.auth import TokenVerifier, mint_token

pytestmark = pytest.mark.unit

SECRET = b"the-tenant-api-unit-test-secret-0123456789"
CLAIMS = {"root": "admin", "acme-admin": "client", "billing": "client", "intruder": "client", "svc": "service"}


class Api:
    def __init__(self, ctx: AdminContext, checked: bool = True) -> None:
        self.ctx = ctx
        self.routes = build_routes(ctx)
        self.guard = token_guard(ctx.verifier) if checked and ctx.verifier is not None else None

    def __call__(self, method: str, path: str, role: str | None = None, body: Any = None,
                 token: str | None = None) -> tuple[int, Any]:
        if role is not None:
            token = mint_token(SECRET, role, CLAIMS[role], 600)
        raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        resp = dispatch(self.routes, self.ctx.registry,
                        Request(method, path, {}, raw, f"Bearer {token}" if token else None), self.guard)
        return resp.status, json.loads(resp.body) if resp.body else None


def _context(**kw: Any) -> AdminContext:
    zk = f"memory://tenants-{uuid.uuid4().hex}/ledgers"
    store = connect(zk)
    store.cluster.init_cluster()
    store.close()
    return AdminContext(zk, CollectorRegistry(), **kw)


@pytest.fixture
def api() -> Iterator[Api]:
    """Tenant acme (admin role acme-admin) owning namespace payments; namespace misc in public."""
    ctx = _context(verifier=TokenVerifier(SECRET, "HS256"),
                   client_config=ClientConfig(auth_token=mint_token(SECRET, "bookie", "service", 600)))
    c = ctx.tenancy_client()
    c.create_tenant("acme", admin_roles=["acme-admin"])
    c.create_namespace("payments", tenant="acme")
    c.create_namespace("misc")
    try:
        yield Api(ctx)
    finally:
        ctx.close()


T = "/admin/v2/tenants"
N = "/admin/v2/namespaces"


def test_superusers_create_read_update_list_and_delete_tenants(api):
    assert api("PUT", f"{T}/globex", "root", {"adminRoles": ["gx", "ops"], "allowedClusters": ["c1"]}) == (204, None)
    status, err = api("PUT", f"{T}/globex", "root", {"adminRoles": []})
    assert status == 409 and "globex" in err["error"]
    assert api("GET", T, "root") == (200, ["acme", "globex", "public"])
    assert api("GET", f"{T}/globex", "root") == (200, {"adminRoles": ["gx", "ops"], "allowedClusters": []})
    assert api("POST", f"{T}/globex", "root", {"adminRoles": ["ops2"]}) == (204, None)
    assert api("GET", f"{T}/globex", "root")[1]["adminRoles"] == ["ops2"]
    assert api("PUT", f"{T}/empty", "root") == (204, None)          # no body: no admin roles
    assert api("GET", f"{T}/empty", "root")[1] == {"adminRoles": [], "allowedClusters": []}
    assert api("DELETE", f"{T}/globex", "root") == (204, None)
    assert api("DELETE", f"{T}/globex", "root")[0] == 404
    assert api("POST", f"{T}/globex", "root", {"adminRoles": []})[0] == 404
    assert api("GET", f"{T}/globex", "root")[0] == 404


def test_a_tenant_with_namespaces_is_not_deleted(api):
    status, err = api("DELETE", f"{T}/acme", "root")
    assert status == 409 and "payments" in err["error"]
    api.ctx.tenancy_client().delete_namespace("payments")
    assert api("DELETE", f"{T}/acme", "root") == (204, None)


def test_tenant_admins_read_their_tenant_and_manage_its_grants(api):
    assert api("GET", f"{T}/acme", "acme-admin") == (200, {"adminRoles": ["acme-admin"], "allowedClusters": []})
    assert api("GET", f"{N}/acme", "acme-admin") == (200, ["acme/payments"])
    assert api("GET", f"{N}/public", "root") == (200, ["public/misc"])
    perms = f"{N}/acme/payments/permissions"
    assert api("GET", perms, "acme-admin") == (200, {})
    assert api("POST", f"{perms}/billing", "acme-admin", ["produce", "consume"]) == (204, None)
    assert api("POST", f"{perms}/auditor", "root", ["consume"]) == (204, None)
    assert api("GET", perms, "acme-admin") == (200, {"auditor": ["consume"], "billing": ["consume", "produce"]})
    assert api("DELETE", f"{perms}/billing", "acme-admin") == (204, None)
    assert api("DELETE", f"{perms}/nobody", "acme-admin") == (204, None)   # nothing to revoke: no change
    assert api("GET", perms, "root") == (200, {"auditor": ["consume"]})
    assert api.ctx.tenancy_client().namespace("payments").permissions() == {"auditor": frozenset({"consume"})}


def test_tenant_admins_may_not_manage_tenants_nor_other_tenants(api):
    for method, path, body in (("GET", T, None), ("PUT", f"{T}/mine", {"adminRoles": ["acme-admin"]}),
                               ("POST", f"{T}/acme", {"adminRoles": ["acme-admin", "billing"]}),
                               ("DELETE", f"{T}/acme", None), ("GET", f"{T}/public", None),
                               ("GET", f"{N}/public/misc/permissions", None),
                               ("POST", f"{N}/public/misc/permissions/acme-admin", ["consume"])):
        status, err = api(method, path, "acme-admin", body)
        assert status == 403 and "'acme-admin'" in err["error"], (method, path, status, err)
    assert api("GET", f"{T}/acme", "root")[1]["adminRoles"] == ["acme-admin"]
    assert api("GET", T, "root")[1] == ["acme", "public"]


def test_an_intruder_is_refused_everything_by_name_and_nothing_changes(api):
    perms = f"{N}/acme/payments/permissions"
    for method, path, body in (("GET", T, None), ("GET", f"{T}/acme", None), ("PUT", f"{T}/evil", None),
                               ("POST", f"{T}/acme", {"adminRoles": ["intruder"]}), ("DELETE", f"{T}/acme", None),
                               ("GET", f"{N}/acme", None), ("GET", perms, None),
                               ("POST", f"{perms}/intruder", ["produce"]), ("DELETE", f"{perms}/billing", None)):
        status, err = api(method, path, "intruder", body)
        assert status == 403 and "'intruder'" in err["error"], (method, path, status, err)
    assert api("GET", T, "root")[1] == ["acme", "public"]
    assert api("GET", perms, "root") == (200, {})


def test_the_service_role_is_no_tenant_manager(api):
    status, err = api("PUT", f"{T}/svc-made", "svc")
    assert status == 403 and "'svc'" in err["error"] and "superusers only" in err["error"]
    assert api("GET", f"{N}/acme/payments/permissions", "svc")[0] == 403


def test_missing_or_bad_tokens_are_401(api):
    assert api("GET", T)[0] == 401
    assert api("PUT", f"{T}/x")[0] == 401
    assert api("GET", T, token="not-a-token")[0] == 401
    forged = mint_token(b"another-secret-another-secret-0123456789", "root", "admin", 600)
    status, err = api("POST", f"{N}/acme/payments/permissions/x", token=forged, body=["consume"])
    assert status == 401 and "error" in err
    expired = mint_token(SECRET, "root", "admin", -10)
    assert api("GET", T, token=expired)[0] == 401


@pytest.mark.parametrize("method,path,body,words", [
    ("PUT", f"{T}/x", b"{not json", "not JSON"),
    ("PUT", f"{T}/x", [1, 2], "JSON object"),
    ("PUT", f"{T}/x", {"adminRoles": "acme-admin"}, "adminRoles"),
    ("PUT", f"{T}/x", {"adminRoles": ["a:b"]}, "bad role name"),
    ("PUT", f"{T}/x", {"adminRoles": [], "allowedClusters": "c1"}, "allowedClusters"),
    ("POST", f"{T}/acme", {"adminRoles": [7]}, "adminRoles"),
    ("PUT", f"{T}/bad%20name", None, "bad tenant name"),
    ("GET", f"{T}/..", None, "bad tenant name"),
    ("GET", f"{N}/acme/bad$ns/permissions", None, "bad namespace name"),
    ("POST", f"{N}/acme/payments/permissions/billing", ["fly"], "bad actions"),
    ("POST", f"{N}/acme/payments/permissions/billing", [], "bad actions"),
    ("POST", f"{N}/acme/payments/permissions/billing", {"actions": ["produce"]}, "JSON list"),
    ("POST", f"{N}/acme/payments/permissions/billing", b"[produce]", "not JSON"),
    ("POST", f"{N}/acme/payments/permissions/a%3Ab", ["produce"], "bad role name"),
])
def test_bad_input_is_400_with_a_json_error_naming_it(api, method, path, body, words):
    status, err = api(method, path, "root", body)
    assert status == 400 and words in err["error"], (status, err)
    assert api("GET", T, "root")[1] == ["acme", "public"]


def test_absent_tenants_and_namespaces_and_namespaces_of_another_tenant_are_404(api):
    for path in (f"{T}/nope", f"{N}/nope", f"{N}/nope/payments/permissions", f"{N}/acme/nope/permissions",
                 f"{N}/acme/misc/permissions"):
        status, err = api("GET", path, "root")
        assert status == 404 and "error" in err, (path, status, err)
    status, err = api("POST", f"{N}/acme/misc/permissions/billing", "acme-admin", ["consume"])
    assert status == 404 and "not in tenant 'acme'" in err["error"]
    assert api("GET", f"{N}/public/misc/permissions", "root") == (200, {})


def test_wrong_methods_are_405():
    ctx = _context()
    try:
        api = Api(ctx)
        assert api("PUT", T)[0] == 405
        assert api("GET", f"{N}/acme/payments/permissions/billing")[0] == 405
    finally:
        ctx.close()


def test_an_open_port_checks_nothing_unless_its_cluster_checks_tokens():
    ctx = _context()
    try:
        api = Api(ctx)
        assert api("PUT", f"{T}/acme", body={"adminRoles": ["a"]}) == (204, None)
        assert api("GET", f"{T}/acme") == (200, {"adminRoles": ["a"], "allowedClusters": []})
    finally:
        ctx.close()
    ctx = _context(client_config=ClientConfig(auth_token=mint_token(SECRET, "bookie", "service", 600)))
    try:
        status, err = Api(ctx)("GET", T)
        assert status == 403 and "checks no tokens" in err["error"]
    finally:
        ctx.close()
