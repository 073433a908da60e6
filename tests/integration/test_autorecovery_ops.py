"""Operating autorecovery: `spark-bookie autorecovery` processes and auditor failover, and the
shell's `decommission` / `recover` commands, all as real processes against real bookies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from autorecovery_helpers import (
    AutoRecoveryProcess,
    assert_every_replica_has_every_entry,
    ledgers_naming,
    wait_fully_repaired,
    write_autorecovery_conf,
    write_ledger,
)
from bookie_helpers import wait_until
from client_helpers import bookie_of, client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENTRIES = 40


def shell(zk: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_BOOKIE_ZK"}
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "shell", "--zk", zk, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_auditor_moves_when_its_process_dies_and_the_new_one_audits(cluster_factory, tmp_path):
    sb = cluster_factory(4)
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(0)
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    procs = [AutoRecoveryProcess(sb.connect_string, conf, f"ar-{i}", tmp_path / f"ar-{i}.log") for i in range(2)]
    try:
        for p in procs:
            p.wait_ready()
        wait_until(lambda: sb.store.underreplication.current_auditor() in ("ar-0", "ar-1"), 30,
                   "an auditor to be elected")
        first = sb.store.underreplication.current_auditor()
        dead = next(p for p in procs if p.candidate_id == first)
        survivor = next(p for p in procs if p is not dead)
        dead.kill()
        wait_until(lambda: sb.store.underreplication.current_auditor() == survivor.candidate_id, 30,
                   f"{survivor.candidate_id} to become the auditor")
        # The vote moves first; the survivor's election callback logs it a moment later.
        wait_until(lambda: "now the auditor" in survivor.log(), 30, f"{survivor.candidate_id} to take over")
        with client(sb) as c:   # the new auditor (and its worker) do the job
            lids = [write_ledger(c, ENTRIES, close=True)[0] for _ in range(3)]
            victim = c.ledger_metadata(lids[0]).ensembles[0][0]
            bookie_of(sb, victim).kill()
            wait_fully_repaired(sb.store, victim, timeout_s=90)
            for lid in lids:
                assert_every_replica_has_every_entry(c, lid, ENTRIES)
    finally:
        for p in procs:
            p.stop()
    assert all(p.proc.returncode is not None for p in procs)


def test_decommission_of_a_live_bookie_moves_everything_and_deletes_its_cookie(cluster_factory):
    sb = cluster_factory(4)
    with client(sb) as c:
        lids = [write_ledger(c, ENTRIES, close=True)[0] for _ in range(4)]
        lid_open, _writer = write_ledger(c, ENTRIES, close=False)   # left open, idle
        target = c.ledger_metadata(lids[0]).ensembles[0][1]
        assert sb.store.cluster.read_cookie(target) is not None
        r = shell(sb.connect_string, "decommission", target, "--timeout", "120", "--json",
                  "--conf", str(_fast_conf(sb.root)))
        assert r.returncode == 0, r.stdout + r.stderr
        result = json.loads(r.stdout.strip().splitlines()[-1])
        assert result["bookie"] == target and result["cookie_deleted"] is True
        assert result["ledgers_moved"] >= 1
        assert ledgers_naming(sb.store, target) == [] and sb.store.underreplication.list_underreplicated() == {}
        assert sb.store.cluster.read_cookie(target) is None
        assert bookie_of(sb, target).alive        # it was decommissioned while running
        for lid in lids:
            assert_every_replica_has_every_entry(c, lid, ENTRIES)
        assert target not in c.ledger_metadata(lid_open).bookies()   # open ones too (fenced after the grace)


def test_recover_a_dead_bookie_on_demand_and_refuse_a_live_one(cluster_factory):
    sb = cluster_factory(4)
    # the auditor would wait an hour; recover does not
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(3600)
    with client(sb) as c:
        lids = [write_ledger(c, ENTRIES, close=True)[0] for _ in range(3)]
        victim = c.ledger_metadata(lids[0]).ensembles[0][2]
        live = next(b.bookie_id for b in sb.bookies if b.bookie_id != victim)
        refused = shell(sb.connect_string, "recover", live, "--timeout", "30")
        assert refused.returncode == 2 and "is alive" in refused.stderr and "Traceback" not in refused.stderr
        bookie_of(sb, victim).kill()
        wait_until(lambda: victim not in sb.store.cluster.list_bookies(), 30,
                   "the killed bookie's registration to expire")
        r = shell(sb.connect_string, "recover", victim, "--timeout", "120", "--conf", str(_fast_conf(sb.root)))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"recover {victim}: done" in r.stdout
        assert "ledgers moved" in r.stderr   # the progress display
        assert ledgers_naming(sb.store, victim) == []
        assert sb.store.cluster.read_cookie(victim) is not None   # recover keeps the cookie; decommission deletes it
        for lid in lids:
            assert_every_replica_has_every_entry(c, lid, ENTRIES)


def _fast_conf(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return write_autorecovery_conf(root / "shell-autorecovery.toml")
