"""A stream's subscriptions (DESIGN §4.11) on the admin API, in Pulsar's topic paths (a stream is
a topic of domain ``persistent``; the namespace must be the tenant's, 404 otherwise):

    GET    /admin/v2/persistent/{t}/{ns}/{s}/subscriptions      ["billing", ...]     readers
    GET    /admin/v2/persistent/{t}/{ns}/{s}/stats              {"subscriptions":    readers
              {name: {"msgBacklog", "backlogSize", "position", "updatedMs"}}}
    POST   .../{s}/subscription/{sub}/resetcursor {"position": "seg/entry/slot"}      managers
              (or "earliest": before the first record kept, "latest": at the last one)
    DELETE .../{s}/subscription/{sub}                                              managers

``msgBacklog`` and ``backlogSize`` are Pulsar's names for the backlog in records and bytes;
``position`` is the last record consumed (the subscription's readers resume after it). Readers:
superusers, the tenant's admin roles and roles granted ``consume`` on the namespace (Pulsar lets
consumers see their topic's subscriptions); managers: superusers and the tenant's admin roles
(a reset or a delete changes what a consumer relies on). Errors: 404 for an unknown tenant,
namespace, stream or subscription, 400 for a bad name, body or position (one past the stream's
end included), 403 naming the refused role. Who asks is decided as in spark_bookie.http.tenants;
once allowed, the handler acts through the process's own client (``ctx.client()``): a backlog and
a reset read the segment in progress from the bookies, which want the process's token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger_client import errors as lerr
from metadata.tenancy import CONSUME, Caller, manage_refusal, namespace_refusal
from spark_bookie.http.params import ApiError, bad_request
from spark_bookie.http.server import Request, Response
from spark_bookie.http.tenants import NO_CONTENT, _acting, _caller, _json, _name

if TYPE_CHECKING:
    from ledger_client import Namespace, SubscriptionInfo
    from spark_bookie.http.routes import AdminContext

TOPICS = "/admin/v2/persistent"
STREAM = f"{TOPICS}/{{tenant}}/{{namespace}}/{{stream}}"


def _stream(ctx: AdminContext, req: Request, what: str, consumers: bool) -> tuple[Namespace, str]:
    """The path's namespace and stream, once the caller may ``what`` them (``consumers``: roles
    granted consume may too); 404 unless the tenant owns the namespace and the stream exists."""
    tenant = _name(req, "tenant", "tenant")
    ns_name = _name(req, "namespace", "namespace")
    stream = _name(req, "stream", "stream")
    caller = _caller(ctx, req)
    client = ctx.tenancy_client()
    got = client.store.tenants.read_tenant(tenant)
    if got is None:
        raise ApiError(404, f"tenant {tenant!r} does not exist")
    admins = got[0].admin_roles
    why = None if caller is None else manage_refusal(caller, f"{what} of {ns_name}/{stream}", tenant, admins)
    if why is not None and consumers:
        why = _consumer_refusal(ctx, caller, ns_name, tenant, why)  # type: ignore[arg-type]
    if why is not None:
        raise ApiError(403, why)
    # The backlog and a position's mark read the segment in progress from bookies, which take the
    # process's own token (its client's); the caller was checked above.
    acting = ctx.client()
    ns: Namespace = _acting(lambda: acting.namespace(ns_name))
    if ns.tenant != tenant:
        raise ApiError(404, f"namespace {ns_name!r} is not in tenant {tenant!r}")
    if not _acting(lambda: ns.stream_exists(stream)):
        raise ApiError(404, f"stream {ns_name}/{stream} does not exist")
    return ns, stream


def _consumer_refusal(ctx: AdminContext, caller: Caller, ns_name: str, tenant: str, why: str) -> str | None:
    """None when ``caller`` holds consume on the namespace (of ``tenant``), else ``why``."""
    grants = ctx.tenancy_client().store.tenants.read_grants(ns_name)
    if grants is None or grants[0].tenant != tenant:
        return why
    access, admins = grants
    return None if namespace_refusal(caller, CONSUME, ns_name, access, admins) is None else why


def _subscription_errors(call: Callable[[], Any]) -> Any:
    """The subscription API's typed errors as answers (the rest as spark_bookie.http.tenants)."""
    try:
        return _acting(call)
    except (lerr.NoSuchSubscriptionError, lerr.NoSuchStreamError) as e:
        raise ApiError(404, str(e)) from e
    except lerr.InvalidNameError as e:
        raise ApiError(400, str(e)) from e


def subscription_stats(info: SubscriptionInfo) -> dict[str, Any]:
    return {"msgBacklog": info.backlog_records, "backlogSize": info.backlog_bytes,
            "position": str(info.position), "updatedMs": info.updated_ms}


def list_subscriptions(ctx: AdminContext, req: Request) -> Response:
    ns, stream = _stream(ctx, req, "list the subscriptions", consumers=True)
    subs = _subscription_errors(lambda: ns.subscriptions(stream))
    return Response.json(sorted(subs))


def stream_stats(ctx: AdminContext, req: Request) -> Response:
    ns, stream = _stream(ctx, req, "read the subscriptions", consumers=True)
    subs = _subscription_errors(lambda: ns.subscriptions(stream))
    return Response.json({"subscriptions": {n: subscription_stats(s) for n, s in sorted(subs.items())}})


def _position_body(raw: bytes) -> Any:
    from ledger_client import DLSN

    body = _json(raw)
    text = body.get("position") if isinstance(body, dict) else None
    if not isinstance(text, str):
        raise bad_request('request body must be a JSON object {"position": "segment/entry/slot"}')
    if text in ("earliest", "latest"):
        return text
    try:
        return DLSN.parse(text)
    except lerr.IncorrectParameterError as e:
        raise bad_request(f'"position": {e}') from e


def reset_subscription(ctx: AdminContext, req: Request) -> Response:
    sub = _name(req, "subscription", "subscription")
    ns, stream = _stream(ctx, req, f"reset subscription {sub!r}", consumers=False)
    point = _position_body(req.body)
    _subscription_errors(lambda: ns.reset_subscription(stream, sub, point))
    return NO_CONTENT


def delete_subscription(ctx: AdminContext, req: Request) -> Response:
    sub = _name(req, "subscription", "subscription")
    ns, stream = _stream(ctx, req, f"delete subscription {sub!r}", consumers=False)
    _subscription_errors(lambda: ns.delete_subscription(stream, sub))
    return NO_CONTENT


SubscriptionHandler = Callable[["AdminContext", Request], Response]
SUBSCRIPTION_ROUTES: dict[str, dict[str, SubscriptionHandler]] = {
    f"{STREAM}/subscriptions": {"GET": list_subscriptions},
    f"{STREAM}/stats": {"GET": stream_stats},
    f"{STREAM}/subscription/{{subscription}}/resetcursor": {"POST": reset_subscription},
    f"{STREAM}/subscription/{{subscription}}": {"DELETE": delete_subscription},
}
"""Path template -> method -> handler; build_routes binds them as it does the tenant API's."""
