"""Token verification and the security keys of the bookie and client configurations (DESIGN §4.8):
every way a token can be wrong is refused with AuthError, and a bad combination of keys is refused
at load with a message naming it."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ledger_client import ClientConfig
from ledger_client.errors import IncorrectParameterError
from ledger_client.transport.credentials import Credentials, credentials_of
from metadata import ZkTls
from spark_bookie.errors import ConfigError
from spark_bookie.server.auth import AuthError, RoleError, TokenVerifier, bearer_token, mint_token
from spark_bookie.server.config import load_config

pytestmark = pytest.mark.unit

SECRET = b"unit-secret-0123456789abcdef0123456789abcdef0123456789"


def test_hs256_roles_expiry_and_leeway():
    v = TokenVerifier(SECRET, "HS256")
    assert v.verify(mint_token(SECRET, "app", "client")).role == "client"
    assert v.verify(mint_token(SECRET, "ops", "admin"), admin=True).is_admin
    with pytest.raises(RoleError):
        v.verify(mint_token(SECRET, "app", "client"), admin=True)
    with pytest.raises(AuthError, match="expired"):
        v.verify(mint_token(SECRET, "app", "client", ttl_s=-1))
    assert TokenVerifier(SECRET, "HS256", leeway_s=60).verify(mint_token(SECRET, "app", "client", ttl_s=-5))
    no_role = jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    assert v.verify(no_role).role == "client"
    for bad in (None, "", "x.y.z", jwt.encode({"sub": "x"}, SECRET, algorithm="HS256"),          # no exp
                jwt.encode({"exp": int(time.time()) + 60}, SECRET, algorithm="HS256"),            # no sub
                jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, SECRET, algorithm="HS384"),  # other alg
                jwt.encode({"sub": "x", "role": "root", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256"),
                mint_token(SECRET, "app", "client")[:-1] + "\ud800"):   # a lone surrogate (found by the fuzzer)
        with pytest.raises(AuthError):
            v.verify(bad)


def test_a_cached_token_still_expires():
    v = TokenVerifier(SECRET, "HS256")
    token = mint_token(SECRET, "app", "client", ttl_s=1)
    v.verify(token)
    deadline = time.monotonic() + 10
    while True:   # exp has one-second resolution
        try:
            v.verify(token)
        except AuthError:
            return
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_rs256_from_a_public_key_file_refuses_an_hs256_token_signed_with_that_key(tmp_path: Path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "pub.pem").write_bytes(pub)
    v = TokenVerifier.from_files("", str(tmp_path / "pub.pem"))
    assert v.verify(mint_token(pem, "svc", algorithm="RS256")).subject == "svc"
    import base64
    import hashlib
    import hmac
    import json

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "evil", "role": "admin", "exp": int(time.time()) + 60}).encode())
    sig = b64(hmac.new(pub, f"{head}.{body}".encode(), hashlib.sha256).digest())   # the key-confusion forgery
    with pytest.raises(AuthError):
        v.verify(f"{head}.{body}.{sig}")
    with pytest.raises(ConfigError):
        TokenVerifier.from_files("", "")
    with pytest.raises(ConfigError, match="cannot read"):
        TokenVerifier.from_files(str(tmp_path / "missing"), "")


def test_bearer_header():
    assert bearer_token("Bearer abc") == "abc" and bearer_token(b"Bearer abc ") == "abc"
    assert bearer_token("Basic abc") is None and bearer_token(None) is None and bearer_token("Bearer ") is None


def test_bookie_security_keys_are_validated(tmp_path: Path):
    base = {"journal_dirs": [str(tmp_path / "j")], "ledger_dirs": [str(tmp_path / "l")]}
    assert not load_config(None, **base).auth_enabled
    for bad, fragment in (({"auth_enabled": True}, "exactly one"),
                          ({"auth_enabled": True, "auth_token_secret_path": "a", "auth_token_public_key_path": "b"},
                           "exactly one"),
                          ({"tls_enabled": True, "tls_certificate_path": "c"}, "tls_key_path"),
                          ({"tls_enabled": True, "tls_certificate_path": "c", "tls_key_path": "k",
                            "tls_client_authentication": True}, "tls_trust_store_path"),
                          ({"zk_auth": "nopassword"}, "zk_auth")):
        with pytest.raises(ConfigError, match=fragment):
            load_config(None, **base, **bad)


def test_client_security_keys_and_token_file_rotation(tmp_path: Path):
    with pytest.raises(IncorrectParameterError):
        ClientConfig(auth_token="a", auth_token_file="b")
    with pytest.raises(IncorrectParameterError):
        ClientConfig(tls_ca_path="ca", tls_cert_path="c")          # a certificate without its key
    with pytest.raises(IncorrectParameterError):
        ClientConfig(tls_cert_path="c", tls_key_path="k")          # a client certificate without TLS
    assert credentials_of(ClientConfig()).token() is None and not credentials_of(ClientConfig()).tls
    f = tmp_path / "token"
    f.write_text("first\n")
    creds = Credentials(auth_token_file=str(f))
    assert creds.grpc_metadata() == (("authorization", "Bearer first"),)
    f.write_text("second")
    import os
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))   # a distinct mtime, whatever the clock
    creds._checked_s = -1e9   # as if TOKEN_FILE_CHECK_S had passed
    assert creds.token() == "second"
    f.unlink()
    creds._checked_s = -1e9
    with pytest.raises(IncorrectParameterError, match="auth_token_file"):
        creds.token()


def test_a_connection_is_served_until_its_token_expires_and_a_newer_token_extends_it(monkeypatch):
    from spark_bookie.server import auth

    now = [time.time()]   # the bookie's clock, moved by hand (PyJWT keeps the real one)
    monkeypatch.setattr(auth, "time", type("FakeTime", (), {"time": staticmethod(lambda: now[0]),
                                                            "monotonic": staticmethod(time.monotonic)}))
    v = TokenVerifier(SECRET, "HS256")
    access = auth.ConnectionAccess(v, mint_token(SECRET, "app", "client", ttl_s=60))
    assert access.refusal() is None
    now[0] += 61
    assert "expired while connected" in (access.refusal() or "")
    newer = mint_token(SECRET, "app", "client", ttl_s=600, now_s=time.time())
    assert access.refusal(newer) is None   # a newer token sent on the connection: served again
    assert access.refusal() is None
    forged = mint_token(b"another-secret-0123456789abcdef0123456789", "app", "client", now_s=time.time())
    assert access.refusal(forged) is not None   # a bad token sent on the connection ends it
    assert auth.ConnectionAccess(v, None).refusal() is not None


def test_a_connection_presents_its_token_again_only_when_it_changed():
    from ledger_client.transport.credentials import PresentedToken

    current = ["t1"]
    p = PresentedToken(lambda: current[0])
    assert p.at_hello() == "t1"
    assert p.rotated() is None
    current[0] = "t2"
    assert p.rotated() == "t2"
    assert p.rotated() is None

    def unreadable() -> str:
        raise IncorrectParameterError("cannot read auth_token_file")

    assert PresentedToken(unreadable).rotated() is None


def test_zookeeper_tls_keys_are_checked_at_load(tmp_path: Path):
    """zk_tls with a CA that is missing or not PEM is refused when the configuration is read (a
    typed error naming the file), not later as a ZooKeeper connect timeout."""
    from spark_bookie.local.certs import CertificateAuthority

    ca = CertificateAuthority().write_cert(tmp_path / "ca.pem")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    missing = tmp_path / "missing.pem"
    for path in (missing, not_pem):
        with pytest.raises(IncorrectParameterError, match=str(path)):
            ClientConfig(zk_tls=True, tls_ca_path=str(path))
    with pytest.raises(IncorrectParameterError, match="tls_ca_path"):
        ClientConfig(zk_tls=True)
    assert ClientConfig().zookeeper_tls() is None
    assert ClientConfig(zk_tls=True, tls_ca_path=str(ca)).zookeeper_tls().ca_path == str(ca)
    conf = tmp_path / "client.toml"
    conf.write_text(f'[client]\nzk_tls = true\ntls_ca_path = "{missing}"\n')
    with pytest.raises(IncorrectParameterError, match="cannot load the ZooKeeper TLS CA"):
        ClientConfig.from_toml(conf)

    base = {"journal_dirs": [str(tmp_path / "j")], "ledger_dirs": [str(tmp_path / "l")]}
    for bad, fragment in (({"zk_tls": True}, "zk_tls_ca_path"),
                          ({"zk_tls": True, "zk_tls_ca_path": str(missing)}, str(missing)),
                          ({"zk_tls": True, "zk_tls_ca_path": str(ca), "zk_tls_cert_path": str(ca)}, "its key"),
                          ({"zk_tls": True, "zk_tls_ca_path": str(ca), "autorecovery_enabled": True},
                           "client_conf")):
        with pytest.raises(ConfigError, match=fragment):
            load_config(None, **base, **bad)
    assert load_config(None, **base, zk_tls=True, zk_tls_ca_path=str(ca)).zookeeper_tls().ca_path == str(ca)
    assert load_config(None, **base).zookeeper_tls() is None

    from spark_bookie.hosting.slots import HostingConfig

    # the Spark-hosted cluster's driver and slots read the same keys from the bookie settings
    hosting = {"zk_connect": "127.0.0.1:2181", "bookies": 1, "data_root": str(tmp_path / "data")}
    tls = (("zk_tls", True), ("zk_tls_ca_path", str(ca)))
    with pytest.raises(ConfigError, match="client_conf"):
        HostingConfig(**hosting, bookie_settings=tls).validate()
    assert HostingConfig(**hosting, bookie_settings=(*tls, ("client_conf", str(conf)))).validate().zk_tls() \
        == ZkTls(str(ca))
    assert HostingConfig(**hosting).zk_tls() is None
