"""A role's client config (spark_bookie.local.roles, `spark-bookie role create`): the token it holds
verifies with the cluster's key, the TOML loads with ClientConfig.from_toml, the maker's settings
come along but its own credentials do not, the file is private and never silently replaced."""

from __future__ import annotations

import dataclasses
import stat
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ledger_client import ClientConfig
from metadata import connect
from metadata.tenancy import NamespaceAccess
from spark_bookie.local.roles import (
    MAKER_FIELDS,
    RoleConfigError,
    TokenKey,
    client_toml,
    foreign_role_refusal,
    mint_role_token,
    role_client_settings,
    write_role_config,
)
from spark_bookie.server.auth import TokenVerifier

pytestmark = pytest.mark.unit

SECRET = b"role-config-unit-test-secret-0123456789"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "token-secret"
    p.write_bytes(SECRET + b"\n")   # as an editor leaves it: the verifier strips it, so must we
    return p


def test_the_token_names_the_role_and_verifies_with_the_cluster_secret(secret_file):
    key = TokenKey.from_files(str(secret_file))
    p = TokenVerifier.from_files(str(secret_file), "").verify(mint_role_token(key, "billing", ttl_s=60))
    assert (p.subject, p.role) == ("billing", "client")
    svc = TokenVerifier(SECRET, "HS256").verify(mint_role_token(key, "replicator", "service", 60))
    assert svc.role == "service"


def test_an_rs256_private_key_signs_what_its_public_key_verifies(tmp_path):
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "token-key.pem"
    pem.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    token = mint_role_token(TokenKey.from_files(private_key_path=str(pem)), "billing", ttl_s=60)
    assert TokenVerifier(public, "RS256").verify(token).subject == "billing"


@pytest.mark.parametrize("secret,private,words", [
    (None, None, "token key"), ("a", "b", "one of them"), ("/nonexistent/secret", None, "cannot read"),
])
def test_a_missing_or_ambiguous_key_is_one_clear_error(secret, private, words):
    with pytest.raises(RoleConfigError, match=words):
        TokenKey.from_files(secret, private)


def test_a_file_that_is_no_private_key_is_refused(secret_file, tmp_path):
    with pytest.raises(RoleConfigError, match="not a PEM private key"):
        TokenKey.from_files(private_key_path=str(secret_file))
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    with pytest.raises(RoleConfigError, match="empty"):
        TokenKey.from_files(str(empty))


@pytest.mark.parametrize("name,claim,ttl,words", [
    ("a:b", "client", 60, "bad role name"), ("", "client", 60, "bad role name"), ("x y", "client", 60, "bad role"),
    ("ok", "admin", 60, "role claim"), ("ok", "client", 0, "lifetime"), ("ok", "client", float("nan"), "lifetime"),
])
def test_bad_names_claims_and_lifetimes_are_refused(secret_file, name, claim, ttl, words):
    with pytest.raises(RoleConfigError, match=words):
        mint_role_token(TokenKey.from_files(str(secret_file)), name, claim, ttl)


def _maker(tmp_path: Path) -> ClientConfig:
    """A maker's config with every kind of setting, its own token and client certificate among them."""
    for name in ("ca.pem", "me.pem", "me-key.pem"):
        (tmp_path / name).write_text("x")
    return ClientConfig(zk_auth="spark-bookie:pw", auth_token="maker-token", tls_ca_path=str(tmp_path / "ca.pem"),
                        tls_cert_path=str(tmp_path / "me.pem"), tls_key_path=str(tmp_path / "me-key.pem"),
                        zk_session_timeout_ms=7_000, delay_ensemble_change=False, bookie_add_transport="grpc",
                        placement_seed=3)


def test_the_role_config_keeps_the_makers_settings_but_not_its_credentials(tmp_path):
    maker = _maker(tmp_path)
    got = role_client_settings(maker, "role-token")
    assert got == {"zk_session_timeout_ms": 7_000, "delay_ensemble_change": False, "bookie_add_transport": "grpc",
                   "placement_seed": 3, "zk_auth": "spark-bookie:pw", "tls_ca_path": str(tmp_path / "ca.pem"),
                   "auth_token": "role-token"}
    # Generic: every field but the maker's credentials, set away from its default, comes along.
    default = ClientConfig()
    changed = {f.name for f in dataclasses.fields(ClientConfig) if getattr(maker, f.name) != getattr(default, f.name)}
    assert set(got) == (changed - MAKER_FIELDS) | {"auth_token"}
    own = role_client_settings(maker, "t", str(tmp_path / "me.pem"), str(tmp_path / "me-key.pem"))
    assert own["tls_cert_path"] == str(tmp_path / "me.pem")
    with pytest.raises(RoleConfigError, match="would not load"):
        role_client_settings(ClientConfig(), "t", str(tmp_path / "me.pem"), None)
    assert role_client_settings(None, "t") == {"auth_token": "t"}


def test_the_written_file_is_private_loads_and_is_not_replaced_without_force(tmp_path):
    maker = _maker(tmp_path)
    out = tmp_path / "billing.toml"
    write_role_config(out, maker, "tok\"en\\one")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    loaded = ClientConfig.from_toml(out)
    assert loaded.auth_token == "tok\"en\\one" and loaded.zk_auth == "spark-bookie:pw"
    assert loaded.tls_cert_path is None and loaded.auth_token_file is None and loaded.zk_session_timeout_ms == 7_000
    with pytest.raises(RoleConfigError, match="exists; --force"):
        write_role_config(out, maker, "two")
    assert ClientConfig.from_toml(out).auth_token == "tok\"en\\one"
    write_role_config(out, maker, "two", force=True)
    assert ClientConfig.from_toml(out).auth_token == "two" and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no temporary left
    with pytest.raises(RoleConfigError, match="cannot write"):
        write_role_config(tmp_path / "no-such-dir" / "x.toml", maker, "t")


def test_toml_strings_survive_control_characters_and_unicode(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(client_toml({"zk_auth": "user:pä\tss\x7f\u2603\U0001f600", "auth_token": "t"}))
    assert ClientConfig.from_toml(path).zk_auth == "user:pä\tss\x7f\u2603\U0001f600"


def test_a_role_another_tenant_names_is_not_for_a_tenant_admin_to_mint():
    from metadata.tenancy import TenantDoc

    store = connect(f"memory://roles-{uuid.uuid4().hex}/ledgers")
    try:
        store.cluster.init_cluster()
        store.tenants.create_tenant("acme", TenantDoc(frozenset({"acme-admin"})))
        store.tenants.create_tenant("globex", TenantDoc(frozenset({"gx-admin"})))
        from metadata.streams.model import encode_settings

        store.streams.create_namespace("gx-data", encode_settings({}, NamespaceAccess("globex").to_json()))
        store.tenants.update_access("gx-data", lambda a: a.granted("gx-reader", ["consume"]))
        assert foreign_role_refusal(store, "billing", "acme") is None
        assert foreign_role_refusal(store, "acme-admin", "acme") is None       # its own tenant's admin role
        assert "admin role of tenant 'globex'" in (foreign_role_refusal(store, "gx-admin", "acme") or "")
        assert "namespace 'gx-data'" in (foreign_role_refusal(store, "gx-reader", "acme") or "")
        assert foreign_role_refusal(store, "gx-reader", "globex") is None
    finally:
        store.close()
