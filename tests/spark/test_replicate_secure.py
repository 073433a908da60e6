"""`spark-bookie replicate` between two secured clusters (DESIGN §4.8, §4.12): each cluster its own
CA, mTLS, tokens and ZooKeeper ACLs; the replicator reads A with A's client config and writes B
under a role granted only `produce` on B's namespace (made by B's operator beforehand). Without
B's config the replicator stops with a one-line error and B holds nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from replicate_helpers import Replicator, records, two_clusters, wait_replicated

from ledger_client import ClientConfig, LedgerClient, errors

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def role_conf(zk: str, admin_conf, secure, role: str, out) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
    done = subprocess.run([sys.executable, "-m", "spark_bookie", "--client-conf", str(admin_conf), "role", "--zk", zk,
                           "create", role, "--out", str(out), "--token-secret", str(secure.token_secret_path),
                           "--tls-cert", str(secure.client_cert_path), "--tls-key", str(secure.client_key_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return str(out)


def test_replicate_between_secured_clusters_writes_b_with_produce_only(zk_server, tmp_path):
    from spark_bookie.local.secure import make_secure_files

    fa, fb = make_secure_files(tmp_path / "secure-a"), make_secure_files(tmp_path / "secure-b")
    a, b = two_clusters(zk_server, tmp_path, bookies=2, settings=(fa.bookie_settings(), fb.bookie_settings()))
    quorum = {"ensemble_size": 2, "write_quorum_size": 2, "ack_quorum_size": 2}
    rep = None
    try:
        with LedgerClient(a.connect_string, config=ClientConfig.from_toml(fa.client_conf_path)) as ca, \
                LedgerClient(b.connect_string, config=ClientConfig.from_toml(fb.client_conf_path)) as cb:
            pay = ca.create_namespace("pay", segment_rolling_bytes=5_000, output_buffer_bytes=500, **quorum)
            with pay.open_writer("orders") as w:
                for i in range(400):
                    w.write_async(b"secure order %d" % i, txid=10 + 2 * i)
            pay_b = cb.create_namespace("pay", **quorum)
            pay_b.grant_permission("replicator", ["produce"])
            producer = role_conf(b.connect_string, fb.client_conf_path, fb, "replicator", tmp_path / "replicator.toml")

            # B's superuser config withheld: ZooKeeper's ACLs and the bookies refuse; nothing lands on B
            bad = Replicator(a.connect_string, b.connect_string, "pay/*", tmp_path / "ck-bad",
                             "--from-client-conf", str(fa.client_conf_path))
            bad.proc = subprocess.Popen(bad.args, stdout=open(bad.log, "wb"), stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            assert bad.proc.wait(300) != 0
            assert "error" in bad.tail().lower() and "Traceback" not in bad.tail(3), bad.tail()
            assert not pay_b.stream_exists("orders")

            rep = Replicator(a.connect_string, b.connect_string, "pay/*", tmp_path / "ck",
                             "--from-client-conf", str(fa.client_conf_path), "--to-client-conf", producer).start()
            got = wait_replicated(pay, pay_b, "orders", 180, rep)
            assert [t for t, _ in got] == [10 + 2 * i for i in range(400)]
            with LedgerClient(b.connect_string, config=ClientConfig.from_toml(producer)) as pc, \
                    pytest.raises(errors.UnauthorizedAccessError):
                records(pc.namespace("pay"), "orders")   # the replicator's role on B may only produce
    finally:
        if rep is not None:
            rep.stop()
        a.stop()
        b.stop()
