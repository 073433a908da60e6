"""The slot task of the Spark hosting job (spark_bookie.hosting.slots.run_slot), run in a thread without
Spark: real ZooKeeper, a real bookie, the stop request, slot reclaiming and a lost slot directory.
The Spark side (executors, kill -9, retries) is in tests/spark/test_bookie_cluster.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger_client import ClientConfig, LedgerClient
from metadata import MetadataStore
from metadata import connect as connect_metadata
from spark_bookie.errors import ConfigError
from spark_bookie.hosting.slots import (
    FAILED,
    SERVING,
    STOPPED,
    HostingConfig,
    SlotBusyError,
    app_key,
    read_slot_statuses,
    request_stop,
    run_slot,
)
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration

CLIENT = ClientConfig(add_timeout_ms=3_000, read_timeout_ms=3_000, zk_session_timeout_ms=4_000)


class SlotThread(threading.Thread):
    def __init__(self, cfg: HostingConfig, slot: int = 0) -> None:
        super().__init__(daemon=True)
        self.cfg, self.slot = cfg, slot
        self.output: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.output = list(run_slot(self.cfg, self.slot, []))
        except BaseException as e:
            self.error = e


def wait_until(pred: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def store(zk_connect: str) -> Any:
    with connect_metadata(zk_connect) as s:
        s.cluster.init_cluster()
        yield s


def config(zk: str, root: Path, **kw: Any) -> HostingConfig:
    base = dict(zk_connect=zk, bookies=1, data_root=str(root), base_port=free_port(), autorecovery=False,
                heartbeat_interval_ms=200, zk_session_timeout_ms=4_000,
                bookie_settings=(("gc_interval_ms", 3_600_000), ("journal_preallocate_bytes", 1 << 20)))
    base.update(kw)
    return HostingConfig(**base).validate()  # type: ignore[arg-type]


def status(store: MetadataStore, slot: int = 0) -> dict[str, Any]:
    return read_slot_statuses(store, "bookie-cluster").get(slot, {})


def test_slot_serves_until_stop_request_and_comes_back_with_same_id_and_data(
        zk_connect: str, store: MetadataStore, tmp_path: Path) -> None:
    cfg = config(zk_connect, tmp_path)
    bookie_id = f"127.0.0.1:{cfg.base_port}"
    t = SlotThread(cfg)
    t.start()
    wait_until(lambda: status(store).get("state") == SERVING, what="slot serving")
    assert store.cluster.list_bookies() == [bookie_id]
    wait_until(lambda: status(store).get("registered") is True, what="heartbeat reporting the registration")
    assert store.cluster.bookie_info(bookie_id)["network_location"] == "/127.0.0.1"
    with LedgerClient(zk_connect, config=CLIENT) as client:
        w = client.create_ledger(1, 1, 1, password=b"pw")
        ids = [w.append(f"e{i}".encode()) for i in range(10)]
        w.close()
    request_stop(store, cfg.name, "test")
    t.join(30)
    assert not t.is_alive() and t.error is None, t.error
    assert json.loads(t.output[0])["state"] == STOPPED
    assert store.cluster.list_bookies() == []  # unregistered on a graceful stop
    assert status(store)["state"] == STOPPED

    store.cluster.delete_app_data(app_key(cfg.name, "stop"))  # what the next driver does at start
    t2 = SlotThread(cfg)
    t2.start()
    wait_until(lambda: store.cluster.list_bookies() == [bookie_id], what="same bookie back")
    with LedgerClient(zk_connect, config=CLIENT) as client:
        r = client.open_ledger(w.ledger_id, password=b"pw")
        assert [e.data for e in r.read(0, ids[-1])] == [f"e{i}".encode() for i in range(10)]
    request_stop(store, cfg.name, "test")
    t2.join(30)
    assert not t2.is_alive() and t2.error is None


def test_a_second_task_cannot_take_a_held_slot(zk_connect: str, store: MetadataStore, tmp_path: Path) -> None:
    cfg = config(zk_connect, tmp_path, slot_claim_timeout_ms=1_000)
    first = SlotThread(cfg)
    first.start()
    wait_until(lambda: status(store).get("state") == SERVING, what="first task serving")
    second = SlotThread(cfg)
    second.start()
    second.join(30)
    assert isinstance(second.error, SlotBusyError)
    assert status(store)["state"] == SERVING  # the holder is untouched
    request_stop(store, cfg.name, "test")
    first.join(30)
    assert first.error is None


def test_lost_slot_directory_reports_failed_and_stops_cleanly(
        zk_connect: str, store: MetadataStore, tmp_path: Path) -> None:
    cfg = config(zk_connect, tmp_path, start_retry_delay_ms_max=500)
    t = SlotThread(cfg)
    t.start()
    wait_until(lambda: status(store).get("state") == SERVING, what="slot serving")
    request_stop(store, cfg.name, "test")
    t.join(30)
    store.cluster.delete_app_data(app_key(cfg.name, "stop"))
    shutil.rmtree(cfg.slot_dir(0))  # the disk was replaced
    t = SlotThread(cfg)
    t.start()
    wait_until(lambda: status(store).get("state") == FAILED, what="slot failed")
    assert "cookie" in status(store)["error"].lower()
    assert store.cluster.list_bookies() == []
    time.sleep(1.5)
    assert t.is_alive()  # keeps retrying rather than failing the task (and the job)
    request_stop(store, cfg.name, "test")
    t.join(30)
    assert not t.is_alive() and t.error is None
    assert status(store)["state"] == STOPPED


def test_slot_runs_a_replication_worker_beside_its_bookie(
        zk_connect: str, store: MetadataStore, tmp_path: Path) -> None:
    cfg = config(zk_connect, tmp_path, autorecovery=True, autorecovery_settings=(("zk_session_timeout_ms", 4_000),))
    t = SlotThread(cfg)
    t.start()
    wait_until(lambda: status(store).get("state") == SERVING, what="slot serving")
    assert status(store)["autorecovery"] == "worker"
    assert store.underreplication.current_auditor() is None  # a worker, not an auditor candidate: that is the driver
    request_stop(store, cfg.name, "test")
    t.join(30)
    assert not t.is_alive() and t.error is None


@pytest.mark.parametrize("kw, msg", [
    ({"bookies": 0}, "bookies"), ({"base_port": 65535, "bookies": 2}, "ports"),
    ({"name": "a/b"}, "name"), ({"network_location_template": "/{rack}"}, "template")])
def test_bad_hosting_config_is_refused(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        HostingConfig(**{"zk_connect": "h:1", "bookies": 1, "data_root": "/d", **kw}).validate()


def test_network_location_from_rack_map_else_template() -> None:
    cfg = HostingConfig(zk_connect="h:1", bookies=2, data_root="/d", rack_map=(("h1", "/rack-a"),),
                        network_location_template="/zone/{host}")
    assert cfg.network_location("h1", 0) == "/rack-a"
    assert cfg.network_location("h2", 1) == "/zone/h2"
    assert cfg.slot_dir(1) == Path("/d/bookie-cluster/slot-1") and cfg.port(1) == cfg.base_port + 1


def test_hosting_modules_import_neither_grpc_nor_pyspark() -> None:
    """The pyspark daemon forks the Python workers: grpc may only be imported inside the task."""
    code = ("import sys, spark_bookie.hosting.slots, spark_bookie.hosting.driver, jobs.bookie_cluster; "
            "print(sorted(m for m in ('grpc', 'pyspark', 'kazoo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
