"""Who may touch which ledger, decided on the bookie (DESIGN §4.9, invariant 11).

Clients talk to bookies directly, so a tenant's data is safe only if the bookie checks every add,
read, fence, LAC write and long poll against the ledger's namespace and the caller's grants. The
rule is metadata.tenancy.authorize; this module feeds it, fast:

- a ledger's namespace and creator role are read from its metadata once and kept (they never
  change; server/namespace_view.py, shared with the fair share and the write rates);
- a namespace's grants and a tenant's admin roles are read once and kept until a ZooKeeper watch
  says they changed (or the session dropped and every watch with it), so a revoke reaches every
  bookie within a ZooKeeper round trip, well inside the 5 s the design promises;
- decisions are kept per (role, ledger, action) and dropped whenever any grant changes (a global
  generation), so an add batch costs one dict lookup once its ledger was seen.

A request whose decision is not cached is decided off the event loop (:meth:`refusal_async`), since
a cache miss reads ZooKeeper. ZooKeeper unreachable means "refused" (fail closed), with a message
that says so.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Executor
from typing import Any

from metadata import MetadataError, MetadataStore
from metadata.tenancy import Caller, NamespaceAccess, authorize
from spark_bookie.server.namespace_view import NamespaceView

log = logging.getLogger(__name__)
DECISIONS_MAX = 100_000

_ABSENT = object()


class AccessGate:
    """Thread-safe; one per bookie."""

    def __init__(self, store: MetadataStore, view: NamespaceView | None = None) -> None:
        self._store = store
        self._view = view or NamespaceView(store)
        self._namespaces: dict[str, NamespaceAccess | None] = {}
        self._tenants: dict[str, frozenset[str]] = {}
        self._decisions: dict[tuple[str, str, int, str], str | None] = {}
        self._generation = 0
        self._lock = threading.Lock()

    # -- watches (backend thread: must not block) ----------------------------------------------
    def _namespace_changed(self, event: Any) -> None:
        self._changed(self._namespaces, event)

    def _tenant_changed(self, event: Any) -> None:
        self._changed(self._tenants, event)

    def _changed(self, cache: dict[str, Any], event: Any) -> None:
        """A watched node changed (drop it) or the connection dropped every watch (drop all)."""
        path = getattr(event, "path", None)
        with self._lock:
            if path is None:
                self._namespaces.clear()
                self._tenants.clear()
            else:
                cache.pop(path.rsplit("/", 1)[-1], None)
            self._forget_decisions()

    def _forget_decisions(self) -> None:
        self._decisions = {}
        self._generation += 1

    # -- decisions -------------------------------------------------------------------------------
    def cached_refusal(self, caller: Caller, ledger_id: int, action: str) -> str | None | object:
        """The cached decision (None: allowed; a string: why refused), or ``_ABSENT``."""
        if caller.privileged:
            return None
        return self._decisions.get((caller.subject, caller.role_claim, ledger_id, action), _ABSENT)

    def refusal(self, caller: Caller, ledger_id: int, action: str) -> str | None:
        """Why ``caller`` may not ``action`` the ledger (None: it may). May read ZooKeeper."""
        cached = self.cached_refusal(caller, ledger_id, action)
        if cached is not _ABSENT:
            return cached  # type: ignore[return-value]
        generation = self._generation
        try:
            why = self._decide(caller, ledger_id, action)
        except MetadataError as e:
            return f"cannot check the grants of ledger {ledger_id} ({type(e).__name__}: {e}); refused"
        with self._lock:
            if generation == self._generation:   # no grant changed while deciding
                if len(self._decisions) >= DECISIONS_MAX:
                    self._decisions = {}
                self._decisions[(caller.subject, caller.role_claim, ledger_id, action)] = why
        return why

    async def refusal_async(self, caller: Caller | None, ledger_id: int, action: str, executor: Executor) -> str | None:
        """:meth:`refusal`, deciding off the event loop when the answer is not cached."""
        if caller is None:
            return None
        cached = self.cached_refusal(caller, ledger_id, action)
        if cached is not _ABSENT:
            return cached  # type: ignore[return-value]
        return await asyncio.get_running_loop().run_in_executor(executor, self.refusal, caller, ledger_id, action)

    def _decide(self, caller: Caller, ledger_id: int, action: str) -> str | None:
        owner = self._ledger_owner(ledger_id)
        if owner is None:
            return f"ledger {ledger_id} has no metadata: refused to role {caller.subject!r} (missing action {action!r})"
        namespace, owner_role = owner
        access, admins = None, frozenset[str]()
        if namespace:
            access = self._access(namespace)
            if access is not None:
                admins = self._admins(access.tenant)
        return authorize(caller, action, ledger_id=ledger_id, namespace=namespace, owner_role=owner_role,
                         access=access, tenant_admins=admins)

    def _ledger_owner(self, ledger_id: int) -> tuple[str, str] | None:
        facts = self._view.ledger(ledger_id)
        return None if facts is None else (facts.namespace, facts.owner_role)

    def _access(self, namespace: str) -> NamespaceAccess | None:
        if namespace in self._namespaces:
            return self._namespaces[namespace]
        generation = self._generation
        access = self._store.tenants.watch_access(namespace, self._namespace_changed)
        with self._lock:
            if generation == self._generation:   # else the watch fired meanwhile: read again next time
                self._namespaces[namespace] = access
        return access

    def _admins(self, tenant: str) -> frozenset[str]:
        if tenant in self._tenants:
            return self._tenants[tenant]
        generation = self._generation
        doc = self._store.tenants.watch_tenant(tenant, self._tenant_changed)
        admins = doc.admin_roles if doc is not None else frozenset()
        with self._lock:
            if generation == self._generation:
                self._tenants[tenant] = admins
        return admins
