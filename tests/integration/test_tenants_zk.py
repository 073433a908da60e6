"""ZooKeeper itself keeps tenants apart (DESIGN §4.9, invariant 11): with the per-tenant ACLs on
(metadata.zk.tenant_acl), a role's own ZooKeeper session, holding its credentials and the members',
can neither read nor change the znodes of a namespace it has no grant on, nor another role's
ledgers; a grant opens them and a revoke closes them again. Checked with raw kazoo sessions, which
skip every check the client makes."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from bookie_helpers import wait_until
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from ledger_client import ClientConfig, LedgerClient, errors
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

SECRET = b"the-zk-tenants-cluster-secret-0123456789"
SUPER = "cluster:super-s3cret"
MEMBERS = "members:member-s3cret"
ROLES = {"root": ("admin", SUPER), "acme-admin": ("client", "acme-admin:a-pw"), "billing": ("client", "billing:b-pw"),
         "intruder": ("client", "intruder:i-pw")}


def config(role: str) -> ClientConfig:
    claim, zk = ROLES[role]
    extra = {} if role == "root" else {"zk_member_auth": MEMBERS}
    return ClientConfig(auth_token=mint_token(SECRET, role, claim, ttl_s=3600), zk_auth=zk,
                        operation_timeout_ms=15_000, **extra)


def kazoo(sb, *auths: str) -> KazooClient:
    """A raw ZooKeeper session under the cluster's chroot-less root, with these digest credentials."""
    hosts = sb.connect_string.split("/", 1)[0]
    zk = KazooClient(hosts=hosts, auth_data=[("digest", a) for a in auths], timeout=10)
    zk.start(timeout=15)
    return zk


@pytest.fixture(scope="module")
def sb(zk_server, tmp_path_factory):
    from spark_bookie.local.sandbox import Sandbox

    root = tmp_path_factory.mktemp("zk-tenants")
    secret = Path(root) / "secret"
    secret.write_bytes(SECRET)
    conf = Path(root) / "root.toml"
    conf.write_text(f'[client]\nzk_auth = "{SUPER}"\nzk_member_auth = "{MEMBERS}"\n'
                    f'auth_token = "{mint_token(SECRET, "root", "admin", 3600)}"\n')
    s = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 1_000, "auth_enabled": True,
                                 "auth_token_secret_path": str(secret), "zk_auth": SUPER, "client_conf": str(conf)})
    s.start()
    done = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(conf), "shell", "--zk",
                           s.connect_string, "secure-metadata", "--tenants"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "per-tenant ACLs on" in done.stdout, done.stderr
    with LedgerClient(s.connect_string, config=config("root")) as c:
        for role in ("acme-admin", "billing", "intruder"):
            c.store.tenants.register_role(role, ROLES[role][1])
        c.create_tenant("acme", admin_roles=["acme-admin"])
    with LedgerClient(s.connect_string, config=config("acme-admin")) as c:
        c.create_namespace("payments", tenant="acme", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                           segment_rolling_bytes=400).grant_permission("billing", ["produce", "consume"])
    yield s
    s.stop()


def paths_of(sb) -> dict[str, str]:
    """The znodes of billing's stream and ledgers, written by billing through its own session."""
    with LedgerClient(sb.connect_string, config=config("billing")) as c:
        ns = c.namespace("payments")
        with ns.open_writer("orders") as w:
            for i in range(30):
                w.write(b"order-%02d" % i)
        own = c.create_ledger(2, 2, 2, password=b"p")
        own.append(b"billing's own")
        own.close()
        seg = next(s for s in ns.stream_info("orders").segments if s.ledger_id is not None)
        store = c.store
        return {"namespace": store.tenants.namespace_path("payments"),
                "stream": store.tenants.namespace_path("payments") + "/orders",
                "segment": store.tenants.namespace_path("payments") + "/orders/segments/" + f"{seg.sequence:020d}",
                "segment ledger": store.paths.ledger(seg.ledger_id), "own ledger": store.paths.ledger(own.ledger_id),
                "own ledger id": str(own.ledger_id)}


def test_a_role_without_a_grant_reads_and_changes_nothing_in_zookeeper_until_granted(sb):
    p = paths_of(sb)
    nodes = [p[k] for k in ("namespace", "stream", "segment", "segment ledger", "own ledger")]
    billing = kazoo(sb, ROLES["billing"][1], MEMBERS)
    intruder = kazoo(sb, ROLES["intruder"][1], MEMBERS)
    nobody = kazoo(sb)
    try:
        for path in nodes:
            billing.get(path)                                          # the granted role reads them all
            for who in (intruder, nobody):
                with pytest.raises(NoAuthError):
                    who.get(path)
                with pytest.raises(NoAuthError):
                    who.set(path, b"overwritten")
                with pytest.raises(NoAuthError):
                    who.delete(path, recursive=False)
        with pytest.raises(NoAuthError):
            intruder.create(p["namespace"] + "/planted", b"")
        with pytest.raises(NoAuthError):
            intruder.get_children(p["namespace"])                    # not even the stream names
        ledger_parent = p["own ledger"].rsplit("/", 1)[0]
        assert p["own ledger"].rsplit("/", 1)[1] in intruder.get_children(ledger_parent)   # ids are listable
        with pytest.raises(NoAuthError):
            intruder.delete(p["own ledger"])                          # ... but not deletable

        with LedgerClient(sb.connect_string, config=config("acme-admin")) as c:
            c.namespace("payments").grant_permission("intruder", ["consume"])
        for path in nodes[:4]:
            intruder.get(path)                                         # a consumer reads the namespace's nodes
        with pytest.raises(NoAuthError):
            intruder.set(p["stream"], b"overwritten")                # ... and changes nothing
        with pytest.raises(NoAuthError):
            intruder.get(p["own ledger"])                             # billing's own ledger stays billing's
        with LedgerClient(sb.connect_string, config=config("acme-admin")) as c:
            c.namespace("payments").revoke_permission("intruder")
        for path in nodes[:4]:
            with pytest.raises(NoAuthError):
                intruder.get(path)
    finally:
        for z in (billing, intruder, nobody):
            z.stop()
            z.close()
    with LedgerClient(sb.connect_string, config=config("billing")) as c:    # nothing changed
        r = c.namespace("payments").open_reader("orders")
        got = [r.read_next(timeout_ms=5_000).payload for _ in range(30)]
        r.close()
    assert got == [b"order-%02d" % i for i in range(30)]


def test_a_roles_delete_marks_its_ledger_and_a_bookie_removes_the_node(sb):
    with LedgerClient(sb.connect_string, config=config("billing")) as c:
        w = c.create_ledger(2, 2, 2, password=b"p")
        w.append(b"to be deleted")
        w.close()
        path = c.store.paths.ledger(w.ledger_id)
        c.delete_ledger(w.ledger_id)
        with pytest.raises(errors.NoSuchLedgerError):
            c.open_ledger(w.ledger_id, b"p")
    root = kazoo(sb, SUPER)
    try:
        wait_until(lambda: root.exists(path) is None, 30, "a bookie's GC to remove the deleted ledger's node")
    finally:
        root.stop()
        root.close()
    with LedgerClient(sb.connect_string, config=config("intruder")) as c:
        with pytest.raises(errors.UnauthorizedAccessError):
            c.create_namespace("mine", tenant="acme")
        w = c.create_ledger(2, 2, 2, password=b"x")                 # its own ledgers, though
        w.append(b"mine")
        w.close()
        assert c.open_ledger(w.ledger_id, b"x").read(0, 0)[0].data == b"mine"


def test_deleting_a_namespace_takes_the_superuser_when_zookeeper_keeps_tenants_apart(sb):
    with LedgerClient(sb.connect_string, config=config("acme-admin")) as c:
        c.create_namespace("short-lived", tenant="acme")
        with pytest.raises(errors.UnauthorizedAccessError, match="superuser"):
            c.delete_namespace("short-lived")
    with LedgerClient(sb.connect_string, config=config("root")) as c:
        c.delete_namespace("short-lived")
        assert "short-lived" not in c.list_namespaces()
