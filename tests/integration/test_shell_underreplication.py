"""`spark-bookie shell` over the re-replication queue and the auditor election, as a subprocess
against a real ZooKeeper (no bookie is needed for these commands), and `checkledger`, which asks
real bookies which entries they hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from metadata import connect

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def spark_bookie(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_BOOKIE_ZK"}
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def ok(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout.splitlines()


def test_queue_switch_and_delay_commands(zk_connect: str) -> None:
    ok(spark_bookie("init", "--zk", zk_connect))
    shell = ("shell", "--zk", zk_connect)
    assert ok(spark_bookie(*shell, "listunderreplicated")) == []
    with connect(zk_connect) as store:
        store.underreplication.mark_underreplicated(2**40, ["10.0.0.2:3181"])
        store.underreplication.mark_underreplicated(7, ["10.0.0.1:3181", "10.0.0.2:3181"])
        assert ok(spark_bookie(*shell, "listunderreplicated")) == ["7", str(2**40)]
        listed = json.loads(spark_bookie(*shell, "listunderreplicated", "--json").stdout)
        assert listed == {"7": ["10.0.0.1:3181", "10.0.0.2:3181"], str(2**40): ["10.0.0.2:3181"]}

        assert ok(spark_bookie(*shell, "autorecovery")) == ["enabled"]
        assert ok(spark_bookie(*shell, "autorecovery", "--disable")) == ["disabled"]
        assert not store.underreplication.is_replication_enabled()
        assert store.underreplication.acquire_underreplicated(0) is None  # workers stop taking ledgers
        waiting = threading.Thread(target=lambda: got.append(store.underreplication.acquire_underreplicated(30_000)))
        got: list[int | None] = []
        waiting.start()
        assert ok(spark_bookie(*shell, "autorecovery", "--enable")) == ["enabled"]
        waiting.join(30)
        assert got and got[0] in (7, 2**40)  # the waiting worker woke up when it was enabled
        assert spark_bookie(*shell, "autorecovery", "--enable", "--disable").returncode == 2

        assert ok(spark_bookie(*shell, "lostbookierecoverydelay")) == ["0"]
        assert ok(spark_bookie(*shell, "lostbookierecoverydelay", "--set", "45")) == ["45"]
        assert store.underreplication.lost_bookie_recovery_delay_s() == 45
        bad = spark_bookie(*shell, "lostbookierecoverydelay", "--set", "-3")
        assert bad.returncode == 2 and "negative" in bad.stderr and "Traceback" not in bad.stderr


def test_whoisauditor(zk_connect: str) -> None:
    shell = ("shell", "--zk", zk_connect)
    with connect(zk_connect) as first:
        first.cluster.init_cluster()
        assert ok(spark_bookie(*shell, "whoisauditor")) == ["no auditor"]
        first.underreplication.elect_auditor("10.0.0.5:3181", lambda _: None)
        with connect(zk_connect) as second:
            second.underreplication.elect_auditor("10.0.0.6:3181", lambda _: None)
            assert ok(spark_bookie(*shell, "whoisauditor")) == ["10.0.0.5:3181"]
            first.close()  # the auditor goes: the next candidate takes over
            assert ok(spark_bookie(*shell, "whoisauditor")) == ["10.0.0.6:3181"]
    assert ok(spark_bookie(*shell, "whoisauditor")) == ["no auditor"]


def test_checkledger_names_each_bookies_gap_and_marks_it_on_request(cluster_factory) -> None:
    from autorecovery_helpers import ledger_with_gap
    from client_helpers import client

    sb = cluster_factory(3)
    shell = ("shell", "--zk", sb.connect_string, "checkledger")
    with client(sb) as c:
        lid, victim = ledger_with_gap(c, [*range(40, 60), 77])
        whole, _ = ledger_with_gap(c, [], entries=5)
        w = c.create_ledger(3, 3, 2)
        w.append(b"open")
        assert ok(spark_bookie(*shell, str(w.ledger_id))) == ["fragment 0.. (open, the writer's): not checked"]
        w.close()
    proc = spark_bookie(*shell, str(lid))
    assert proc.returncode == 1, proc.stdout + proc.stderr   # a bookie lacks entries
    assert f"fragment 0..99 {victim}: lacks 21 of 100: 40..59, 77" in proc.stdout.splitlines()
    assert sum("holds all 100" in line for line in proc.stdout.splitlines()) == 2
    assert sb.store.underreplication.list_underreplicated() == {}   # nothing marked without --mark
    said = json.loads(spark_bookie(*shell, str(lid), "--json", "--mark").stdout)
    assert said["marked"] == [victim]
    assert [r["lacking"] for r in said["fragments"] if r["bookie"] == victim] == [[*range(40, 60), 77]]
    assert sb.store.underreplication.list_underreplicated() == {lid: [victim]}
    assert ok(spark_bookie(*shell, str(whole)))[0].endswith("holds all 5")
    missing = spark_bookie(*shell, "999999999")
    assert missing.returncode == 2 and "999999999" in missing.stderr, missing.stderr
