"""Who may use the admin API, and TLS on its port (DESIGN §4.8, docs/security.md).

With token authentication on, a request carries `Authorization: Bearer <token>` checked by the
bookie's own TokenVerifier: reading calls (GET) need a valid token of either role, changing calls
(gc, decommission, ledger delete: PUT, POST, DELETE) the `admin` role. A missing or bad token gets
401, a `client` token on an admin call 403. /heartbeat, /metrics and /api/v1/bookie/is_ready stay
open: health checks and Prometheus scrapes carry no token (and reveal no ledger data).
Reading a ledger without its password (ledger/read's administrative open) is an admin call too:
the route asks require_admin, since only it knows whether the ledger has a password.
Pulsar's tenant API (``/admin/v2/...``, spark_bookie.http.tenants) is not all-or-nothing: any
valid token passes the guard there, and each handler decides by the tenant rules (DESIGN §4.9:
superusers, the tenant's admin roles), with 403 naming the role.
"""

from __future__ import annotations

from spark_bookie.http.params import ApiError
from spark_bookie.http.server import Guard, Request
from spark_bookie.server.auth import AuthError, RoleError, TokenVerifier, bearer_token
from spark_bookie.server.tls import ReloadingContext

__all__ = ["ReloadingContext", "redacted", "require_admin", "token_guard"]

OPEN_PATHS = frozenset({"/heartbeat", "/metrics", "/api/v1/bookie/is_ready"})
TENANT_API = "/admin/v2/"   # checked per tenant by its handlers, past a valid token
READ_METHODS = frozenset({"GET", "HEAD"})
SECRET_CONFIG_KEYS = frozenset({"zk_auth"})


def token_guard(verifier: TokenVerifier) -> Guard:
    def guard(req: Request) -> None:
        if req.path.rstrip("/") in OPEN_PATHS:
            return
        try:
            per_tenant = (req.path + "/").startswith(TENANT_API)
            verifier.verify(bearer_token(req.authorization), admin=req.method not in READ_METHODS and not per_tenant)
        except RoleError as e:
            raise ApiError(403, str(e)) from e
        except AuthError as e:
            raise ApiError(401, str(e)) from e
    return guard


def require_admin(verifier: TokenVerifier | None, req: Request, what: str) -> None:
    """ApiError 403 unless ``req`` carries an admin token (401 for a missing or bad one); a
    process that checks no tokens (``verifier`` None: an open cluster) lets everyone through."""
    if verifier is None:
        return
    try:
        verifier.verify(bearer_token(req.authorization), admin=True)
    except RoleError as e:
        raise ApiError(403, f"{what} takes the admin role: {e}") from e
    except AuthError as e:
        raise ApiError(401, str(e)) from e


def redacted(config: dict[str, object]) -> dict[str, object]:
    """The configuration as server_config shows it: credentials replaced by a mark."""
    return {k: ("<redacted>" if k in SECRET_CONFIG_KEYS and v else v) for k, v in config.items()}
