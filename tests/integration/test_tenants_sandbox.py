"""`spark-bookie sandbox --secure` (DESIGN §4.8), and tenants on it as an operator sets them up
(DESIGN §4.9): the printed superuser config makes a tenant, `role create` writes each role's
config (its token and its own ZooKeeper identity), the tenant admin grants; the role without a
grant is then refused on every path it can try (the CLI, the Python client, raw bookie requests,
its own ZooKeeper session over TLS) while nothing changes, and the granted role reads back every
record. One sandbox for the module."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bookie_helpers import wait_until
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from ledger_client import ClientConfig, LedgerClient, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.transport import BookieClient
from ledger_client.transport.credentials import credentials_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def cli(conf: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(conf), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env, input=stdin)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A running `sandbox --secure`; yields (connect string, superuser config, its secure dir)."""
    root = tmp_path_factory.mktemp("secure-tenants")
    out = root / "sandbox.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--secure", "--bookies", "2",
                                 "--root", str(root / "sb")], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=REPO)
    try:
        wait_until(lambda: "press Ctrl-C" in out.read_text() or proc.poll() is not None, 120, "the sandbox")
        text = out.read_text()
        assert proc.poll() is None, text
        conf = Path(re.search(r"^client config: (\S+)$", text, re.M).group(1))
        zk = re.search(r"^export SPARK_BOOKIE_ZK=(\S+)$", text, re.M).group(1)
        yield zk, conf, conf.parent
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_sandbox_secure_prints_a_client_config_that_is_the_only_way_in(sandbox):
    """`spark-bookie sandbox --secure`: TLS with client certificates, tokens, ZooKeeper ACLs and
    ZooKeeper over TLS; the printed client config writes and reads, a client without it gets
    nothing (without TLS it does not even reach ZooKeeper: only the secure port is served). Plain
    clients refused by the bookies: test_security_tls.py."""
    zk, conf, _secure = sandbox
    assert oct(conf.stat().st_mode & 0o777) == "0o600"
    cfg = ClientConfig.from_toml(conf)
    assert cfg.zk_tls
    with LedgerClient(zk, config=cfg) as c:
        w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
        w.append(b"secure sandbox")
        w.close()
        assert c.open_ledger(w.ledger_id, password=b"pw").read(0, 0)[0].data == b"secure sandbox"
    with pytest.raises(errors.UnauthorizedAccessError):   # TLS but no zk_auth: ZooKeeper's ACL refuses
        LedgerClient(zk, config=dataclasses.replace(cfg, zk_auth=None, zk_member_auth=None)).close()
    with pytest.raises(errors.MetadataServiceError):   # the credentials but no TLS: no port to reach
        LedgerClient(zk, config=ClientConfig(zk_auth=cfg.zk_auth, zk_connect_timeout_ms=2_000)).close()
    shell = cli(conf, "shell", "--zk", zk, "listbookies")
    assert shell.returncode == 0 and len(shell.stdout.split()) == 2, shell.stdout + shell.stderr


def role_conf(zk: str, maker: Path, secure: Path, role: str, out: Path, *extra: str) -> Path:
    done = cli(maker, "role", "--zk", zk, "create", role, "--out", str(out), "--token-secret",
               str(secure / "token-secret"), "--tls-cert", str(secure / "client.pem"), "--tls-key",
               str(secure / "client-key.pem"), *extra)
    assert done.returncode == 0, done.stderr
    return out


def test_a_role_without_a_grant_is_refused_everywhere_on_a_secure_sandbox(sandbox, tmp_path):
    zk, root_conf, secure = sandbox
    assert cli(root_conf, "tenant", "--zk", zk, "create", "acme", "--admin-roles", "acme-admin").returncode == 0
    confs = {r: role_conf(zk, root_conf, secure, r, tmp_path / f"{r}.toml") for r in ("acme-admin", "intruder")}
    admin = confs["acme-admin"]
    done = cli(admin, "stream", "--zk", zk, "create-namespace", "payments", "--tenant", "acme", "--ensemble", "2",
               "--write-quorum", "2", "--ack-quorum", "2")
    assert done.returncode == 0, done.stderr
    done = cli(admin, "stream", "--zk", zk, "grant", "payments", "billing", "--actions", "produce,consume")
    assert done.returncode == 0, done.stderr
    # billing's config is made after its grant: its new ZooKeeper identity reaches the namespace's ACLs
    confs["billing"] = role_conf(zk, root_conf, secure, "billing", tmp_path / "billing.toml")
    for r, path in confs.items():   # each role its own ZooKeeper identity, beside the members'
        cfg = ClientConfig.from_toml(path)
        assert cfg.zk_auth.startswith(f"{r}:") and cfg.zk_member_auth and cfg.zk_tls
    lines = "".join(f"order-{i}\n" for i in range(40))
    done = cli(confs["billing"], "stream", "--zk", zk, "write", "payments/orders", stdin=lines)
    assert done.returncode == 0, done.stderr

    with LedgerClient(zk, config=ClientConfig.from_toml(root_conf)) as c:
        before = c.namespace("payments").stream_info("orders")
    seg_ledgers = [s.ledger_id for s in before.segments if s.ledger_id is not None]
    intruder = confs["intruder"]
    for args in (("stream", "--zk", zk, "tail", "payments/orders", "--no-follow"),
                 ("stream", "--zk", zk, "info", "payments/orders"),
                 ("stream", "--zk", zk, "list", "payments"),
                 ("stream", "--zk", zk, "delete", "payments/orders"),
                 ("stream", "--zk", zk, "grant", "payments", "intruder", "--actions", "consume"),
                 ("shell", "--zk", zk, "readledger", str(seg_ledgers[0])),
                 ("tenant", "--zk", zk, "info", "acme")):
        done = cli(intruder, *args, stdin="planted\n")
        assert done.returncode != 0 and "intruder" in done.stderr, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
    done = cli(intruder, "stream", "--zk", zk, "write", "payments/orders", stdin="planted\n")
    assert done.returncode != 0 and "intruder" in done.stderr, done.stderr

    icfg = ClientConfig.from_toml(intruder)
    with LedgerClient(zk, config=icfg) as c:                 # the Python client, past its own checks
        for lid in seg_ledgers:
            with pytest.raises(errors.UnauthorizedAccessError):
                c.ledger_metadata(lid)                           # ZooKeeper refuses the metadata read
        bookies = c.registry.writable_ids()
    for b in bookies:                                            # raw bookie requests, guessed ids too
        with BookieClient(b, credentials=credentials_of(icfg)) as bc:
            for lid in [*seg_ledgers, *range(0, 20)]:
                assert bc.read_range(lid, 0, 5).status in (pb.EUA, pb.ENOLEDGER), lid
    hosts = zk.split("/", 1)[0]
    raw = KazooClient(hosts=hosts, use_ssl=True, ca=icfg.tls_ca_path, verify_certs=True,
                      auth_data=[("digest", icfg.zk_auth), ("digest", icfg.zk_member_auth)], timeout=10)
    raw.start(timeout=20)
    try:
        ns_path = "/ledgers/streams/payments"
        for path in (ns_path, f"{ns_path}/orders"):
            with pytest.raises(NoAuthError):
                raw.get(path)
            with pytest.raises(NoAuthError):
                raw.set(path, b"{}")
        with pytest.raises(NoAuthError):
            raw.create(f"{ns_path}/planted", b"")
    finally:
        raw.stop()
        raw.close()

    done = cli(confs["billing"], "stream", "--zk", zk, "tail", "payments/orders", "--no-follow")
    assert done.returncode == 0, done.stderr
    got = [line.split()[-1] for line in done.stdout.splitlines()]          # DLSN, txid, payload
    assert got == [f"order-{i}" for i in range(40)]                        # every record, and nothing planted
    with LedgerClient(zk, config=ClientConfig.from_toml(root_conf)) as c:
        after = c.namespace("payments").stream_info("orders")
    assert after.last_dlsn == before.last_dlsn and after.last_txid == before.last_txid
    perms = json.loads(cli(admin, "stream", "--zk", zk, "permissions", "payments", "--json").stdout)
    assert perms == {"billing": ["consume", "produce"]}
