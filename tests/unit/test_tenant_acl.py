"""The ACL each node gets under the per-tenant ZooKeeper scheme (metadata.zk.tenant_acl): pure,
from a path and its data, over an in-memory view of the few nodes the policy reads."""

from __future__ import annotations

import pytest
from kazoo.security import Permissions as P

from metadata import LedgerMetadata, LedgerState, encode
from metadata.model import DigestType, master_key
from metadata.streams import encode_settings
from metadata.tenancy import NamespaceAccess, TenantDoc
from metadata.zk.tenant_acl import TenantAclPolicy, digest_id, security_doc

pytestmark = pytest.mark.unit

ROOT = "/c/ledgers"
SUPER, MEMBERS = "cluster:pw", "members:pw"
ROLES = {"boss": "boss:1", "billing": "billing:2", "audit": "audit:3", "alice": "alice:4"}


def policy(active: bool = True) -> TenantAclPolicy:
    access = NamespaceAccess("acme", {"billing": frozenset({"produce", "consume"}), "audit": frozenset({"consume"})})
    nodes = {f"{ROOT}/streams/payments": encode_settings({}, access.to_json()),
             f"{ROOT}/tenants/acme": TenantDoc(frozenset({"boss"})).encode(),
             **{f"{ROOT}/roles/{r}": digest_id(a).encode() for r, a in ROLES.items()}}
    if active:
        nodes[f"{ROOT}/SECURITY"] = security_doc(SUPER, MEMBERS)
    return TenantAclPolicy(ROOT, nodes.get)


def perms(acl) -> dict[str, int]:
    ids = {digest_id(SUPER): "super", digest_id(MEMBERS): "members", **{digest_id(a): r for r, a in ROLES.items()}}
    return {ids[a.id.id]: a.perms for a in acl}


def ledger(namespace: str = "", owner: str = "") -> bytes:
    return encode(LedgerMetadata(ledger_id=1, state=LedgerState.OPEN, ensemble_size=1, write_quorum_size=1,
                                 ack_quorum_size=1, last_entry_id=-1, length=0, ensembles={0: ["b:1"]},
                                 digest_type=DigestType.CRC32C, password_hash=master_key(b""), ctime=0,
                                 namespace=namespace, owner_role=owner))


def test_off_until_the_security_record_exists():
    assert policy(active=False).acl_for(f"{ROOT}/streams/x") is None


def test_structure_lets_members_list_draw_ids_and_mark_but_read_nothing_of_a_namespace():
    p = policy()
    assert perms(p.acl_for(ROOT)) == {"super": P.ALL, "members": P.READ | P.CREATE}
    assert perms(p.acl_for("/c")) == {"super": P.ALL, "members": P.READ}              # outside the root
    assert perms(p.acl_for(f"{ROOT}/available/b:1")) == {"super": P.ALL, "members": P.READ}
    assert perms(p.acl_for(f"{ROOT}/idgen-long"))["members"] == P.ALL & ~P.ADMIN   # the id counter is written
    assert perms(p.acl_for(f"{ROOT}/underreplication/ledgers/0000"))["members"] == P.ALL & ~P.ADMIN
    assert perms(p.acl_for(f"{ROOT}/underreplication/disable"))["members"] == P.READ
    assert perms(p.acl_for(f"{ROOT}/000/0000"))["members"] == P.READ | P.CREATE       # a bucket


def test_a_namespace_admits_its_admins_producers_and_consumers_and_its_ledgers_likewise():
    p = policy()
    top = perms(p.acl_for(f"{ROOT}/streams/payments"))
    assert top == {"super": P.ALL, "boss": P.ALL, "billing": P.READ | P.CREATE | P.DELETE, "audit": P.READ}
    below = perms(p.acl_for(f"{ROOT}/streams/payments/orders/segments/1"))
    assert below["billing"] == P.ALL & ~P.ADMIN and below["audit"] == P.READ and "members" not in below
    path = f"{ROOT}/000/0000/0000/0000/L0001"
    assert perms(p.acl_for(path, ledger("payments"))) == {
        "super": P.ALL, "boss": P.READ | P.WRITE | P.ADMIN, "billing": P.READ | P.WRITE, "audit": P.READ}
    assert perms(p.acl_for(path, ledger(owner="alice"))) == {"super": P.ALL, "alice": P.READ | P.WRITE}
    assert perms(p.acl_for(path, ledger(owner="nobody-registered"))) == {"super": P.ALL}


def test_consumers_keep_their_streams_subscriptions_and_nothing_else_of_the_stream():
    p = policy()
    for path in (f"{ROOT}/streams/payments/orders/subscriptions", f"{ROOT}/streams/payments/orders/subscriptions/etl"):
        got = perms(p.acl_for(path))
        assert got["audit"] == P.ALL & ~P.ADMIN and got["billing"] == P.ALL & ~P.ADMIN, path
    assert perms(p.acl_for(f"{ROOT}/streams/payments/orders"))["audit"] == P.READ
