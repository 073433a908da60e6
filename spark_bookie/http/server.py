"""The admin HTTP server: the standard library's threading server in a daemon thread.

Why the standard library: the admin API is a handful of small, rare requests beside a bookie
whose event loop and threads are busy with adds; a thread per request (ThreadingHTTPServer) keeps
a slow admin call (a ledger read, a metadata scan) off the bookie's loop, and adds no dependency.
Every answer is JSON except /metrics (Prometheus' text format, prometheus_client's exposition) and
/heartbeat (``OK``, as BookKeeper's). A route is an exact path, or a template whose ``{name}``
segments match one non-empty path segment each (Pulsar's ``/admin/v2/tenants/{tenant}``): the
handler finds them, percent-decoded, in ``Request.path_params``. Errors are
``{"error": message}`` with 400 (bad request), 404 (unknown path or ledger), 405 (wrong method) or
503; an unexpected exception is logged here and answered 500 with its one-line message, never a
traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from spark_bookie.http.params import ApiError, parse_query

log = logging.getLogger(__name__)

BODY_BYTES_MAX = 1 << 20  # admin requests are small; a larger body is refused (413)
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: dict[str, str]
    body: bytes
    authorization: str | None = None   # the Authorization header (a bearer token, docs/security.md)
    path_params: Mapping[str, str] = field(default_factory=dict)   # a template route's {name} segments


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"

    @staticmethod
    def json(value: Any, status: int = 200) -> Response:
        return Response(status, json.dumps(value, indent=2).encode() + b"\n")

    @staticmethod
    def text(value: str, status: int = 200) -> Response:
        return Response(status, value.encode(), "text/plain; charset=utf-8")


Handler = Callable[[Request], Response]
# path -> {method: handler}
Routes = dict[str, dict[str, Handler]]
Guard = Callable[[Request], None]
"""Raises ApiError (401, 403) for a request its caller may not make (spark_bookie.http.security)."""


def match_route(routes: Routes, path: str) -> tuple[dict[str, Handler], dict[str, str]] | None:
    """The methods of the route ``path`` takes and its template's parameters: an exact route first,
    else the first template with as many segments whose literal ones are equal (a ``{name}``
    segment takes any non-empty one, decoded, so ``%2F`` stays inside its segment)."""
    key = path.rstrip("/") or "/"
    methods = routes.get(key)
    if methods is not None:
        return methods, {}
    parts = key.split("/")
    for template, candidate in routes.items():
        if "{" not in template:
            continue
        pattern = template.split("/")
        if len(pattern) != len(parts):
            continue
        params: dict[str, str] = {}
        for want, got in zip(pattern, parts, strict=True):
            if want.startswith("{") and want.endswith("}") and got:
                params[want[1:-1]] = unquote(got)
            elif want != got:
                break
        else:
            return candidate, params
    return None


def dispatch(routes: Routes, registry: CollectorRegistry, req: Request, guard: Guard | None = None) -> Response:
    """The answer to one request; never raises."""
    try:
        if guard is not None:
            guard(req)
        if req.path == "/metrics":
            if req.method != "GET":
                raise ApiError(405, "use GET for /metrics")
            return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)
        matched = match_route(routes, req.path)
        if matched is None:
            raise ApiError(404, f"no endpoint {req.path}")
        methods, params = matched
        handler = methods.get(req.method)
        if handler is None:
            raise ApiError(405, f"{req.path} takes {', '.join(sorted(methods))}, not {req.method}")
        return handler(replace(req, path_params=params) if params else req)
    except ApiError as e:
        return Response.json({"error": e.message}, e.status)
    except Exception as e:  # a bug or an outage below: logged with its traceback here, not sent
        log.exception("admin request %s %s failed", req.method, req.path)
        return Response.json({"error": f"{type(e).__name__}: {e}"}, 500)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S   # a client that stalls (or a TLS handshake that never ends) loses its thread

    def _serve(self) -> None:
        url = urlsplit(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0 or length > BODY_BYTES_MAX:
                raise ApiError(413, f"request body over {BODY_BYTES_MAX} bytes")
            body = self.rfile.read(length) if length else b""
            req = Request(self.command, url.path, parse_query(url.query), body, self.headers.get("Authorization"))
            resp = dispatch(self.server.routes, self.server.registry, req, self.server.guard)
        except ApiError as e:
            resp = Response.json({"error": e.message}, e.status)
        except ValueError:
            resp = Response.json({"error": "bad Content-Length"}, 400)
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], routes: Routes, registry: CollectorRegistry,
                 guard: Guard | None = None, tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        self.routes = routes
        self.registry = registry
        self.guard = guard
        self.tls = tls
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """With TLS, the accepted socket is wrapped here and its handshake runs on the request's
        own thread (on first read, under the handler's timeout), never on the accepting one."""
        sock, addr = super().get_request()
        if self.tls is not None:
            sock = self.tls().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.info("admin connection from %s failed", client_address, exc_info=True)  # e.g. a TLS handshake


class AdminServer:
    """Serves `routes` and /metrics of `registry` on host:port (port 0: one the OS picks) until
    stop(). OSError from the constructor when the port cannot be bound."""

    def __init__(self, host: str, port: int, routes: Routes, registry: CollectorRegistry,
                 guard: Guard | None = None, tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        """`guard`: who may call what (spark_bookie.http.security); `tls`: the SSLContext of each
        new connection (a function, so that a rotated certificate is picked up)."""
        self._server = _Server((host, port), routes, registry, guard, tls)
        self.tls = tls is not None
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"admin-http-{self.port}", daemon=True)

    def start(self) -> AdminServer:
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


def start_admin_server(host: str, port: int, routes: Routes, registry: CollectorRegistry) -> AdminServer:
    return AdminServer(host, port, routes, registry).start()
