"""The jobs and the demo against a secured cluster (DESIGN §4.8): compaction and tiering
(`jobs/compact_to_delta.py --client-conf`, default $SPARK_BOOKIE_CLIENT_CONF) and the auditor's
tiering step work with the sandbox's client config (mTLS, token, zk_auth) and are refused with a
typed error without it; `sandbox --secure --demo` runs the demo with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stream_helpers import read_all

from jobs.compact_to_delta import main as compact_main
from jobs.connect import CLIENT_CONF_ENV
from jobs.delta_compaction import CompactionConfig, compact
from jobs.stream_tiering import TieringConfig, tier_step, tier_streams
from ledger_client import ClientConfig, LedgerClient, errors
from spark_bookie.local.secure import make_secure_files

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def secured(cluster_factory, tmp_path, monkeypatch):
    """A secured cluster of two bookies (mTLS, tokens, ZooKeeper ACLs), its client config, and no
    $SPARK_BOOKIE_CLIENT_CONF in the environment."""
    monkeypatch.delenv(CLIENT_CONF_ENV, raising=False)
    files = make_secure_files(tmp_path / "secure")
    sb = cluster_factory(2, **files.bookie_settings())
    return sb.connect_string, files.client_conf_path


def _client(zk: str, conf: Path) -> LedgerClient:
    return LedgerClient(zk, config=ClientConfig.from_toml(conf, operation_timeout_ms=30_000))


def test_compaction_reads_the_client_config_and_is_refused_without_it(secured, tmp_path, monkeypatch, capsys):
    from deltalake import DeltaTable

    zk, conf = secured
    with _client(zk, conf) as c:
        ids = []
        for n in (30, 20):
            w = c.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=b"pw")
            for i in range(n):
                w.append(b"secured %d" % i)
            w.close()
            ids.append(w.ledger_id)
    table = tmp_path / "table"
    args = ["--zk", zk, "--table", str(table), "--engine", "local", "--password", "pw"]

    with pytest.raises(errors.UnauthorizedAccessError):   # ZooKeeper's NoAuth, before anything is written
        compact(CompactionConfig(zk=zk, table_path=str(table), password=b"pw"))
    assert compact_main(args) == 1
    assert "compact_to_delta:" in capsys.readouterr().err
    assert DeltaTable(str(table)).version() == 0            # created empty, nothing committed
    assert compact_main([*args, "--client-conf", str(tmp_path / "missing.toml")]) == 2

    capsys.readouterr()
    assert compact_main([*args, "--client-conf", str(conf), "--delete-after-commit"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["compacted"] == ids and summary["rows"] == 50 and summary["deleted"] == ids
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 50
    with _client(zk, conf) as c:
        assert not set(ids) & set(c.list_ledgers())

    monkeypatch.setenv(CLIENT_CONF_ENV, str(conf))            # the default of --client-conf
    assert compact_main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["compacted"] == []


def test_tiering_job_and_tier_step_read_the_client_config(secured, tmp_path, capsys):
    from recovery import StreamMaintenance

    zk, conf = secured
    tiers = tmp_path / "tiers"
    with _client(zk, conf) as c:
        ns = c.create_namespace("ns", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                segment_rolling_bytes=1_500, output_buffer_bytes=300)
        auto = c.create_namespace("auto", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                  segment_rolling_bytes=1_500, output_buffer_bytes=300, tier_after_ms=0,
                                  tier_table=str(tiers))
        for space in (ns, auto):
            with space.open_writer("s") as w:
                for i in range(150):
                    w.write(b"record %04d " % i * 4, txid=i)
        sealed = len([s for s in ns.stream_info("s").segments if s.state == "sealed"])
        assert sealed >= 2

        table = str(tmp_path / "t")
        with pytest.raises(errors.UnauthorizedAccessError):
            tier_streams(TieringConfig(zk=zk, table_path=table, streams="ns/s"))
        result = tier_streams(TieringConfig(zk=zk, table_path=table, streams="ns/s", client_conf=str(conf)))
        assert len(result.marked["ns/s"]) == sealed and result.rows > 0
        capsys.readouterr()
        assert compact_main(["--zk", zk, "--stream", "ns/s", "--table", table, "--tier", "--engine", "local",
                             "--client-conf", str(conf)]) == 0   # the CLI: everything is tiered already
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["segments_written"] == 0

        # The auditor's step runs on its (credentialed) client, as the hosting driver's and
        # `spark-bookie autorecovery --client-conf`'s do.
        stats = StreamMaintenance(c, 0, tier=tier_step).run_once()
        assert stats.errors == 0 and stats.segments_tiered > 0
        assert any(s.state == "tiered" for s in auto.stream_info("s").segments)
        assert [x.txid for x in read_all(auto, "s", 150)] == list(range(150))   # from Delta and ledgers


def test_sandbox_secure_demo(tmp_path):
    """`spark-bookie sandbox --secure --demo`: the demo with the sandbox's client config."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_BOOKIE_ZK", CLIENT_CONF_ENV)}
    r = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--secure", "--demo", "--bookies", "4",
                        "--root", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert f"client config: {tmp_path / 'secure' / 'client.toml'}" in out
    assert "old writer is fenced" in out and "every byte matches" in out
    assert "got all 3000 records once, in order" in out and out.rstrip().endswith("demo OK")
