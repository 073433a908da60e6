"""Tenants, and who may manage them and use their namespaces (DESIGN §4.9, Pulsar's model).

The client's checks here name the role, the namespace and the missing action before anything is
asked of the cluster; the cluster enforces the same rules where the data is (bookies against each
ledger's recorded namespace, metadata.tenancy.authorize). With no token the client checks nothing,
as an open cluster checks nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metadata import LedgerMetadata, NodeExistsError
from metadata.streams import decode_access
from metadata.tenancy import (
    PUBLIC_TENANT,
    SUPERUSER_ROLE,
    NamespaceAccess,
    TenantDoc,
    check_role,
    manage_refusal,
    namespace_refusal,
)

from .. import errors
from ..metadata_errors import metadata_errors
from .meta import check_names

if TYPE_CHECKING:
    from ..core import LedgerCore


@dataclass(frozen=True)
class TenantInfo:
    name: str
    admin_roles: list[str]
    namespaces: list[str]


def _admins(client: LedgerCore, tenant: str) -> frozenset[str] | None:
    """The tenant's admin roles (None: no such tenant)."""
    with metadata_errors(f"read tenant {tenant}"):
        got = client.store.tenants.read_tenant(tenant)
    return None if got is None else got[0].admin_roles


def denied_namespace(client: LedgerCore, ns: str) -> str:
    """What ZooKeeper refusing a namespace's node to this client means (DESIGN §4.9)."""
    caller = client.caller
    who = f"role {caller.subject!r}" if caller is not None else "this client (no token)"
    return f"{who} has no permission on namespace {ns!r} (neither 'consume' nor 'produce')"


def _access(client: LedgerCore, ns: str) -> NamespaceAccess:
    with metadata_errors(f"read namespace {ns}", denied=denied_namespace(client, ns)):
        got = client.store.tenants.read_access(ns)
    if got is None:
        raise errors.NoSuchNamespaceError(f"namespace {ns!r} does not exist")
    return got[0]


def require_superuser(client: LedgerCore, what: str) -> None:
    caller = client.caller
    if caller is not None and caller.role_claim != SUPERUSER_ROLE:
        raise errors.UnauthorizedAccessError(f"role {caller.subject!r} may not {what}: superusers only")


def require_tenant_admin(client: LedgerCore, tenant: str, what: str) -> frozenset[str]:
    """The tenant's admin roles, once this client's role may manage the tenant."""
    admins = _admins(client, tenant)
    if admins is None:
        raise errors.NoSuchTenantError(f"tenant {tenant!r} does not exist")
    caller = client.caller
    if caller is not None:
        why = manage_refusal(caller, what, tenant, admins)
        if why is not None:
            raise errors.UnauthorizedAccessError(why)
    return admins


def require_manage(client: LedgerCore, ns: str, what: str) -> NamespaceAccess:
    """The namespace's access, once this client's role may manage it (superuser or tenant admin)."""
    access = _access(client, ns)
    caller = client.caller
    if caller is not None:
        why = manage_refusal(caller, what, access.tenant, _admins(client, access.tenant) or frozenset())
        if why is not None:
            raise errors.UnauthorizedAccessError(why)
    return access


def require_namespace(client: LedgerCore, ns: str, *actions: str) -> None:
    """UnauthorizedAccessError (naming the first action) unless this client's role may do one of
    ``actions`` in the namespace."""
    caller = client.caller
    if caller is None or caller.privileged:
        return
    access = _access(client, ns)
    admins = _admins(client, access.tenant) or frozenset()
    refusals = [namespace_refusal(caller, action, ns, access, admins) for action in actions]
    if all(why is not None for why in refusals):
        raise errors.UnauthorizedAccessError(str(refusals[0]))


def create_public_tenant(client: LedgerCore) -> None:
    """Make tenant ``public`` (no admin roles: superusers manage it) unless it exists."""
    try:
        with metadata_errors("create tenant public"):
            client.store.tenants.create_tenant(PUBLIC_TENANT, TenantDoc())
    except errors.MetadataServiceError as e:
        if not isinstance(e.__cause__, NodeExistsError):
            raise


def create_tenant(client: LedgerCore, name: str, admin_roles: list[str] | tuple[str, ...] = ()) -> None:
    """A tenant whose ``admin_roles`` manage its namespaces and their grants (superusers only)."""
    check_names((name, "tenant"))
    roles = _roles(admin_roles)
    require_superuser(client, f"create tenant {name!r}")
    with metadata_errors(f"create tenant {name}", exists=errors.TenantExistsError):
        client.store.tenants.create_tenant(name, TenantDoc(roles))


def update_tenant(client: LedgerCore, name: str, admin_roles: list[str] | tuple[str, ...]) -> None:
    """Replace the tenant's admin roles (superusers only)."""
    check_names((name, "tenant"))
    roles = _roles(admin_roles)
    require_superuser(client, f"change tenant {name!r}")
    with metadata_errors(f"change tenant {name}"):
        got = client.store.tenants.read_tenant(name)
        if got is None:
            raise errors.NoSuchTenantError(f"tenant {name!r} does not exist")
        client.store.tenants.write_tenant(name, TenantDoc(roles), got[1])
        for ns in tenant_namespaces(client, name):   # its admins' ZooKeeper ACLs (tenant scheme)
            client.store.tenants.reapply_acls(ns)


def list_tenants(client: LedgerCore) -> list[str]:
    with metadata_errors("list tenants"):
        return client.store.tenants.list_tenants()


def tenant_namespaces(client: LedgerCore, tenant: str) -> list[str]:
    """The namespaces ``tenant`` owns (one read per namespace: tenants are few, namespaces tens)."""
    with metadata_errors(f"list the namespaces of tenant {tenant}"):
        owned = []
        for ns in client.store.streams.list_namespaces():
            got = client.store.tenants.read_access(ns)
            if got is not None and got[0].tenant == tenant:
                owned.append(ns)
        return owned


def tenant_info(client: LedgerCore, name: str) -> TenantInfo:
    """Its admin roles and namespaces (superusers and its admin roles)."""
    check_names((name, "tenant"))
    admins = require_tenant_admin(client, name, f"read tenant {name!r}")
    return TenantInfo(name, sorted(admins), tenant_namespaces(client, name))


def delete_tenant(client: LedgerCore, name: str) -> None:
    """TenantNotEmptyError while it owns namespaces (superusers only)."""
    check_names((name, "tenant"))
    require_superuser(client, f"delete tenant {name!r}")
    owned = tenant_namespaces(client, name)
    if owned:
        raise errors.TenantNotEmptyError(f"tenant {name!r} still owns {len(owned)} namespaces "
                                         f"({', '.join(owned[:5])}); delete them first")
    with metadata_errors(f"delete tenant {name}"):
        client.store.tenants.delete_tenant(name)


def migrate_to_tenants(client: LedgerCore, legacy_owner: str | None = None) -> dict[str, int]:
    """Bring a cluster from before tenants under them without touching a record (superusers only):
    tenant ``public`` is made, every namespace without an access record lands in it (no grants:
    superusers grant them), every stream segment's ledger is stamped with its namespace, and with
    ``legacy_owner`` every other ledger that names no creator becomes that role's. Idempotent;
    returns what it changed."""
    require_superuser(client, "migrate the cluster to tenants")
    if legacy_owner is not None:
        (legacy_owner,) = _roles([legacy_owner])
    create_public_tenant(client)
    done = {"namespaces": 0, "segment_ledgers": 0, "legacy_ledgers": 0}
    stamped: set[int] = set()
    with metadata_errors("migrate to tenants"):
        store = client.store
        for ns in store.streams.list_namespaces():
            got = store.streams.read_namespace(ns)
            if got is not None and decode_access(got[0], f"namespace {ns}") is None:
                store.tenants.update_access(ns, lambda a: a)   # writes the default record: tenant public
                done["namespaces"] += 1
            for name in store.streams.list_streams(ns):
                view = store.streams.read_stream(ns, name)
                for seg in view.ordered() if view is not None else []:
                    if seg.ledger_id is not None:
                        stamped.add(seg.ledger_id)
                        done["segment_ledgers"] += _stamp(client, seg.ledger_id, namespace=ns)
        if legacy_owner is not None:
            for lid in store.ledgers.list_ledgers():
                if lid not in stamped:
                    done["legacy_ledgers"] += _stamp(client, lid, owner_role=legacy_owner)
    return done


def _stamp(client: LedgerCore, ledger_id: int, *, namespace: str = "", owner_role: str = "") -> int:
    """Record a namespace (or a creator) on a ledger that predates tenants; 1 if it changed."""
    def stamp(md: LedgerMetadata) -> LedgerMetadata:
        if md.namespace or md.owner_role:
            return md
        return dataclasses.replace(md, namespace=namespace, owner_role=owner_role)

    try:
        before = client.ledger_metadata(ledger_id)
        if before.namespace or before.owner_role:
            return 0
        client.update_metadata(ledger_id, stamp)
        return 1
    except errors.NoSuchLedgerError:
        return 0


def _roles(admin_roles: object) -> frozenset[str]:
    if isinstance(admin_roles, str) or not isinstance(admin_roles, list | tuple | set | frozenset):
        raise errors.IncorrectParameterError(f"admin_roles must be a list of role names, not {admin_roles!r}")
    try:
        return frozenset(check_role(r) for r in admin_roles)
    except ValueError as e:
        raise errors.IncorrectParameterError(str(e)) from e


__all__ = ["TenantInfo", "create_tenant", "delete_tenant", "list_tenants", "migrate_to_tenants", "tenant_info",
           "update_tenant"]
