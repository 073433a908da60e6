"""The admin API's request parsing and dispatch, without processes: every bad input is a 400 (or
404/405) with a JSON error, an unexpected exception a 500 without a traceback; the bookie's
metrics live in a registry per bookie."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from spark_bookie.http.params import (
    ApiError,
    bookie_id_param,
    bool_param,
    choice_param,
    int_param,
    json_body,
    parse_query,
)
from spark_bookie.http.server import AdminServer, Request, Response, dispatch
from spark_bookie.server.metrics import BookieMetrics

pytestmark = pytest.mark.unit


def _status(fn, *args, **kwargs) -> int:
    with pytest.raises(ApiError) as e:
        fn(*args, **kwargs)
    return e.value.status


def test_query_parsing():
    assert parse_query("a=1&b=x&c=") == {"a": "1", "b": "x", "c": ""}
    assert _status(parse_query, "a=1&a=2") == 400


@pytest.mark.parametrize("raw, ok", [("0", 0), ("42", 42), (" 7 ", 7), ("9223372036854775807", (1 << 63) - 1)])
def test_int_param_accepts(raw, ok):
    assert int_param({"n": raw}, "n") == ok


@pytest.mark.parametrize("raw", ["abc", "1.5", "-1", "0x10", "9223372036854775808", "--1", "\u0661", "1" * 40])
def test_int_param_refuses(raw):
    assert _status(int_param, {"n": raw}, "n") == 400


def test_int_param_missing_and_default():
    assert _status(int_param, {}, "n") == 400
    assert int_param({}, "n", default=-1, minimum=-1) == -1
    assert int_param({"n": ""}, "n", default=5) == 5


def test_bool_choice_and_bookie_id():
    assert bool_param({"b": "TRUE"}, "b") is True and bool_param({"b": "0"}, "b") is False
    assert bool_param({}, "b", default=True) is True
    assert _status(bool_param, {"b": "yes"}, "b") == 400
    assert choice_param({"t": "rw"}, "t", ("rw", "ro")) == "rw"
    assert _status(choice_param, {}, "t", ("rw", "ro")) == 400
    assert _status(choice_param, {"t": "RW"}, "t", ("rw", "ro")) == 400
    assert bookie_id_param("10.0.0.1:3181", "b") == "10.0.0.1:3181"
    for bad in (None, "", "host", ":3181", "h:0", "h:65536", "h:x", 3181):
        assert _status(bookie_id_param, bad, "b") == 400, bad


def test_json_body():
    assert json_body(b"") == {} and json_body(b'{"a": 1}') == {"a": 1}
    for bad in (b"{", b"[1]", b"\xff", b'"s"'):
        assert _status(json_body, bad) == 400, bad


def _req(path: str, method: str = "GET") -> Request:
    return Request(method, path, {}, b"")


def test_dispatch_errors_are_json():
    def boom(_req: Request) -> Response:
        raise RuntimeError("disk on fire")

    def refuse(_req: Request) -> Response:
        raise ApiError(400, "no")

    routes = {"/x": {"GET": boom}, "/y": {"PUT": refuse}}
    reg = CollectorRegistry()
    cases = {("/x", "GET"): (500, "RuntimeError: disk on fire"), ("/y", "PUT"): (400, "no"),
             ("/y", "GET"): (405, None), ("/z", "GET"): (404, None), ("/metrics", "DELETE"): (405, None)}
    for (path, method), (status, message) in cases.items():
        resp = dispatch(routes, reg, _req(path, method))
        body = json.loads(resp.body)
        assert resp.status == status and resp.content_type == "application/json", (path, method)
        assert "Traceback" not in body["error"]
        if message is not None:
            assert body["error"] == message


def test_two_bookies_metrics_do_not_clash_and_serve_over_http():
    a, b = BookieMetrics(), BookieMetrics()
    a.adds_done(0.0, 3, 0, 300)
    b.adds_done(0.0, 5, 1, 600)
    server = AdminServer("127.0.0.1", 0, {"/hello": {"GET": lambda _r: Response.json({"hi": 1})}}, a.registry).start()
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        with urllib.request.urlopen(server.url + "/hello", timeout=10) as resp:
            assert json.loads(resp.read()) == {"hi": 1}
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + "/nothing", timeout=10)
        assert e.value.code == 404 and "error" in json.loads(e.value.read())
    finally:
        server.stop()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert values[("bookkeeper_server_ADD_ENTRY_REQUEST_total", (("success", "true"),))] == 3
    assert values[("bookie_WRITE_BYTES_total", ())] == 300
    assert b.registry.get_sample_value("bookkeeper_server_ADD_ENTRY_REQUEST_total", {"success": "false"}) == 1
