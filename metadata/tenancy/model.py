"""Tenants, grants and who may touch a ledger (DESIGN §4.9, Pulsar's model): pure, no I/O.

A **tenant** owns namespaces and names its admin roles; a namespace records its tenant and, per
role, the actions granted (``produce``, ``consume``). A **role** is the ``sub`` of a client's token;
a token whose ``role`` claim is ``admin`` is a superuser and one whose claim is ``service`` is the
cluster's own identity (bookies, re-replication, the auditor, tiering): both pass every check.

The same :func:`authorize` decides on the bookie (every add, read, fence and long poll, against the
ledger's recorded namespace) and in the client (before it asks, so a refusal names the role, the
namespace and the missing action even where the bookies would only answer EUA). Tenant admins
hold both actions on their tenant's namespaces: managing grants would give them those anyway.

A ledger records its namespace (``""`` outside namespaces) and its creator's role at creation;
neither changes afterwards (the metadata transitions keep them). A ledger outside namespaces is
its creator's role's alone; one that predates tenants (no creator recorded) is the superusers'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from metadata.errors import InvalidMetadataError

PRODUCE = "produce"
CONSUME = "consume"
ACTIONS = frozenset({PRODUCE, CONSUME})
PUBLIC_TENANT = "public"       # where namespaces made without a tenant (and before tenants) live
SUPERUSER_ROLE = "admin"       # the token role claim of superusers
SERVICE_ROLE = "service"       # the token role claim of the cluster's own processes
ROLE_NAME_BYTES_MAX = 255
FORMAT = 1


def check_role(role: object) -> str:
    """A role name: a non-empty string of printable characters without ``:`` or ``/`` (it becomes
    part of ZooKeeper digest identities and znode names), at most 255 bytes."""
    if (not isinstance(role, str) or not role or len(role.encode()) > ROLE_NAME_BYTES_MAX
            or not role.isprintable() or any(c in role for c in ":/ ") or role in (".", "..")):
        raise InvalidMetadataError(f"bad role name {role!r}: want printable characters without ':', '/' or "
                                   f"spaces, at most {ROLE_NAME_BYTES_MAX} bytes")
    return role


def check_actions(actions: Iterable[str]) -> frozenset[str]:
    """The actions of a grant: a non-empty subset of :data:`ACTIONS`."""
    if isinstance(actions, str):
        actions = [a.strip() for a in actions.split(",") if a.strip()]
    got = frozenset(actions)
    if not got or not got <= ACTIONS:
        raise InvalidMetadataError(f"bad actions {sorted(got)!r}: want one or more of {sorted(ACTIONS)}")
    return got


@dataclass(frozen=True)
class TenantDoc:
    """What a tenant's znode holds: its admin roles."""

    admin_roles: frozenset[str] = frozenset()

    def encode(self) -> bytes:
        return json.dumps({"v": FORMAT, "admin_roles": sorted(self.admin_roles)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, what: str = "tenant") -> TenantDoc:
        d = _loads(data, what)
        roles = d.get("admin_roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise InvalidMetadataError(f"{what}: admin_roles must be a list of role names")
        return cls(frozenset(roles))


@dataclass(frozen=True)
class NamespaceAccess:
    """A namespace's tenant and grants (role -> actions), kept in the namespace's znode beside its
    settings. Changed only by the pure functions below, through one CAS."""

    tenant: str = PUBLIC_TENANT
    permissions: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def actions_of(self, role: str) -> frozenset[str]:
        return self.permissions.get(role, frozenset())

    def granted(self, role: str, actions: Iterable[str]) -> NamespaceAccess:
        """Grant ``actions`` to ``role`` (replacing what it had, as Pulsar's grant does)."""
        perms = dict(self.permissions)
        perms[check_role(role)] = check_actions(actions)
        return NamespaceAccess(self.tenant, perms)

    def revoked(self, role: str) -> NamespaceAccess:
        """Everything ``role`` was granted gone (no change if it had nothing)."""
        perms = {r: a for r, a in self.permissions.items() if r != role}
        return NamespaceAccess(self.tenant, perms)

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "permissions": {r: sorted(a) for r, a in sorted(self.permissions.items())}}

    @classmethod
    def from_json(cls, d: object, what: str = "namespace") -> NamespaceAccess:
        """The access of a namespace doc's ``access`` field; a namespace from before tenants has
        none and is in tenant ``public`` with no grants."""
        if d is None:
            return cls()
        if not isinstance(d, dict) or not isinstance(d.get("tenant", PUBLIC_TENANT), str):
            raise InvalidMetadataError(f"{what}: bad access record")
        perms = d.get("permissions", {})
        if not isinstance(perms, dict):
            raise InvalidMetadataError(f"{what}: permissions must map roles to actions")
        try:
            return cls(d.get("tenant", PUBLIC_TENANT), {str(r): check_actions(a) for r, a in perms.items()})
        except (InvalidMetadataError, TypeError) as e:
            raise InvalidMetadataError(f"{what}: bad permissions: {e}") from e


@dataclass(frozen=True)
class Caller:
    """Who asks: a token's ``sub`` and its ``role`` claim (``client``, ``admin`` or ``service``)."""

    subject: str
    role_claim: str = "client"

    @property
    def privileged(self) -> bool:
        return self.role_claim in (SUPERUSER_ROLE, SERVICE_ROLE)


def authorize(caller: Caller, action: str, *, ledger_id: int, namespace: str, owner_role: str,
              access: NamespaceAccess | None, tenant_admins: frozenset[str] = frozenset()) -> str | None:
    """Why ``caller`` may not do ``action`` on the ledger (None: it may). ``access`` is the
    ledger's namespace's (None when the namespace is gone), ``tenant_admins`` its tenant's."""
    if caller.privileged:
        return None
    who = caller.subject
    if not namespace:
        if owner_role and owner_role == who:
            return None
        owner = f"role {owner_role!r}" if owner_role else "no recorded role (it predates tenants)"
        return (f"role {who!r} may not {action} ledger {ledger_id}: it is outside namespaces and belongs to "
                f"{owner} (missing action {action!r})")
    if access is None:
        return f"role {who!r} may not {action} ledger {ledger_id}: its namespace {namespace!r} no longer exists"
    if who in tenant_admins or action in access.actions_of(who):
        return None
    return (f"role {who!r} has no {action!r} permission on namespace {namespace!r} "
            f"(ledger {ledger_id}; tenant {access.tenant!r})")


def namespace_refusal(caller: Caller, action: str, namespace: str, access: NamespaceAccess,
                      tenant_admins: frozenset[str]) -> str | None:
    """Why ``caller`` may not do ``action`` on namespace ``namespace`` (None: it may): the check a
    client makes before it touches a namespace's streams."""
    if caller.privileged or caller.subject in tenant_admins or action in access.actions_of(caller.subject):
        return None
    return (f"role {caller.subject!r} has no {action!r} permission on namespace {namespace!r} "
            f"(tenant {access.tenant!r})")


def manage_refusal(caller: Caller, what: str, tenant: str, tenant_admins: frozenset[str]) -> str | None:
    """Why ``caller`` may not manage tenant ``tenant`` (its namespaces and their grants)."""
    if caller.role_claim == SUPERUSER_ROLE or caller.subject in tenant_admins:
        return None
    return f"role {caller.subject!r} may not {what}: it is neither a superuser nor an admin of tenant {tenant!r}"


def _loads(data: bytes, what: str) -> dict[str, Any]:
    try:
        d = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidMetadataError(f"{what}: not a JSON record ({e})") from e
    if not isinstance(d, dict):
        raise InvalidMetadataError(f"{what}: not a JSON object")
    if int(d.get("v", FORMAT)) > FORMAT:
        raise InvalidMetadataError(f"{what}: format {d['v']} is newer than this release reads ({FORMAT})")
    return d
