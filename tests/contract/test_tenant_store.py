"""The tenant store's contract (``store.tenants``), on ZooKeeper and on the in-memory twin: tenants,
a namespace's access record kept beside its settings, and the watches bookies rely on to learn a
revoke."""

from __future__ import annotations

import threading

import pytest

from metadata import BadVersionError, MetadataStore, NodeExistsError
from metadata.streams import NamespaceGoneError, decode_settings, encode_settings
from metadata.tenancy import NamespaceAccess, TenantDoc, TenantGoneError


def test_tenants_are_created_listed_changed_by_cas_and_deleted(store: MetadataStore):
    t = store.tenants
    assert t.list_tenants() == [] and t.read_tenant("acme") is None
    t.create_tenant("acme", TenantDoc(frozenset({"a1"})))
    with pytest.raises(NodeExistsError):
        t.create_tenant("acme", TenantDoc())
    doc, version = t.read_tenant("acme")
    assert doc.admin_roles == {"a1"}
    t.write_tenant("acme", TenantDoc(frozenset({"a2"})), version)
    with pytest.raises(BadVersionError):
        t.write_tenant("acme", TenantDoc(), version)
    t.create_tenant("globex", TenantDoc())
    assert t.list_tenants() == ["acme", "globex"]
    t.delete_tenant("globex")
    with pytest.raises(TenantGoneError):
        t.delete_tenant("globex")
    with pytest.raises(TenantGoneError):
        t.write_tenant("globex", TenantDoc(), 0)


def test_access_lives_beside_the_settings_and_a_namespace_from_before_tenants_is_public(store: MetadataStore):
    store.streams.create_namespace("old", encode_settings({"ensemble_size": 3}))
    access, _ = store.tenants.read_access("old")
    assert access == NamespaceAccess("public", {})
    new = store.tenants.update_access("old", lambda a: a.granted("billing", ["consume"]))
    assert new.actions_of("billing") == {"consume"}
    data, _ = store.streams.read_namespace("old")
    assert decode_settings(data) == {"ensemble_size": 3}        # the settings kept as they were
    assert store.tenants.read_access("old")[0].permissions == {"billing": frozenset({"consume"})}
    store.tenants.update_access("old", lambda a: a.revoked("billing"))
    assert store.tenants.read_access("old")[0].permissions == {}
    assert store.tenants.read_access("absent") is None
    with pytest.raises(NamespaceGoneError):
        store.tenants.update_access("absent", lambda a: a)


def test_a_watch_on_the_access_fires_on_a_grant_and_on_a_tenant_change(store: MetadataStore):
    store.streams.create_namespace("ns", encode_settings({}, NamespaceAccess("acme").to_json()))
    store.tenants.create_tenant("acme", TenantDoc())
    fired = {"ns": threading.Event(), "tenant": threading.Event()}
    assert store.tenants.watch_access("ns", lambda _e: fired["ns"].set()).tenant == "acme"
    assert store.tenants.watch_tenant("acme", lambda _e: fired["tenant"].set()).admin_roles == frozenset()
    store.tenants.update_access("ns", lambda a: a.granted("r", ["produce"]))
    store.tenants.write_tenant("acme", TenantDoc(frozenset({"boss"})), -1)
    assert fired["ns"].wait(10) and fired["tenant"].wait(10)
