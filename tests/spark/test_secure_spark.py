"""Spark against a secured cluster (DESIGN §4.8): compaction's and tiering's executor tasks read
the client config whose path travels with them, and `spark-bookie sandbox --spark --secure` runs
the executors' bookies with mTLS, tokens and ZooKeeper ACLs, reachable only with the client config
it prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger_client import ClientConfig, LedgerClient, errors

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def test_compaction_and_tiering_tasks_read_the_client_config(spark, cluster_factory, tmp_path):
    """--engine spark: the driver and every executor task present the client config (a task without
    it would be refused by ZooKeeper and the bookies, and the job would fail)."""
    from deltalake import DeltaTable

    from jobs.delta_compaction import CompactionConfig, compact
    from jobs.stream_tiering import TieringConfig, tier_streams
    from spark_bookie.local.secure import make_secure_files

    files = make_secure_files(tmp_path / "secure")
    sb = cluster_factory(2, **files.bookie_settings())
    conf = str(files.client_conf_path)
    with LedgerClient(sb.connect_string, config=ClientConfig.from_toml(conf)) as c:
        ids = []
        for n in (40, 25, 10):
            w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            for i in range(n):
                w.append(b"entry %d" % i)
            w.close()
            ids.append(w.ledger_id)
        ns = c.create_namespace("ns", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                segment_rolling_bytes=1_500, output_buffer_bytes=300)
        with ns.open_writer("s") as w:
            for i in range(120):
                w.write(b"record %04d " % i * 4, txid=i)
        sealed = len([s for s in ns.stream_info("s").segments if s.state == "sealed"])

        table = str(tmp_path / "ledgers")
        done = compact(CompactionConfig(zk=sb.connect_string, table_path=table, password=b"pw", tasks_max=3,
                                        client_conf=conf), spark)
        assert sorted(done.committed) == sorted(ids) and done.rows == 75
        assert DeltaTable(table).to_pyarrow_table().num_rows == 75

        tiered = tier_streams(TieringConfig(zk=sb.connect_string, table_path=str(tmp_path / "streams"),
                                            streams="ns/s", tasks_max=2, client_conf=conf), spark)
        assert len(tiered.marked["ns/s"]) == sealed >= 2 and tiered.rows > 0


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = path.read_text(errors="replace")
        if text in out or proc.poll() is not None:
            return out
        time.sleep(1)
    return path.read_text(errors="replace")


def test_spark_sandbox_secure_serves_only_the_printed_client_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", "SPARK_BOOKIE_CLIENT_CONF")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    out_path = tmp_path / "sandbox.out"
    with open(out_path, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--spark", "--secure",
                                 "--bookies", "2", "--root", str(tmp_path / "sb")], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO, env=env)
    try:
        out = _wait_for(out_path, "press Ctrl-C", proc, 600)
        assert proc.poll() is None and "press Ctrl-C" in out, out[-4000:]
        conf = Path(re.search(r"^client config: (\S+)$", out, re.M).group(1))
        zk = re.search(r"^export SPARK_BOOKIE_ZK=(\S+)$", out, re.M).group(1)
        cfg = ClientConfig.from_toml(conf, operation_timeout_ms=30_000)
        with LedgerClient(zk, config=cfg) as c:
            w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            w.append(b"in an executor, over mTLS")
            w.close()
            assert c.open_ledger(w.ledger_id, password=b"pw").read(0, 0)[0].data == b"in an executor, over mTLS"
        with pytest.raises(errors.MetadataServiceError):   # no TLS: ZooKeeper serves no plain port to reach
            LedgerClient(zk, config=ClientConfig(zk_connect_timeout_ms=2_000)).close()
        with pytest.raises(errors.UnauthorizedAccessError):   # TLS but no zk_auth: ZooKeeper's ACL refuses
            LedgerClient(zk, config=ClientConfig(zk_tls=True, tls_ca_path=cfg.tls_ca_path)).close()
        no_cert = ClientConfig(zk_auth=cfg.zk_auth, zk_member_auth=cfg.zk_member_auth, zk_tls=True,
                               tls_ca_path=cfg.tls_ca_path, auth_token_file=cfg.auth_token_file,
                               operation_timeout_ms=10_000)
        with LedgerClient(zk, config=no_cert) as c:          # ZooKeeper yes, the bookies no (no client certificate)
            w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            with pytest.raises(errors.LedgerError):
                w.append(b"no client certificate")
        status = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(conf), "cluster",
                                 "status", "--zk", zk], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert status.returncode == 0 and status.stdout.count(": serving ") == 2, status.stdout + status.stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)   # the sandbox stops its bookie cluster gracefully
        proc.wait(timeout=300)
    assert proc.returncode == 0, out_path.read_text(errors="replace")[-4000:]
