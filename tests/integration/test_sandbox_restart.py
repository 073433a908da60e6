"""A second `spark-bookie sandbox` in the same directory (issue 27, item 7), as a new user tries it:
start, Ctrl-C, the same command again. It starts fresh (saying it deleted the previous data), a
client writes, and no traceback; `--resume` brings the previous sandbox back on its ports with its
data; every refusal is one line and exit 2. The same for --secure, --hosts and --spark (one test,
marked spark: three starts of a one-executor local-cluster)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sandbox_cli import SandboxRun, assert_one_line_error, run_cli

from ledger_client import ClientConfig, LedgerClient, errors

pytestmark = pytest.mark.integration

FRESH = "deleted the previous sandbox's data, starting fresh"


def _write(run: SandboxRun, payload: bytes, ensemble: int) -> int:
    conf = run.line(r"^client config: (\S+)$") if "client config: " in run.stdout else None
    cfg = ClientConfig.from_toml(conf) if conf else ClientConfig()
    with LedgerClient(run.zk, config=cfg) as c:
        w = c.create_ledger(ensemble, ensemble, ensemble, password=b"pw")
        w.append(payload)
        w.close()
        return w.ledger_id


def _read(run: SandboxRun, lid: int) -> bytes:
    conf = run.line(r"^client config: (\S+)$") if "client config: " in run.stdout else None
    with LedgerClient(run.zk, config=ClientConfig.from_toml(conf) if conf else ClientConfig()) as c:
        return c.open_ledger(lid, password=b"pw", recovery=False).read(0, 0)[0].data


def _ledgers(run: SandboxRun) -> list[int]:
    conf = run.line(r"^client config: (\S+)$") if "client config: " in run.stdout else None
    with LedgerClient(run.zk, config=ClientConfig.from_toml(conf) if conf else ClientConfig()) as c:
        return list(c.list_ledgers())


def _restart_then_resume(cwd: Path, args: tuple[str, ...], ensemble: int) -> None:
    """Start, write, Ctrl-C; start again (fresh: up, writes, the old ledger gone); Ctrl-C;
    --resume (same connect string, the second run's ledger still there); Ctrl-C."""
    runs: list[SandboxRun] = []
    try:
        first = SandboxRun(cwd, *args, name="first").start()
        runs.append(first)
        assert first.up, first.describe()
        _write(first, b"first", ensemble)
        assert first.interrupt() == 0, first.describe()

        second = SandboxRun(cwd, *args, name="second").start()
        runs.append(second)
        assert second.up and "Traceback" not in second.stderr, second.describe()
        assert FRESH in second.stdout, second.describe()
        assert _ledgers(second) == []                              # fresh: nothing of the first run
        lid = _write(second, b"second", ensemble)
        assert second.interrupt() == 0, second.describe()
        assert "Traceback" not in second.stderr, second.describe()

        resumed = SandboxRun(cwd, *args, "--resume", name="resumed").start()
        runs.append(resumed)
        assert resumed.up and "Traceback" not in resumed.stderr, resumed.describe()
        assert "resuming the previous sandbox" in resumed.stdout, resumed.describe()
        assert resumed.zk == second.zk                             # its recorded ports
        assert _read(resumed, lid) == b"second"                    # its data
        assert resumed.interrupt() == 0, resumed.describe()
    finally:
        for r in runs:
            r.kill()


def test_a_second_sandbox_in_the_same_directory_starts_fresh_and_resume_brings_it_back(tmp_path):
    """The user's steps: `sandbox --bookies 3` in a directory, Ctrl-C, the same again (./.sandbox)."""
    _restart_then_resume(tmp_path, ("--bookies", "3"), ensemble=3)
    assert (tmp_path / ".sandbox" / "sandbox.json").is_file()


def test_a_second_secure_sandbox_starts_fresh_and_resume_keeps_its_credentials(tmp_path):
    _restart_then_resume(tmp_path, ("--secure", "--bookies", "2"), ensemble=2)


@pytest.mark.parametrize("args", [("--hosts", "3"), ("--hosts", "2", "--secure")], ids=["hosts", "hosts-secure"])
def test_a_second_hosts_sandbox_starts_fresh_and_resumes(tmp_path, args):
    """--hosts: network namespaces as root (else loopback hosts); the same behaviour. (Before, a
    second `--hosts N` came up on its old data only when it got the same network slot, as bookies
    there always use port 3181; on loopback hosts, another slot, or with --secure it crashed.)"""
    _restart_then_resume(tmp_path, args, ensemble=int(args[1]))


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_second_spark_sandbox_starts_fresh_and_resumes(tmp_path):
    """--spark: the bookie in a Spark executor (local-cluster[1,1,1024]); the same behaviour."""
    _restart_then_resume(tmp_path, ("--spark", "--bookies", "1"), ensemble=1)


def test_refusals_are_one_line(tmp_path):
    """A second sandbox while one runs there, --resume with a port taken or other flags, nothing to
    resume, a --root holding other files: one line each, exit 2, nothing deleted."""
    assert_one_line_error(run_cli(tmp_path, "--resume"), "no sandbox to resume")
    stranger = tmp_path / "mine" / "notes.txt"
    stranger.parent.mkdir()
    stranger.write_text("keep me")
    assert_one_line_error(run_cli(tmp_path, "--root", str(stranger.parent)), "which no sandbox makes")
    assert stranger.read_text() == "keep me" and [p.name for p in stranger.parent.iterdir()] == ["notes.txt"]

    run = SandboxRun(tmp_path, "--bookies", "1").start()
    try:
        assert run.up, run.describe()
        assert_one_line_error(run_cli(tmp_path, "--bookies", "1"), "a sandbox is already running in")
        assert run.interrupt() == 0, run.describe()
    finally:
        run.kill()
    assert_one_line_error(run_cli(tmp_path, "--resume", "--secure"), "resume it with those flags")
    port = int(run.line(r"bookies 127\.0\.0\.1:(\d+)"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert_one_line_error(run_cli(tmp_path, "--resume"), f"port 127.0.0.1:{port} is in use")
    with pytest.raises(errors.LedgerError):   # nothing was left running
        LedgerClient(run.zk, config=ClientConfig(zk_connect_timeout_ms=2_000)).close()
