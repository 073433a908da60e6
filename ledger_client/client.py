"""LedgerClient, the public client (DESIGN §4.1, §4.5): ledgers, and namespaces and streams on them.

The ledger operations are LedgerCore's (core.py), which every handle holds and which knows nothing
of streams; this class adds the namespace operations, whose work is done in stream/namespace.py.
It is the one place where the two meet: ledger code never imports stream code (the layout rule in
tests/unit/layout_check.py), and stream code reaches ledgers only through this client.

A subclass of the core rather than a wrapper around it, so that the object a caller holds is the one
its handles call back (tools pass the public client to LedgerRecovery, tests intercept its metadata
calls): forwarding every ledger member through a second object would split that identity.
"""

from __future__ import annotations

from .core import LedgerCore
from .stream import namespace as namespaces
from .stream import tenants
from .stream.namespace import Namespace
from .stream.tenants import TenantInfo


class LedgerClient(LedgerCore):
    """The synchronous, thread-safe client. `zk` is "host:port[,host:port][/root]" or "zk://...".

    `metadata_store` lets tests and the simulator pass an in-memory twin instead of ZooKeeper.
    """

    def create_namespace(self, name: str, tenant: str = "public", **settings: object) -> Namespace:
        """A new namespace of ``tenant`` with its settings (NamespaceSettings' fields);
        NamespaceExistsError if it exists. With authentication on, superusers and the tenant's admin
        roles only."""
        self._check_open()
        return namespaces.create_namespace(self, name, tenant, **settings)

    # -- tenants (DESIGN §4.9) ---------------------------------------------------------------------
    def create_tenant(self, name: str, admin_roles: list[str] | tuple[str, ...] = ()) -> None:
        """A tenant whose ``admin_roles`` manage its namespaces and grants (superusers only)."""
        self._check_open()
        tenants.create_tenant(self, name, admin_roles)

    def update_tenant(self, name: str, admin_roles: list[str] | tuple[str, ...]) -> None:
        """Replace the tenant's admin roles (superusers only)."""
        self._check_open()
        tenants.update_tenant(self, name, admin_roles)

    def list_tenants(self) -> list[str]:
        self._check_open()
        return tenants.list_tenants(self)

    def tenant_info(self, name: str) -> TenantInfo:
        """Its admin roles and namespaces; NoSuchTenantError if absent."""
        self._check_open()
        return tenants.tenant_info(self, name)

    def delete_tenant(self, name: str) -> None:
        """TenantNotEmptyError while it owns namespaces (superusers only)."""
        self._check_open()
        tenants.delete_tenant(self, name)

    def namespace(self, name: str) -> Namespace:
        """NoSuchNamespaceError if absent."""
        self._check_open()
        return namespaces.get_namespace(self, name)

    def list_namespaces(self) -> list[str]:
        return namespaces.list_namespaces(self)

    def delete_namespace(self, name: str, force: bool = False) -> None:
        """NamespaceNotEmptyError while it has streams, unless ``force`` (they are deleted too)."""
        self._check_open()
        namespaces.delete_namespace(self, name, force)
