"""`spark-bookie shell`: the real command line, as a subprocess, against real bookie processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from client_helpers import client

from ledger_client import DigestType, errors

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BINARY = b"\xff\xfe\x00binary"
TABBED = b"tab\there"


def shell(*args: str, zk: str | None = None, env_zk: str | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `spark-bookie shell ARGS` (with `--zk zk` before the command when given)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_BOOKIE_ZK"}
    if env_zk is not None:
        env["SPARK_BOOKIE_ZK"] = env_zk
    argv = [sys.executable, "-m", "spark_bookie.cli", "shell"]
    if zk is not None:
        argv += ["--zk", zk]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def ok(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    print(proc.args, proc.stderr)  # shown by pytest only when the test fails
    return proc.stdout.splitlines()


def failed(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Assert the shell's error contract: exit 2, one `spark-bookie shell: error:` line, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, proc.stderr
    return proc.stderr


def test_listbookies_and_simpletest(cluster_factory):
    sb = cluster_factory(3)
    ids = sorted(b.bookie_id for b in sb.bookies)
    zk = sb.connect_string
    assert ok(shell("listbookies", zk=zk)) == ids
    assert ok(shell("listbookies", "--zk", zk)) == ids          # --zk after the command too
    assert ok(shell("listbookies", env_zk=zk)) == ids           # default: $SPARK_BOOKIE_ZK
    assert ok(shell("listbookies", "--readonly", zk=zk)) == []
    listed = json.loads(shell("listbookies", "--json", zk=zk).stdout)
    assert listed == [{"bookie_id": b, "state": "writable"} for b in ids]

    lines = ok(shell("simpletest", "--entries", "300", zk=zk))
    assert len(lines) == 1 and "entries/s" in lines[0] and "ledger " in lines[0]
    report = json.loads(shell("simpletest", "--json", "--ensemble", "3", "--write-quorum", "3",
                              "--ack-quorum", "2", "--entries", "200", zk=zk).stdout)
    assert report["entries"] == 200 and report["verified"] and report["write_entries_per_s"] > 0
    assert ok(shell("listledgers", zk=zk)) == []                  # simpletest deletes its ledgers
    assert ok(shell("simpletest", zk=zk))                         # defaults: E3 Qw2 Qa2, 1000 x 1 KiB


def test_ledger_commands_round_trip(cluster_factory):
    sb = cluster_factory(3)
    zk = sb.connect_string
    with client(sb) as c:
        w = c.create_ledger(3, 2, 2, DigestType.CRC32C, b"", {"app": b"shell-test", "raw": b"\x00\xff"})
        texts = [f"entry-{i}".encode() for i in range(10)]
        for t in texts:
            w.append(t)
        w.append(BINARY)
        w.append(TABBED)
        w.close()
        other = c.create_ledger(3, 3, 3)
        other.close()
    lid = w.ledger_id

    assert ok(shell("listledgers", zk=zk)) == [str(x) for x in sorted([lid, other.ledger_id])]

    md_text = ok(shell("ledgermetadata", str(lid), zk=zk))
    assert "state: CLOSED" in md_text and "last_entry_id: 11" in md_text
    assert "ensemble_size: 3" in md_text and "write_quorum_size: 2" in md_text
    assert "ack_quorum_size: 2" in md_text and "digest_type: CRC32C" in md_text
    assert "  app: shell-test" in md_text and "  raw: hex:00ff" in md_text
    fragments = md_text[md_text.index("ensembles:") + 1:]
    assert len(fragments) == 1 and fragments[0].startswith("  0: [")
    assert all(b in fragments[0] for b in w.metadata.ensembles[0])
    md = json.loads(shell("ledgermetadata", "--json", str(lid), zk=zk).stdout)
    assert md["ledger_id"] == lid and md["state"] == "CLOSED" and md["last_entry_id"] == 11
    assert md["length"] == sum(len(t) for t in texts) + len(BINARY) + len(TABBED)
    assert md["ensembles"] == {"0": w.metadata.ensembles[0]}
    assert md["custom_metadata"]["app"] == {"encoding": "utf-8", "value": "shell-test"}

    lines = ok(shell("readledger", str(lid), zk=zk))
    expected = [f"{i}\tentry-{i}" for i in range(10)]
    expected += [f"10\t{BINARY.hex()}", f"11\t{TABBED.hex()}"]   # not clean printable UTF-8
    assert lines == expected
    assert ok(shell("readledger", str(lid), "--from", "3", "--to", "5", zk=zk)) == expected[3:6]
    assert ok(shell("readledger", str(lid), "--from", "9", "--to", "500", zk=zk)) == expected[9:]
    rows = [json.loads(x) for x in ok(shell("readledger", "--json", str(lid), "--to", "0", zk=zk))]
    assert rows == [{"entry_id": 0, "length": 7, "encoding": "utf-8", "payload": "entry-0"}]

    assert ok(shell("deleteledger", str(lid), zk=zk)) == [f"deleted ledger {lid}"]
    assert ok(shell("listledgers", zk=zk)) == [str(other.ledger_id)]
    failed(shell("ledgermetadata", str(lid), zk=zk), "spark-bookie shell: error:", "no such ledger")


def test_readledger_without_recovery_leaves_the_writer_alone(cluster_factory):
    sb = cluster_factory(3)
    zk = sb.connect_string
    with client(sb) as c:
        w = c.create_ledger(3, 3, 2, password=b"pw")
        for i in range(6):
            w.append(f"e{i}".encode())
        # Open ledger: the readable end is the LAC the bookies know (at least entry 4, the last
        # entry whose successor piggy-backed its confirmation).
        lines = ok(shell("readledger", str(w.ledger_id), "--password", "pw", zk=zk))
        assert 5 <= len(lines) <= 6 and lines[:5] == [f"{i}\te{i}" for i in range(5)]
        assert w.append(b"still writable") == 6
        failed(shell("readledger", str(w.ledger_id), zk=zk), "spark-bookie shell: error:", "password")

        lines = ok(shell("readledger", str(w.ledger_id), "--password", "pw", "--recover", zk=zk))
        assert lines == [f"{i}\te{i}" for i in range(6)] + ["6\tstill writable"]
        with pytest.raises(errors.LedgerError):
            w.append(b"fenced")
        assert "state: CLOSED" in ok(shell("ledgermetadata", str(w.ledger_id), zk=zk))


def test_errors_exit_2_with_a_message(cluster_factory):
    sb = cluster_factory(3)
    zk = sb.connect_string
    for cmd in ("ledgermetadata", "readledger", "deleteledger"):
        failed(shell(cmd, "424242", zk=zk), "spark-bookie shell: error:", "no such ledger")
    failed(shell("simpletest", "--ensemble", "5", "--write-quorum", "5", "--ack-quorum", "3",
                 "--entries", "10", zk=zk), "spark-bookie shell: error:")
    failed(shell("simpletest", "--write-quorum", "2", "--ack-quorum", "3", zk=zk),
           "spark-bookie shell: error:", "ack_quorum_size")
    failed(shell("simpletest", "--entries", "0", zk=zk), "spark-bookie shell: error:")
    failed(shell("readledger", "1", "--from", "5", "--to", "2", zk=zk), "spark-bookie shell: error:")
    failed(shell("readledger", "not-a-number", zk=zk), "invalid")
    failed(shell("nosuchcommand", zk=zk), "invalid choice")


def test_zookeeper_unreachable_fails_fast():
    from spark_bookie.local.zookeeper import free_port

    start = time.monotonic()
    proc = shell("listledgers", zk=f"127.0.0.1:{free_port()}", timeout=60)
    elapsed = time.monotonic() - start
    failed(proc, "spark-bookie shell: error:", "ZooKeeper")
    assert elapsed < 20, f"took {elapsed:.1f} s"
