"""The embedded ZooKeeper (pyspark's jars) as a child process: start, stop, errors, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metadata import connect
from spark_bookie.local.zookeeper import (
    EmbeddedZooKeeper,
    JavaNotFoundError,
    PortInUseError,
    ZooKeeperError,
    ZooKeeperExitedError,
    ZooKeeperStartTimeoutError,
    find_pyspark_jars,
    four_letter_word,
    free_port,
    port_in_use,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_serve_stop(tmp_path: Path) -> None:
    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk")
    started = time.monotonic()
    zk.start()
    print(f"embedded ZooKeeper ready in {time.monotonic() - started:.2f} s")
    try:
        assert zk.running and zk.connect_string == f"127.0.0.1:{zk.port}"
        assert four_letter_word(zk.port, "ruok") == "imok"
        assert "Mode: standalone" in four_letter_word(zk.port, "srvr")
        config = (tmp_path / "zk" / "zoo.cfg").read_text()
        assert "clientPortAddress=127.0.0.1" in config and "admin.enableServer=false" in config
        zk.start()  # already running: no-op
    finally:
        pid = zk.pid
        code = zk.stop()
    assert code in (0, 143)
    assert pid is not None and not _pid_alive(pid)
    assert not port_in_use(zk.port)
    assert zk.stop() is None  # idempotent
    log = zk.log_path.read_text() if zk.log_path.exists() else ""
    assert " INFO " not in log  # warnings only


def test_data_survives_restart(tmp_path: Path) -> None:
    with EmbeddedZooKeeper(free_port(), tmp_path / "zk") as zk:
        with connect(zk.connect_string) as store:
            instance = store.cluster.init_cluster()
    with EmbeddedZooKeeper(zk.port, tmp_path / "zk") as zk2, connect(zk2.connect_string) as store:
        assert store.cluster.instance_id() == instance


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port}"):
            EmbeddedZooKeeper(port, tmp_path / "zk").start()


def test_second_server_on_the_same_port_is_refused(tmp_path: Path) -> None:
    with EmbeddedZooKeeper(free_port(), tmp_path / "a") as zk:
        with pytest.raises(PortInUseError):
            EmbeddedZooKeeper(zk.port, tmp_path / "b").start()
        assert four_letter_word(zk.port, "ruok") == "imok"


def test_early_exit_shows_the_log(tmp_path: Path) -> None:
    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk", max_session_timeout_ms=1000)  # < min (2 s)
    with pytest.raises(ZooKeeperExitedError, match="exited with code") as info:
        zk.start()
    assert "SessionTimeout" in str(info.value)
    assert not zk.running


def test_readiness_timeout_stops_the_process(tmp_path: Path) -> None:
    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk")
    with pytest.raises(ZooKeeperStartTimeoutError, match="did not become ready"):
        zk.start(timeout_s=0.01)
    assert not zk.running and zk.pid is None
    assert not port_in_use(zk.port)


def test_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFoundError, match="java"):
        EmbeddedZooKeeper(free_port(), tmp_path / "zk").start()
    assert issubclass(JavaNotFoundError, ZooKeeperError)


def test_pyspark_jars_have_zookeeper() -> None:
    assert any(find_pyspark_jars().glob("zookeeper-3.9.*.jar"))


_FOREGROUND = (
    "import sys; from spark_bookie.local.zookeeper import run_foreground; "
    "sys.exit(run_foreground(int(sys.argv[1]), sys.argv[2]))"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_foreground_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _FOREGROUND, str(port), str(tmp_path / "zk")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"127.0.0.1:{port}"
        assert four_letter_word(port, "ruok") == "imok"
        proc.send_signal(sig)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while port_in_use(port):  # the JVM is gone with it
        assert time.monotonic() < deadline, "ZooKeeper still holds its port after a clean stop"
        time.sleep(0.1)


def test_run_foreground_reports_start_failure(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-c", _FOREGROUND, str(port), str(tmp_path / "zk")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert "already in use" in done.stderr and done.stdout == ""


def test_min_session_below_two_ticks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="below two ticks"):
        EmbeddedZooKeeper(free_port(), tmp_path / "zk", tick_time_ms=1500, min_session_timeout_ms=2000)
