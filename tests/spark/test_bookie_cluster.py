"""The Spark-hosted bookie cluster (jobs/bookie_cluster.py) on a real local-cluster[3,1,1024].

One application for the module (it takes a while to start on a loaded 2-core box), driven the way an
operator would: `spark-submit --master local-cluster[3,1,1024] --conf ... jobs/bookie_cluster.py` as
the README documents it, a child process in its own session, bookies in
executor JVMs, a real ZooKeeper, clients of the public API, kill -9 of an executor JVM, `spark-bookie
cluster stop`. The tests run in file order and share the application: register → kill an executor
mid-write (same slot comes back) → a slot that does not come back is re-replicated → graceful stop.

The last test runs the same job under pyspark 3.5 (scripts/pyspark35-venv builds .venv-spark35).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hosting_helpers import COMEBACK_S, hosting_cluster, wait_until

from ledger_client import ClientConfig, LedgerClient
from ledger_client.machines.quorum import write_set
from metadata import MetadataStore
from metadata import connect as connect_metadata
from spark_bookie.hosting.slots import FAILED, SERVING, STOPPED, read_slot_statuses
from spark_bookie.local.sandbox import SparkSandbox

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
NAME = "bookie-cluster"
MARK = uuid.uuid4().hex  # a spark-submit --conf that must reach the executors (spark.executorEnv.*)
PW = b"pw"
CLIENT = ClientConfig(add_timeout_ms=3_000, read_timeout_ms=5_000, speculative_read_timeout_ms=300,
                      operation_timeout_ms=120_000, zk_session_timeout_ms=4_000)
# Generous: an executor JVM takes 5 s on a quiet machine and over a minute under load to come back.


def payload(ledger: str, i: int) -> bytes:
    return f"{ledger}-{i:06d}|".encode() * 8


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "gone"


class Writer(threading.Thread):
    """Appends to one ledger continuously; remembers every acknowledged entry."""

    def __init__(self, client: LedgerClient, name: str) -> None:
        super().__init__(name=f"writer-{name}", daemon=True)
        self.handle = client.create_ledger(2, 2, 2, password=PW)
        self.tag = name
        self.acked: dict[int, bytes] = {}
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                data = payload(self.tag, i)
                self.acked[self.handle.append(data)] = data
                i += 1
                time.sleep(0.002)
        except BaseException as e:  # the test reports it
            self.error = e


# ---------------------------------------------------------------------- the application

@pytest.fixture(scope="module")
def cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSandbox]:
    # lostBookieRecoveryDelay 1 h until test_slot_that_does_not_come_back...: no re-replication
    with hosting_cluster(tmp_path_factory.mktemp("bookie-cluster"), zk_server, lost_bookie_delay_s=3_600,
                         submit_conf={"spark.executorEnv.SPARK_BOOKIE_SUBMIT_MARK": MARK}) as sb:
        yield sb


def _set_lost_bookie_delay(zk: str, seconds: int) -> None:
    """The cluster-wide lostBookieRecoveryDelay (the auditor watches it)."""
    with connect_metadata(zk) as store:
        store.underreplication.set_lost_bookie_recovery_delay_s(seconds)


def _underreplicated(zk: str) -> dict[int, list[str]]:
    with connect_metadata(zk) as store:
        return store.underreplication.list_underreplicated()


def slots(sb: SparkSandbox) -> dict[int, dict[str, Any]]:
    assert sb.store is not None
    return read_slot_statuses(sb.store, NAME)


def slot_of(sb: SparkSandbox, bookie_id: str) -> tuple[int, dict[str, Any]]:
    return next((k, s) for k, s in slots(sb).items() if s["bookie_id"] == bookie_id)


def diag(sb: SparkSandbox) -> Callable[[], str]:
    return lambda: f"slots: {slots(sb)}\ndriver log:\n{sb.log_tail()}"


# ---------------------------------------------------------------------- tests, in order

@pytest.mark.timeout(900)
def test_three_executor_hosted_bookies_register(cluster: SparkSandbox) -> None:
    store: MetadataStore = cluster.store  # type: ignore[assignment]
    assert sorted(store.cluster.list_bookies()) == sorted(cluster.bookie_ids)
    wait_until(lambda: all(s.get("state") == SERVING for s in slots(cluster).values()) and len(slots(cluster)) == 3,
               60, "three slots serving", diag(cluster))
    st = slots(cluster)
    # One bookie per executor JVM, at base port + slot, registered with the executor host's location.
    assert len({s["executor_pid"] for s in st.values()}) == 3
    assert all(s["autorecovery"] == "worker" for s in st.values())  # a replication worker beside each bookie
    assert (store.underreplication.current_auditor() or "").startswith("driver:")
    assert all(s["executor_pid"] and pid_alive(s["executor_pid"]) for s in st.values())
    # spark-submit's master and --conf reached the application (they did not before: local mode,
    # every bookie a Python worker of the driver's own JVM): an application of local-cluster, and
    # each bookie in an executor JVM of its own whose environment carries the --conf'd variable.
    assert all(s["app_id"] and not s["app_id"].startswith("local-") for s in st.values())
    for s in st.values():
        cmdline = Path(f"/proc/{s['executor_pid']}/cmdline").read_bytes().split(b"\0")
        assert b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline
        environ = Path(f"/proc/{s['executor_pid']}/environ").read_bytes().split(b"\0")
        assert f"SPARK_BOOKIE_SUBMIT_MARK={MARK}".encode() in environ
    for k, s in st.items():
        assert s["bookie_id"] == f"127.0.0.1:{cluster.base_port + k}"
        assert store.cluster.bookie_info(s["bookie_id"])["network_location"] == "/127.0.0.1"
    status = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "status", "--zk",
                             cluster.connect_string], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "driver: running" in status.stdout and status.stdout.count(": serving ") == 3


@pytest.mark.timeout(900)
def test_kill_executor_mid_write_same_slot_comes_back(cluster: SparkSandbox) -> None:
    with LedgerClient(cluster.connect_string, config=CLIENT) as client:
        striped = client.create_ledger(3, 2, 2, password=PW)  # E3/Qw2/Qa2: every bookie holds part of it
        striped_data = {striped.append(payload("striped", i)): payload("striped", i) for i in range(60)}
        striped.close()
        # Writes go on through the kill: E2 leaves the third bookie to replace the killed one.
        writer = Writer(client, "through-kill")
        writer.start()
        wait_until(lambda: len(writer.acked) >= 50, 60, "first acknowledged entries")
        victim = writer.handle.metadata.ensembles[0][0]
        k, before = slot_of(cluster, victim)
        os.kill(before["executor_pid"], signal.SIGKILL)
        at_kill = len(writer.acked)

        wait_until(lambda: len(writer.acked) >= at_kill + 100 or writer.error is not None, 120,
                   "writes to continue after the kill", diag(cluster))
        assert writer.error is None, writer.error
        assert victim not in writer.handle.metadata.ensembles[max(writer.handle.metadata.ensembles)]

        # Spark retries the slot's task on a new executor; it reclaims slot k: same id, same data.
        wait_until(lambda: victim in cluster.store.cluster.list_bookies()  # type: ignore[union-attr]
                   and slot_of(cluster, victim)[1]["executor_pid"] not in (None, before["executor_pid"])
                   and slot_of(cluster, victim)[1]["state"] == SERVING,
                   COMEBACK_S, f"bookie {victim} back in slot {k}", diag(cluster))
        after = slot_of(cluster, victim)[1]
        assert after["task_attempt_id"] != before["task_attempt_id"]
        assert sorted(cluster.store.cluster.list_bookies()) == sorted(cluster.bookie_ids)  # type: ignore[union-attr]
        assert writer.error is None, writer.error
        writer.stop.set()
        writer.join(30)
        writer.handle.close()

        _check_reads_back(client, striped.ledger_id, striped_data)
        _check_reads_back(client, writer.handle.ledger_id, writer.acked)
        _check_bookie_holds(victim, striped.ledger_id, striped_data, striped.metadata.ensembles[0])


def _check_reads_back(client: LedgerClient, ledger_id: int, acked: dict[int, bytes]) -> None:
    r = client.open_ledger(ledger_id, password=PW, recovery=True)
    assert r.last_add_confirmed >= max(acked)
    got = {e.entry_id: e.data for e in r.read(0, max(acked))}
    lost = [eid for eid, data in acked.items() if got.get(eid) != data]
    assert not lost, f"ledger {ledger_id}: acknowledged entries lost or changed: {lost[:20]}"


def _check_bookie_holds(bookie_id: str, ledger_id: int, entries: dict[int, bytes], ensemble: list[str]) -> None:
    """The restarted bookie itself still serves what it stored before the kill (its data came back)."""
    from ledger_client.protocol import bookkeeper_pb2 as pb
    from ledger_client.transport import BookieClient

    pos = ensemble.index(bookie_id)
    mine = [e for e in entries if pos in write_set(e, len(ensemble), 2)]
    assert mine
    from ledger_client.errors import BookieUnavailableError

    deadline = time.monotonic() + COMEBACK_S
    with BookieClient(bookie_id, timeout_ms=10_000) as bc:
        for e in mine:
            while True:
                try:
                    resp = bc.read(ledger_id, e)
                    break
                except BookieUnavailableError:
                    # On a loaded host Spark may lose the new executor too and retry the slot once
                    # more; what must hold is that the bookie comes back with this data.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
            assert resp.status == pb.EOK, f"entry {e}: {pb.StatusCode.Name(resp.status)}"
            assert resp.body.endswith(entries[e])


@pytest.mark.timeout(900)
def test_slot_that_does_not_come_back_is_rereplicated(cluster: SparkSandbox) -> None:
    """The slot's disk is lost while its executor is down: its bookie refuses to start (cookie), the
    slot reports `failed`, and the driver's auditor has its ledgers re-replicated by the workers."""
    zk = cluster.connect_string
    with LedgerClient(zk, config=CLIENT) as client:
        w = client.create_ledger(2, 2, 2, password=PW)
        data = {w.append(payload("lost", i)): payload("lost", i) for i in range(80)}
        w.close()
        victim = w.metadata.ensembles[0][0]
        k, before = slot_of(cluster, victim)
        _set_lost_bookie_delay(zk, 0)
        os.kill(before["executor_pid"], signal.SIGKILL)
        wait_until(lambda: not pid_alive(before["worker_pid"]), 30, "the slot's Python worker to die")
        shutil.rmtree(cluster.root / "data" / NAME / f"slot-{k}")  # the disk is gone

        wait_until(lambda: slot_of(cluster, victim)[1]["state"] == FAILED
                   and "cookie" in slot_of(cluster, victim)[1]["error"].lower(),
                   COMEBACK_S, f"slot {k} to report its bookie cannot start", diag(cluster))
        wait_until(lambda: victim not in {b for ens in client.ledger_metadata(w.ledger_id).ensembles.values()
                                          for b in ens},
                   COMEBACK_S, f"ledger {w.ledger_id} re-replicated off {victim}",
                   lambda: f"under-replicated: {_underreplicated(zk)}\n{diag(cluster)()}")
        wait_until(lambda: w.ledger_id not in _underreplicated(zk), 60, "the under-replication mark to clear")
        _check_reads_back(client, w.ledger_id, data)
    assert victim not in cluster.store.cluster.list_bookies()  # type: ignore[union-attr]


@pytest.mark.timeout(600)
def test_cluster_stop_is_graceful_and_leaves_nothing_behind(cluster: SparkSandbox) -> None:
    assert cluster.proc is not None and cluster.alive
    executors = [s["executor_pid"] for s in slots(cluster).values() if s.get("executor_pid")]
    workers = [s["worker_pid"] for s in slots(cluster).values()]
    out = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "stop", "--zk",
                          cluster.connect_string, "--wait-s", "180"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert cluster.proc.wait(timeout=120) == 0, cluster.log_tail()
    assert cluster.store.cluster.list_bookies() == [] and cluster.store.cluster.list_bookies(readonly=True) == []  # type: ignore
    assert all(s["state"] == STOPPED for s in slots(cluster).values()), slots(cluster)
    wait_until(lambda: not cluster.group_members(), 30, "every process of the application to exit",
               lambda: str(cluster.group_members()))
    assert not [p for p in executors + workers if pid_alive(p)]


# ---------------------------------------------------------------------- when Spark gives up

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_driver_resubmits_the_hosting_job_when_spark_gives_up(zk_connect: str, tmp_path: Path) -> None:
    """With spark.task.maxFailures=1 the first executor loss aborts the hosting job (Spark kills the
    other slot's task too); the driver resubmits it and every slot comes back with its bookie id."""
    with connect_metadata(zk_connect) as store:
        store.cluster.init_cluster()
    sb = SparkSandbox(tmp_path, 2, zk_connect=zk_connect, start_timeout_s=COMEBACK_S, extra_args=[
        "--task-max-failures", "1", "--zk-session-timeout-ms", "4000", "--heartbeat-interval-s", "1",
        "--no-autorecovery"])
    try:
        sb.start()
        before = slots(sb)
        os.kill(before[0]["executor_pid"], signal.SIGKILL)
        wait_until(lambda: "resubmitting" in sb.driver_log.read_text(), COMEBACK_S, "the driver to resubmit",
                   diag(sb))
        old_attempts = {s["task_attempt_id"] for s in before.values()}
        wait_until(lambda: len(slots(sb)) == 2 and all(
            s["state"] == SERVING and s["task_attempt_id"] not in old_attempts for s in slots(sb).values())
            and sorted(sb.store.cluster.list_bookies()) == sorted(sb.bookie_ids),  # type: ignore[union-attr]
            COMEBACK_S, "both slots back after the resubmission", diag(sb))
        assert sb.stop() == 0, sb.log_tail()
    finally:
        sb.stop()


# ---------------------------------------------------------------------- pyspark 3.5

@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_hosting_job_runs_under_pyspark_35(zk_connect: str, tmp_path: Path) -> None:
    """The same job under pyspark 3.5 (the Spark of the legacy Mesos path): a bookie registers, a
    client writes and reads, and a clean stop unregisters it and leaves no process behind."""
    made = subprocess.run([str(REPO / "scripts" / "pyspark35-venv")], capture_output=True, text=True, timeout=1200)
    assert made.returncode == 0, made.stdout + made.stderr
    python = made.stdout.strip().splitlines()[-1]
    assert subprocess.run([python, "-c", "import pyspark; assert pyspark.__version__.startswith('3.5')"],
                          timeout=120).returncode == 0
    with connect_metadata(zk_connect) as store:
        store.cluster.init_cluster()
    sb = SparkSandbox(tmp_path, 1, zk_connect=zk_connect, python=python, master="local[2]",
                      extra_args=["--zk-session-timeout-ms", "4000", "--heartbeat-interval-s", "1"],
                      start_timeout_s=COMEBACK_S)
    try:
        sb.start()
        assert "INFO spark_bookie.hosting.driver: Spark 3.5." in sb.driver_log.read_text()
        with LedgerClient(zk_connect, config=CLIENT) as client:
            w = client.create_ledger(1, 1, 1, password=PW)
            data = {w.append(payload("spark35", i)): payload("spark35", i) for i in range(20)}
            w.close()
            _check_reads_back(client, w.ledger_id, data)
        assert sb.proc is not None
        sb.proc.send_signal(signal.SIGTERM)  # the driver's own clean stop (the module's other test uses the CLI)
        assert sb.proc.wait(timeout=120) == 0, sb.log_tail()
        assert "stopping the bookie cluster: signal SIGTERM" in sb.driver_log.read_text()
        with connect_metadata(zk_connect) as store:
            assert store.cluster.list_bookies() == []
        wait_until(lambda: not sb.group_members(), 30, "every process of the application to exit",
                   lambda: str(sb.group_members()))
    finally:
        sb.stop()
