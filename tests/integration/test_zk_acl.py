"""ZooKeeper digest ACLs (DESIGN §4.8): with zk_auth, a ZooKeeper client without the credentials can
read nothing and change nothing under the cluster's root; an open cluster can be secured later."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from ledger_client import ClientConfig, LedgerClient, errors
from metadata import DigestType, LedgerMetadata, MetadataAccessDeniedError, connect, parse_connect_string
from metadata.layout import ZkLayout

pytestmark = pytest.mark.integration

AUTH = "spark-bookie:s3cret:with:colons"
ENSEMBLE = ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"]


def _md(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata.new_open(ledger_id, ENSEMBLE, write_quorum_size=3, ack_quorum_size=2,
                                   digest_type=DigestType.CRC32C, password=b"pw")


def _kazoo(zk_connect: str, auth: str | None = None) -> KazooClient:
    info = parse_connect_string(zk_connect)
    kz = KazooClient(hosts=info.hosts_string, auth_data=[("digest", auth)] if auth else None)
    kz.start(timeout=10)
    return kz


def _populate(zk_connect: str, zk_auth: str | None) -> tuple[ZkLayout, int]:
    """A cluster layout, a ledger's metadata and a stream namespace, written through our own code."""
    with connect(zk_connect, zk_auth=zk_auth) as store:
        store.cluster.init_cluster()
        lid = store.ledgers.generate_ledger_id()
        store.ledgers.create_ledger_metadata(_md(lid))
        paths = store.paths
    with LedgerClient(zk_connect, config=ClientConfig(zk_auth=zk_auth)) as c:
        c.create_namespace("payments").create_stream("orders")
    return paths, lid


def _assert_locked_out(kz: KazooClient, paths: ZkLayout, lid: int) -> None:
    for path in (paths.root, paths.ledger(lid), paths.layout, f"{paths.root}/streams/payments/orders"):
        with pytest.raises(NoAuthError):
            kz.get(path)
        with pytest.raises(NoAuthError):
            kz.set(path, b"overwritten")
        if path != paths.root:   # deleting the root is its parent's ACL's business (outside the cluster)
            with pytest.raises(NoAuthError):
                kz.delete(path, recursive=False)
    with pytest.raises(NoAuthError):
        kz.get_children(paths.root)
    with pytest.raises(NoAuthError):
        kz.create(f"{paths.root}/intruder", b"x")


def test_secured_metadata_is_closed_to_clients_without_the_credentials(zk_connect):
    paths, lid = _populate(zk_connect, AUTH)
    plain, wrong = _kazoo(zk_connect), _kazoo(zk_connect, "spark-bookie:not-the-password")
    try:
        _assert_locked_out(plain, paths, lid)
        _assert_locked_out(wrong, paths, lid)
    finally:
        plain.stop()
        wrong.stop()
    # Our own store and client without zk_auth get typed errors, not kazoo's.
    with connect(zk_connect) as store, pytest.raises(MetadataAccessDeniedError):
        store.ledgers.read_ledger_metadata(lid)
    with pytest.raises(errors.UnauthorizedAccessError):
        LedgerClient(zk_connect)
    # With the credentials everything is there, unchanged.
    with LedgerClient(zk_connect, config=ClientConfig(zk_auth=AUTH)) as c:
        assert c.ledger_metadata(lid).ensembles == {0: ENSEMBLE}
        assert c.list_namespaces() == ["payments"] and c.namespace("payments").list_streams() == ["orders"]


def test_an_open_cluster_is_secured_in_place(zk_connect):
    paths, lid = _populate(zk_connect, None)
    with connect(zk_connect, zk_auth=AUTH) as store:
        changed = store.cluster.secure_tree()
        assert changed >= 10   # the root, the layout's nodes, the ledger's path, the stream's nodes
    plain = _kazoo(zk_connect)
    try:
        _assert_locked_out(plain, paths, lid)
    finally:
        plain.stop()
    with LedgerClient(zk_connect, config=ClientConfig(zk_auth=AUTH)) as c:
        assert c.ledger_metadata(lid).ledger_id == lid and c.namespace("payments").stream_exists("orders")


def test_bad_credentials_settings_are_refused_clearly(tmp_path):
    for bad in ("nopassword", ":pw", "user:", 42):
        with pytest.raises(errors.IncorrectParameterError, match="zk_auth"):
            ClientConfig(zk_auth=bad)  # type: ignore[arg-type]
    conf = tmp_path / "client.toml"
    conf.write_text('[client]\nzk_auth = "u:p"\nread_timeout_ms = 5000\n')
    cfg = ClientConfig.from_toml(conf)
    assert cfg.zk_auth == "u:p" and cfg.read_timeout_ms == 5000
    conf.write_text('[client]\nzk_auht = "u:p"\n')
    with pytest.raises(errors.IncorrectParameterError, match="zk_auht"):
        ClientConfig.from_toml(conf)
    with pytest.raises(errors.IncorrectParameterError, match="cannot read"):
        ClientConfig.from_toml(tmp_path / "missing.toml")
