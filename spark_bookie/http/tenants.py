"""Pulsar's tenant admin API (``/admin/v2/...``, DESIGN §4.7, §4.9): same paths and JSON shapes
as Pulsar's where it has them, on the same HTTP server as BookKeeper's ``/api/v1/``.

    GET    /admin/v2/tenants                          names                    superusers
    GET    /admin/v2/tenants/{t}                      {"adminRoles": [...],    superusers, t's admins
                                                       "allowedClusters": []}
    PUT    /admin/v2/tenants/{t}   {"adminRoles": []} create (409: exists)     superusers
    POST   /admin/v2/tenants/{t}   {"adminRoles": []} replace the admin roles  superusers
    DELETE /admin/v2/tenants/{t}                      (409: owns namespaces)   superusers
    GET    /admin/v2/namespaces/{t}                   ["t/ns", ...]            superusers, t's admins
    GET    /admin/v2/namespaces/{t}/{ns}/permissions  {role: [actions]}        superusers, t's admins
    GET    /admin/v2/namespaces/{t}/{ns}/storage      bytes on bookies against superusers, t's admins
                                                      the storage quota
    POST   .../permissions/{role}  ["produce", ...]   grant (replaces)         superusers, t's admins
    DELETE .../permissions/{role}                     revoke                   superusers, t's admins

Namespace names are the cluster's (flat, DESIGN §4.5); the tenant in a path must be the one that
owns the namespace (404 otherwise). Changes answer 204 with no body, as Pulsar's do.

Who asks is the verified token of the request (the guard let any valid one through, see
spark_bookie.http.security); its ``role`` claim ``admin`` makes a superuser, its ``sub`` is the role
that a tenant names among its admins (metadata.tenancy.manage_refusal). A refusal is 403 naming the
role. Once the caller is allowed, the handler acts through ``ctx.tenancy_client()``: the process's
connection without the process's token, so that the process's own role plays no part. On a port
that checks no tokens, nothing is checked, unless the process's own client carries a token (its
cluster checks them): then every call is 403, as the admin calls of /api/v1 are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger_client import errors as lerr
from metadata import InvalidMetadataError
from metadata.streams.model import check_name
from metadata.tenancy import SUPERUSER_ROLE, Caller, check_actions, check_role, manage_refusal
from spark_bookie.http.params import ApiError, bad_request
from spark_bookie.http.server import Request, Response
from spark_bookie.server.auth import AuthError, bearer_token

if TYPE_CHECKING:
    from ledger_client import LedgerClient, Namespace
    from spark_bookie.http.routes import AdminContext

TENANTS = "/admin/v2/tenants"
NAMESPACES = "/admin/v2/namespaces"
NO_CONTENT = Response(204, b"")


# ---------------------------------------------------------------------- who asks, and may they

def _caller(ctx: AdminContext, req: Request) -> Caller | None:
    """The request's verified caller; None when nothing is checked (an open cluster's port)."""
    if ctx.verifier is None:
        cfg = ctx.client_config
        if cfg is not None and (cfg.auth_token or cfg.auth_token_file):
            raise ApiError(403, "the tenant API checks who asks, and this admin port checks no tokens")
        return None
    try:
        return ctx.verifier.verify(bearer_token(req.authorization)).caller
    except AuthError as e:
        raise ApiError(401, str(e)) from e


def _superuser(caller: Caller | None, what: str) -> None:
    if caller is not None and caller.role_claim != SUPERUSER_ROLE:
        raise ApiError(403, f"role {caller.subject!r} may not {what}: superusers only")


def _manager(ctx: AdminContext, caller: Caller | None, tenant: str, what: str) -> frozenset[str]:
    """The tenant's admin roles, once ``caller`` may manage it (404 for no such tenant)."""
    got = ctx.tenancy_client().store.tenants.read_tenant(tenant)
    if got is None:
        raise ApiError(404, f"tenant {tenant!r} does not exist")
    admins = got[0].admin_roles
    why = None if caller is None else manage_refusal(caller, what, tenant, admins)
    if why is not None:
        raise ApiError(403, why)
    return admins


def _acting(call: Callable[[], Any]) -> Any:
    """The client's errors as answers: absent 404, conflicts 409, bad input 400, and a refusal of
    the acting client itself (its cluster's ZooKeeper ACL, say) 403 saying whose it was."""
    try:
        return call()
    except (lerr.NoSuchTenantError, lerr.NoSuchNamespaceError) as e:
        raise ApiError(404, str(e)) from e
    except (lerr.TenantExistsError, lerr.TenantNotEmptyError, lerr.NamespaceExistsError) as e:
        raise ApiError(409, str(e)) from e
    except lerr.IncorrectParameterError as e:
        raise ApiError(400, str(e)) from e
    except lerr.UnauthorizedAccessError as e:
        raise ApiError(403, f"this admin process was refused: {e}") from e


# ---------------------------------------------------------------------- parameters and bodies

def _name(req: Request, key: str, what: str) -> str:
    try:
        return check_name(req.path_params.get(key, ""), what)
    except InvalidMetadataError as e:
        raise bad_request(str(e)) from e


def _role(req: Request) -> str:
    try:
        return check_role(req.path_params.get("role", ""))
    except InvalidMetadataError as e:
        raise bad_request(str(e)) from e


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"request body is not JSON: {e}") from e


def _tenant_info_body(raw: bytes) -> list[str]:
    """The admin roles of Pulsar's TenantInfo body ``{"adminRoles": [...], "allowedClusters": [...]}``
    (allowedClusters: this is one cluster, so any list is taken and kept nowhere)."""
    body = _json(raw)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise bad_request('request body must be a JSON object {"adminRoles": [...]}')
    roles = body.get("adminRoles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise bad_request('"adminRoles" must be a list of role names')
    if not isinstance(body.get("allowedClusters", []), list):
        raise bad_request('"allowedClusters" must be a list')
    try:
        return sorted({check_role(r) for r in roles})
    except InvalidMetadataError as e:
        raise bad_request(f'"adminRoles": {e}') from e


def _actions_body(raw: bytes) -> list[str]:
    body = _json(raw)
    if not isinstance(body, list) or not all(isinstance(a, str) for a in body):
        raise bad_request('request body must be a JSON list of actions, e.g. ["produce", "consume"]')
    try:
        return sorted(check_actions(body))
    except InvalidMetadataError as e:
        raise bad_request(str(e)) from e


# ---------------------------------------------------------------------- tenants

def list_tenants(ctx: AdminContext, req: Request) -> Response:
    _superuser(_caller(ctx, req), "list tenants")
    return Response.json(_acting(ctx.tenancy_client().list_tenants))


def get_tenant(ctx: AdminContext, req: Request) -> Response:
    tenant = _name(req, "tenant", "tenant")
    admins = _manager(ctx, _caller(ctx, req), tenant, f"read tenant {tenant!r}")
    return Response.json({"adminRoles": sorted(admins), "allowedClusters": []})


def create_tenant(ctx: AdminContext, req: Request) -> Response:
    tenant = _name(req, "tenant", "tenant")
    _superuser(_caller(ctx, req), f"create tenant {tenant!r}")
    roles = _tenant_info_body(req.body)
    client = ctx.tenancy_client()
    _acting(lambda: client.create_tenant(tenant, roles))
    return NO_CONTENT


def update_tenant(ctx: AdminContext, req: Request) -> Response:
    tenant = _name(req, "tenant", "tenant")
    _superuser(_caller(ctx, req), f"change tenant {tenant!r}")
    roles = _tenant_info_body(req.body)
    client = ctx.tenancy_client()
    _acting(lambda: client.update_tenant(tenant, roles))
    return NO_CONTENT


def delete_tenant(ctx: AdminContext, req: Request) -> Response:
    tenant = _name(req, "tenant", "tenant")
    _superuser(_caller(ctx, req), f"delete tenant {tenant!r}")
    client = ctx.tenancy_client()
    _acting(lambda: client.delete_tenant(tenant))
    return NO_CONTENT


# ---------------------------------------------------------------------- namespaces and their grants

def tenant_namespaces(ctx: AdminContext, req: Request) -> Response:
    tenant = _name(req, "tenant", "tenant")
    _manager(ctx, _caller(ctx, req), tenant, f"list the namespaces of tenant {tenant!r}")
    info = _acting(lambda: ctx.tenancy_client().tenant_info(tenant))
    return Response.json([f"{tenant}/{ns}" for ns in info.namespaces])


def _namespace(ctx: AdminContext, req: Request, what: str) -> Namespace:
    """The path's namespace, once the caller may manage its tenant; 404 unless that tenant owns it."""
    tenant = _name(req, "tenant", "tenant")
    name = _name(req, "namespace", "namespace")
    _manager(ctx, _caller(ctx, req), tenant, f"{what} of namespace {tenant}/{name}")
    client: LedgerClient = ctx.tenancy_client()
    ns: Namespace = _acting(lambda: client.namespace(name))
    if ns.tenant != tenant:
        raise ApiError(404, f"namespace {name!r} is not in tenant {tenant!r}")
    return ns


def get_permissions(ctx: AdminContext, req: Request) -> Response:
    ns = _namespace(ctx, req, "read the permissions")
    perms = _acting(ns.permissions)
    return Response.json({role: sorted(actions) for role, actions in sorted(perms.items())})


def grant_permission(ctx: AdminContext, req: Request) -> Response:
    role = _role(req)
    ns = _namespace(ctx, req, "grant permissions")
    actions = _actions_body(req.body)
    _acting(lambda: ns.grant_permission(role, actions))
    return NO_CONTENT


def revoke_permission(ctx: AdminContext, req: Request) -> Response:
    role = _role(req)
    ns = _namespace(ctx, req, "revoke permissions")
    _acting(lambda: ns.revoke_permission(role))
    return NO_CONTENT


def get_storage(ctx: AdminContext, req: Request) -> Response:
    """The namespace's bytes on bookies against its storage quota (DESIGN §4.10), in Pulsar's
    words for a topic's logical size (``storageSize``), and per stream."""
    ns = _namespace(ctx, req, "read the storage usage")
    usage = _acting(ns.storage_usage)
    return Response.json({"storageSize": usage.used_bytes, "storageQuotaBytes": usage.quota_bytes,
                          "freeBytes": usage.free_bytes,
                          "streams": {n: {"storageSize": s.total} for n, s in sorted(usage.streams.items())}})


TenantHandler = Callable[["AdminContext", Request], Response]
TENANT_ROUTES: dict[str, dict[str, TenantHandler]] = {
    TENANTS: {"GET": list_tenants},
    f"{TENANTS}/{{tenant}}": {"GET": get_tenant, "PUT": create_tenant, "POST": update_tenant,
                              "DELETE": delete_tenant},
    f"{NAMESPACES}/{{tenant}}": {"GET": tenant_namespaces},
    f"{NAMESPACES}/{{tenant}}/{{namespace}}/permissions": {"GET": get_permissions},
    f"{NAMESPACES}/{{tenant}}/{{namespace}}/storage": {"GET": get_storage},
    f"{NAMESPACES}/{{tenant}}/{{namespace}}/permissions/{{role}}": {"POST": grant_permission,
                                                                    "DELETE": revoke_permission},
}
"""Path template -> method -> handler; build_routes binds them to the process's AdminContext."""
