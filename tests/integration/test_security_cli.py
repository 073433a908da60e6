"""A secured cluster end to end from the command line and the bookies' own autorecovery (DESIGN
§4.8): `--client-conf` / $SPARK_BOOKIE_CLIENT_CONF carries zk_auth and the token to every shell
command, `shell secure-metadata` moves an open cluster to a secured one, and the replication
worker beside each bookie re-replicates with the same credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from autorecovery_helpers import ledgers_naming, wait_fully_repaired, write_autorecovery_conf, write_ledger
from client_helpers import bookie_of
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from ledger_client import ClientConfig, LedgerClient
from metadata import connect, parse_connect_string
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRET = b"the-cluster-token-secret-0123456789abcdef"
ZK_AUTH = "spark-bookie:zk-s3cret"


def _write_client_conf(path: Path, **values: str) -> Path:
    path.write_text("[client]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items()))
    return path


def _cli(*args: str, client_conf: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
    if client_conf is not None:
        env["SPARK_BOOKIE_CLIENT_CONF"] = str(client_conf)
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def _secured(cluster_factory, tmp_path: Path, bookies: int, **settings: object):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    conf = _write_client_conf(tmp_path / "client.toml", zk_auth=ZK_AUTH,
                              auth_token=mint_token(SECRET, "ops", "admin", ttl_s=3600))
    sb = cluster_factory(bookies, zk_auth=ZK_AUTH, auth_enabled=True, auth_token_secret_path=str(secret),
                         client_conf=str(conf), **settings)
    return sb, conf


def test_shell_with_client_conf_on_a_cluster_secured_in_place(cluster_factory, tmp_path):
    sb, conf = _secured(cluster_factory, tmp_path, 1)
    zk = sb.connect_string
    no_token = _write_client_conf(tmp_path / "zk-only.toml", zk_auth=ZK_AUTH)

    done = _cli("shell", "--zk", zk, "secure-metadata", client_conf=conf)
    assert done.returncode == 0, done.stderr
    assert "secured" in done.stdout
    info = parse_connect_string(zk)
    kz = KazooClient(hosts=info.hosts_string)
    kz.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            kz.get_children(info.root)
    finally:
        kz.stop()
        kz.close()

    ok = _cli("--client-conf", str(conf), "shell", "--zk", zk, "simpletest", "--entries", "20", "--ensemble", "1",
              "--write-quorum", "1", "--ack-quorum", "1")
    assert ok.returncode == 0, ok.stderr
    for refused, fragment in ((_cli("shell", "--zk", zk, "listledgers"), "zk_auth"),   # no zk_auth: NoAuth
                              (_cli("shell", "--zk", zk, "simpletest", "--ensemble", "1", "--write-quorum", "1",
                                    "--ack-quorum", "1", client_conf=no_token), "UNAUTHENTICATED")):
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr and fragment in refused.stderr, refused.stderr
    with LedgerClient(zk, config=ClientConfig.from_toml(conf)) as c:
        assert list(c.list_ledgers())


def test_destructive_shell_commands_need_a_token_a_bookie_confirms_as_admin(cluster_factory, tmp_path):
    """A client-role token reads and writes, but deleteledger, recover, decommission, the
    autorecovery switches and the stream deletions are refused before they touch anything; the
    admin token runs them. An open cluster has no roles: the same commands run without a token."""
    sb, admin_conf = _secured(cluster_factory, tmp_path, 2)
    zk = sb.connect_string
    client_conf = _write_client_conf(tmp_path / "app.toml", zk_auth=ZK_AUTH,
                                     auth_token=mint_token(SECRET, "app", "client", ttl_s=3600))
    with LedgerClient(zk, config=ClientConfig.from_toml(admin_conf)) as c:   # namespaces: superusers make them
        c.create_namespace("ns").grant_permission("app", ["produce", "consume"])
    with LedgerClient(zk, config=ClientConfig.from_toml(client_conf)) as c:
        lid, _ = write_ledger(c, 5, close=True, e=1, qw=1, qa=1)
        c.namespace("ns").open_writer("s").close()
    bookie = sb.bookies[0].bookie_id
    refused = [("shell", "--zk", zk, "deleteledger", str(lid)),
               ("shell", "--zk", zk, "readledger", str(lid), "--recover"),
               ("shell", "--zk", zk, "recover", bookie),
               ("shell", "--zk", zk, "decommission", bookie),
               ("shell", "--zk", zk, "autorecovery", "--disable"),
               ("shell", "--zk", zk, "lostbookierecoverydelay", "--set", "5"),
               ("stream", "--zk", zk, "delete", "ns/s"),
               ("stream", "--zk", zk, "delete-namespace", "ns", "--force")]
    for args in refused:
        done = _cli(*args, client_conf=client_conf)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "PERMISSION_DENIED" in done.stderr and "'admin'" in done.stderr, (args, done.stderr)
    for args in (("shell", "--zk", zk, "readledger", str(lid)), ("shell", "--zk", zk, "autorecovery"),
                 ("stream", "--zk", zk, "info", "ns/s")):   # reading needs no admin
        done = _cli(*args, client_conf=client_conf)
        assert done.returncode == 0, (args, done.stderr)
    with LedgerClient(zk, config=ClientConfig.from_toml(admin_conf)) as c:
        assert lid in set(c.list_ledgers())                # nothing was deleted
        assert c.store.underreplication.is_replication_enabled()
        assert c.namespace("ns").list_streams() == ["s"]
    done = _cli("shell", "--zk", zk, "deleteledger", str(lid), client_conf=admin_conf)
    assert done.returncode == 0, done.stderr
    done = _cli("stream", "--zk", zk, "delete-namespace", "ns", "--force", client_conf=admin_conf)
    assert done.returncode == 0, done.stderr
    with LedgerClient(zk, config=ClientConfig.from_toml(admin_conf)) as c:
        assert lid not in set(c.list_ledgers())
        assert "ns" not in c.list_namespaces()


def test_bookies_autorecovery_rereplicates_with_the_client_conf_credentials(cluster_factory, tmp_path):
    ar_conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb, conf = _secured(cluster_factory, tmp_path, 3, autorecovery_enabled=True, autorecovery_conf=str(ar_conf))
    cfg = ClientConfig.from_toml(conf)
    with connect(sb.connect_string, zk_auth=ZK_AUTH) as store, LedgerClient(sb.connect_string, config=cfg) as c:
        store.underreplication.set_lost_bookie_recovery_delay_s(0)
        lid, _ = write_ledger(c, 50, close=True, e=2, qw=2, qa=2)
        victim = c.ledger_metadata(lid).ensembles[0][0]
        bookie_of(sb, victim).kill()
        wait_fully_repaired(store, victim, timeout_s=120)
        assert ledgers_naming(store, victim) == []
        r = c.open_ledger(lid, b"", recovery=False)
        assert len(r.read(0, 49)) == 50


def test_spark_sources_read_a_secured_cluster_with_option_client_conf(cluster_factory, tmp_path):
    """The `ledger` source's client (driver and executors) takes option client_conf (or
    $SPARK_BOOKIE_CLIENT_CONF): without it a secured cluster is closed to it."""
    from jobs.ledger_read import connect as source_connect
    from jobs.options import SourceOptions, StreamSourceOptions
    from jobs.stream_source import connect as stream_connect
    from ledger_client import errors

    sb, conf = _secured(cluster_factory, tmp_path, 1)
    with LedgerClient(sb.connect_string, config=ClientConfig.from_toml(conf)) as c:
        w = c.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
        w.append(b"for spark")
        w.close()
    opts = SourceOptions.parse({"zk": sb.connect_string, "client_conf": str(conf)}, env={})
    with source_connect(opts) as c:
        assert c.open_ledger(w.ledger_id, b"", recovery=False).read(0, 0)[0].data == b"for spark"
    stream_opts = StreamSourceOptions.parse({"zk": sb.connect_string, "streams": "ns/s"},
                                            env={"SPARK_BOOKIE_CLIENT_CONF": str(conf)})
    assert stream_opts.client_conf == str(conf)
    with stream_connect(stream_opts) as c:
        assert w.ledger_id in list(c.list_ledgers())
    with pytest.raises(errors.UnauthorizedAccessError):
        source_connect(SourceOptions.parse({"zk": sb.connect_string}, env={})).close()


def test_spark_hosted_slot_serves_a_secured_cluster(zk_connect, tmp_path):
    """A Spark-hosted bookie (the slot task, run here in a thread without Spark) takes the security
    keys from the hosting job's bookie settings; its metadata session and replication worker use
    zk_auth and the client_conf."""
    import threading

    from bookie_helpers import wait_until

    from spark_bookie.hosting.slots import SERVING, HostingConfig, read_slot_statuses, request_stop, run_slot
    from spark_bookie.local.zookeeper import free_port

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    conf = _write_client_conf(tmp_path / "client.toml", zk_auth=ZK_AUTH,
                              auth_token=mint_token(SECRET, "slot", "client", ttl_s=3600))
    with connect(zk_connect, zk_auth=ZK_AUTH) as store:
        store.cluster.init_cluster()
        cfg = HostingConfig(zk_connect=zk_connect, bookies=1, data_root=str(tmp_path / "data"), base_port=free_port(),
                            autorecovery=True, heartbeat_interval_ms=200, zk_session_timeout_ms=4_000,
                            bookie_settings=(("auth_enabled", True), ("auth_token_secret_path", str(secret)),
                                             ("client_conf", str(conf)), ("gc_interval_ms", 3_600_000),
                                             ("zk_auth", ZK_AUTH))).validate()
        errors_seen: list[BaseException] = []

        def run() -> None:
            try:
                list(run_slot(cfg, 0, []))
            except BaseException as e:
                errors_seen.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            wait_until(lambda: read_slot_statuses(store, cfg.name).get(0, {}).get("state") == SERVING, 60, "serving")
            assert read_slot_statuses(store, cfg.name)[0]["autorecovery"] == "worker"
            with LedgerClient(zk_connect, config=ClientConfig.from_toml(conf)) as c:
                w = c.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
                assert w.append(b"hosted") == 0
                w.close()
        finally:
            request_stop(store, cfg.name, "test")
            t.join(30)
        assert not t.is_alive() and not errors_seen, errors_seen
