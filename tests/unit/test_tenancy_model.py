"""The tenancy rules (metadata.tenancy, DESIGN §4.9), pure: who may touch a ledger, who may manage
a tenant, and the metadata a ledger may never change."""

from __future__ import annotations

import dataclasses

import pytest

from metadata import InvalidMetadataError, LedgerMetadata, LedgerState, update_ledger
from metadata.model import DigestType, master_key
from metadata.tenancy import Caller, NamespaceAccess, TenantDoc, authorize, check_actions, check_role, manage_refusal

pytestmark = pytest.mark.unit

ACME = NamespaceAccess("acme", {"billing": frozenset({"produce", "consume"}), "audit": frozenset({"consume"})})


def decide(who: str, action: str, namespace: str = "payments", owner: str = "", access=ACME, admins=frozenset(),
           claim: str = "client") -> str | None:
    return authorize(Caller(who, claim), action, ledger_id=7, namespace=namespace, owner_role=owner, access=access,
                     tenant_admins=admins)


def test_grants_decide_per_action_and_tenant_admins_and_privileged_roles_pass():
    assert decide("billing", "produce") is None and decide("billing", "consume") is None
    assert decide("audit", "consume") is None
    why = decide("audit", "produce")
    assert why is not None and "'audit'" in why and "'produce'" in why and "'payments'" in why
    assert decide("nobody", "consume") is not None
    assert decide("boss", "produce", admins=frozenset({"boss"})) is None
    assert decide("root", "produce", claim="admin") is None and decide("svc", "consume", claim="service") is None
    assert "no longer exists" in decide("billing", "consume", access=None)


def test_a_ledger_outside_namespaces_is_its_creators_and_an_old_one_the_superusers():
    assert decide("alice", "consume", namespace="", owner="alice") is None
    assert "belongs to role 'alice'" in decide("bob", "consume", namespace="", owner="alice")
    assert "predates tenants" in decide("alice", "consume", namespace="", owner="")
    assert decide("root", "consume", namespace="", owner="", claim="admin") is None


def test_manage_rules_and_bad_names_and_actions():
    assert manage_refusal(Caller("root", "admin"), "x", "acme", frozenset()) is None
    assert manage_refusal(Caller("boss"), "x", "acme", frozenset({"boss"})) is None
    assert manage_refusal(Caller("svc", "service"), "x", "acme", frozenset()) is not None   # service manages nothing
    for bad in ("", "a:b", "a/b", "a b", "..", "x" * 300, 5):
        with pytest.raises(InvalidMetadataError):
            check_role(bad)
    for bad in ([], ["read"], "produce,delete"):
        with pytest.raises(InvalidMetadataError):
            check_actions(bad)
    assert check_actions("produce, consume") == {"produce", "consume"}
    assert TenantDoc.decode(TenantDoc(frozenset({"a"})).encode()) == TenantDoc(frozenset({"a"}))
    assert NamespaceAccess.from_json(ACME.to_json()) == ACME
    with pytest.raises(InvalidMetadataError):
        NamespaceAccess.from_json({"tenant": "t", "permissions": {"r": ["fly"]}})


class _Store:
    def __init__(self, md: LedgerMetadata) -> None:
        self.md, self.version = md, 0

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return self.md, self.version

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        self.md, self.version = md, version + 1
        return self.version


def test_the_update_loop_never_changes_a_ledgers_namespace_or_creator_except_to_stamp_an_old_one():
    md = LedgerMetadata(ledger_id=1, state=LedgerState.OPEN, ensemble_size=1, write_quorum_size=1,
                        ack_quorum_size=1, last_entry_id=-1, length=0, ensembles={0: ["b:1"]},
                        digest_type=DigestType.CRC32C, password_hash=master_key(b""), ctime=0)
    store = _Store(md)
    update_ledger(store, 1, lambda m: dataclasses.replace(m, namespace="ns"))          # an old ledger: stamped
    with pytest.raises(InvalidMetadataError):
        update_ledger(store, 1, lambda m: dataclasses.replace(m, namespace="other"))
    update_ledger(store, 1, lambda m: dataclasses.replace(m, owner_role="alice"))
    with pytest.raises(InvalidMetadataError):
        update_ledger(store, 1, lambda m: dataclasses.replace(m, owner_role="mallory"))
    assert (store.md.namespace, store.md.owner_role) == ("ns", "alice")
    from metadata import decode, encode

    assert (lambda m: (m.namespace, m.owner_role))(decode(encode(store.md), 1)) == ("ns", "alice")
