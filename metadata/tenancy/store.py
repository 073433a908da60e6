"""The tenant store (``store.tenants``): tenants, and the access record of each namespace.

Layout: ``<root>/tenants/<tenant>`` holds a :class:`~metadata.tenancy.model.TenantDoc` (its admin
roles); a namespace's tenant and grants live in the namespace's own znode
(``<root>/streams/<ns>``, beside its settings), so a grant is one CAS on the node a bookie already
watches, and a namespace can never name grants that another write half-applied.

Written once on the node layer (:mod:`metadata.nodes`) for ZooKeeper and the in-memory twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metadata.errors import BadVersionError, MetadataError, MetadataUpdateConflictError, NodeExistsError, NoNodeError
from metadata.layout import ZkLayout
from metadata.nodes import Nodes, Wake
from metadata.streams.model import check_name, decode_access, decode_segment, decode_settings, encode_settings
from metadata.streams.store import SEGMENTS, STREAMS, NamespaceGoneError
from metadata.tenancy.model import NamespaceAccess, TenantDoc

TENANTS = "tenants"
CAS_TRIES_MAX = 20


class TenantGoneError(MetadataError):
    """The tenant does not exist."""


class TenantStore:
    def __init__(self, nodes: Nodes, paths: ZkLayout) -> None:
        self._nodes = nodes
        self._paths = paths

    def _root(self) -> str:
        return f"{self._paths.root}/{TENANTS}"

    def tenant_path(self, name: str) -> str:
        return f"{self._root()}/{check_name(name, 'tenant')}"

    def namespace_path(self, ns: str) -> str:
        return f"{self._paths.root}/{STREAMS}/{check_name(ns, 'namespace')}"

    # -- tenants --------------------------------------------------------------------------------
    def create_tenant(self, name: str, doc: TenantDoc) -> None:
        """NodeExistsError if it exists."""
        path = self.tenant_path(name)
        try:
            self._nodes.create(self._root())
        except NodeExistsError:
            pass
        self._nodes.create(path, doc.encode())

    def read_tenant(self, name: str) -> tuple[TenantDoc, int] | None:
        got = self._nodes.get(self.tenant_path(name))
        return None if got is None else (TenantDoc.decode(got[0], f"tenant {name}"), got[1])

    def watch_tenant(self, name: str, wake: Wake) -> TenantDoc | None:
        """The tenant as read now, with a one-shot watch on its next change (or creation)."""
        got = self._nodes.watch(self.tenant_path(name), wake)
        return None if got is None else TenantDoc.decode(got[0], f"tenant {name}")

    def write_tenant(self, name: str, doc: TenantDoc, version: int) -> int:
        """CAS; BadVersionError if changed, TenantGoneError if absent."""
        try:
            return self._nodes.set(self.tenant_path(name), doc.encode(), version)
        except NoNodeError as e:
            raise TenantGoneError(f"tenant {name!r} does not exist") from e

    def list_tenants(self) -> list[str]:
        return sorted(self._nodes.children(self._root()) or [])

    def delete_tenant(self, name: str) -> None:
        """TenantGoneError if absent (whether it is empty is the caller's check)."""
        try:
            self._nodes.delete(self.tenant_path(name), retry=False)
        except NoNodeError as e:
            raise TenantGoneError(f"tenant {name!r} does not exist") from e

    # -- namespace access ----------------------------------------------------------------------
    def read_access(self, ns: str) -> tuple[NamespaceAccess, int] | None:
        """The namespace's access record and znode version (None: no such namespace)."""
        got = self._nodes.get(self.namespace_path(ns))
        if got is None:
            return None
        return NamespaceAccess.from_json(decode_access(got[0], f"namespace {ns}"), f"namespace {ns}"), got[1]

    def read_grants(self, ns: str) -> tuple[NamespaceAccess, frozenset[str]] | None:
        """The namespace's access record and its tenant's admin roles: what decides who may do
        what in it (None: no such namespace)."""
        got = self.read_access(ns)
        if got is None:
            return None
        tenant = self.read_tenant(got[0].tenant)
        return got[0], tenant[0].admin_roles if tenant is not None else frozenset()

    def watch_access(self, ns: str, wake: Wake) -> NamespaceAccess | None:
        """The namespace's access as read now, with a one-shot watch on its next change."""
        got = self._nodes.watch(self.namespace_path(ns), wake)
        if got is None:
            return None
        return NamespaceAccess.from_json(decode_access(got[0], f"namespace {ns}"), f"namespace {ns}")

    def watch_settings(self, ns: str, wake: Wake) -> dict[str, Any] | None:
        """The namespace's settings (their JSON) as read now, with a one-shot watch on the node's
        next change: what bookies enforce of them (write rates) follows a change at once."""
        got = self._nodes.watch(self.namespace_path(ns), wake)
        if got is None:
            return None
        return decode_settings(got[0], f"namespace {ns}")

    def enable_zk_acls(self, member_auth: str) -> int:
        """Turn the per-tenant ZooKeeper ACLs on (this session: the superuser's zk_auth), with
        ``member_auth`` the members' credentials every role's client config carries; how many
        nodes were given their ACL."""
        return self._nodes.enable_tenant_acls(self._paths.root, member_auth)

    def register_role(self, role: str, role_auth: str) -> None:
        """Record the role's ZooKeeper identity (its public digest) so that grants can name it in
        ACLs; NodeExistsError when registered already (a role's credentials never change)."""
        self._nodes.register_role(self._paths.root, role, role_auth)

    def reapply_acls(self, ns: str) -> int:
        """Give the namespace's nodes and its segments' ledgers the ZooKeeper ACLs its grants give
        now (metadata.zk.tenant_acl; nothing to do without the tenant scheme); how many were set.
        Parents come before their children, so a creator racing the walk inherits nothing stale
        from a parent already done."""
        if not self._nodes.tenant_acls_active():
            return 0
        top = self.namespace_path(ns)
        paths, stack = [], [top]
        ledgers: set[int] = set()
        while stack:
            path = stack.pop()
            paths.append(path)
            kids = self._nodes.children(path) or []
            stack.extend(f"{path}/{k}" for k in sorted(kids, reverse=True))
            if path.rsplit("/", 2)[-2:-1] == [SEGMENTS]:
                got = self._nodes.get(path)
                if got is not None:
                    lid = decode_segment(got[0], path).ledger_id
                    if lid is not None:
                        ledgers.add(lid)
        paths += [self._paths.ledger(lid) for lid in sorted(ledgers)]
        return self._nodes.apply_tenant_acls(paths)

    def update_access(self, ns: str, change: Callable[[NamespaceAccess], NamespaceAccess]) -> NamespaceAccess:
        """Apply the pure ``change`` to the namespace's access by CAS on its znode (the settings
        beside it kept as they are), retried on a lost race; NamespaceGoneError if absent."""
        path = self.namespace_path(ns)
        for _ in range(CAS_TRIES_MAX):
            got = self._nodes.get(path)
            if got is None:
                raise NamespaceGoneError(f"namespace {ns!r} does not exist")
            data, version = got[0], got[1]
            what = f"namespace {ns}"
            new = change(NamespaceAccess.from_json(decode_access(data, what), what))
            try:
                self._nodes.set(path, encode_settings(decode_settings(data, what), new.to_json()), version)
                return new
            except BadVersionError:
                continue
            except NoNodeError as e:
                raise NamespaceGoneError(f"namespace {ns!r} does not exist") from e
        raise MetadataUpdateConflictError(f"namespace {ns!r}: access changed {CAS_TRIES_MAX} times under the update")
