"""Tenants and permissions (DESIGN §4.9): the pure model (:mod:`metadata.tenancy.model`: grants,
:func:`authorize`) and the store on the node layer (:mod:`metadata.tenancy.store`,
``store.tenants``)."""

from metadata.tenancy.model import (
    ACTIONS,
    CONSUME,
    PRODUCE,
    PUBLIC_TENANT,
    SERVICE_ROLE,
    SUPERUSER_ROLE,
    Caller,
    NamespaceAccess,
    TenantDoc,
    authorize,
    check_actions,
    check_role,
    manage_refusal,
    namespace_refusal,
)
from metadata.tenancy.store import TenantGoneError, TenantStore

__all__ = ["ACTIONS", "CONSUME", "PRODUCE", "PUBLIC_TENANT", "SERVICE_ROLE", "SUPERUSER_ROLE", "Caller",
           "NamespaceAccess", "TenantDoc", "TenantGoneError", "TenantStore", "authorize", "check_actions",
           "check_role", "manage_refusal", "namespace_refusal"]
