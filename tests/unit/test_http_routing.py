"""The admin server's routing: exact paths first, then templates whose ``{name}`` segments each take
one non-empty path segment (Pulsar's ``/admin/v2/...`` paths), decoded into Request.path_params."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from spark_bookie.http.server import Request, Response, Routes, dispatch, match_route

pytestmark = pytest.mark.unit


def _echo(name: str):
    def handle(req: Request) -> Response:
        return Response.json({"route": name, "params": dict(req.path_params)})
    return handle


ROUTES: Routes = {
    "/admin/v2/tenants": {"GET": _echo("tenants")},
    "/admin/v2/tenants/special": {"GET": _echo("literal")},
    "/admin/v2/tenants/{tenant}": {"GET": _echo("tenant"), "PUT": _echo("tenant-put")},
    "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}": {"POST": _echo("grant")},
}


def _call(method: str, path: str) -> tuple[int, dict]:
    resp = dispatch(ROUTES, CollectorRegistry(), Request(method, path, {}, b""))
    return resp.status, json.loads(resp.body)


def test_exact_routes_win_over_templates_and_trailing_slashes_are_ignored():
    assert _call("GET", "/admin/v2/tenants") == (200, {"route": "tenants", "params": {}})
    assert _call("GET", "/admin/v2/tenants/") == (200, {"route": "tenants", "params": {}})
    assert _call("GET", "/admin/v2/tenants/special") == (200, {"route": "literal", "params": {}})


def test_template_segments_are_captured_decoded_and_each_is_one_segment():
    assert _call("GET", "/admin/v2/tenants/acme") == (200, {"route": "tenant", "params": {"tenant": "acme"}})
    assert _call("PUT", "/admin/v2/tenants/acme/")[1]["route"] == "tenant-put"
    assert _call("POST", "/admin/v2/namespaces/acme/pay/permissions/bill%2Fing") == (
        200, {"route": "grant", "params": {"tenant": "acme", "namespace": "pay", "role": "bill/ing"}})
    assert _call("GET", "/admin/v2/tenants/a%20b")[1]["params"] == {"tenant": "a b"}


@pytest.mark.parametrize("path", ["/admin/v2/tenants/acme/extra", "/admin/v2/namespaces/acme//permissions/r",
                                  "/admin/v2/namespaces/acme/pay/permission/r", "/admin/v2", "/admin/v2/nothing"])
def test_paths_that_fit_no_route_are_404_with_a_json_error(path):
    status, body = _call("POST", path)
    assert status == 404 and "no endpoint" in body["error"]


def test_a_template_route_answers_405_for_a_method_it_does_not_take():
    status, body = _call("DELETE", "/admin/v2/tenants/acme")
    assert status == 405 and "GET, PUT" in body["error"]


def test_match_route_returns_none_or_the_methods_and_parameters():
    assert match_route(ROUTES, "/nowhere") is None
    methods, params = match_route(ROUTES, "/admin/v2/tenants/x") or ({}, {})
    assert set(methods) == {"GET", "PUT"} and params == {"tenant": "x"}
