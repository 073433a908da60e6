"""The DC/OS deployment, run: the commands of the Marathon group that `spark-bookie deploy render`
emits, each on a host of its own (network namespaces, spark_bookie.local.hosts) with the
environment Marathon would give it ($HOST, $PORT0.., $MESOS_SANDBOX, the persistent volume mounted
at the data root, the Mesos-DNS name of the master), without Marathon. The bookies come up in the
executors on their hosts, a client writes, one worker host is killed whole, its ledgers are
re-replicated onto the others, nothing is lost, and `cluster status` says so."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NAME = "sb"
WORKERS = 3


def options(zk: str, data_root: Path) -> dict[str, Any]:
    """Small sizes (a 2-core CI machine runs all of it) but otherwise the package's defaults."""
    return {"bookie": {"name": NAME, "instances": WORKERS, "cpus": 1, "mem": 1536, "zk_client": zk,
                       "data_root": str(data_root), "volume_size": 1024},
            "spark": {"daemon_memory_mb": 256, "executor_memory_mb": 512, "master_mem": 1024,
                      "driver_mem": 1536, "driver_memory_mb": 512}}


def marathon_env(app: dict[str, Any], host: Any, sandbox: Path, ports: list[int]) -> dict[str, str]:
    """What Marathon/Mesos put in a task's environment (host networking), plus PATH to this venv
    (the image's python3 and spark-class)."""
    venv_bin = str(Path(sys.executable).parent)
    env = {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(sandbox), "LANG": "C.UTF-8",
           "HOST": host.address, "MESOS_SANDBOX": str(sandbox), "MARATHON_APP_ID": app["id"],
           "PORTS": ",".join(map(str, ports))}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    for i, (port, definition) in enumerate(zip(ports, app.get("portDefinitions", []), strict=False)):
        env[f"PORT{i}"] = str(port)
        env[f"PORT_{definition['name'].upper()}"] = str(port)
    env.update(app.get("env", {}))
    return env


def launch(app: dict[str, Any], host: Any, root: Path, volume_mount: str | None) -> subprocess.Popen[bytes]:
    sandbox = root / f"sandbox-{app['id'].rsplit('/', 1)[-1]}"
    sandbox.mkdir(parents=True, exist_ok=True)
    ports = [d["port"] or 31000 + i for i, d in enumerate(app.get("portDefinitions", []))]
    volume = (host.root / "volume", volume_mount) if volume_mount else None
    env = marathon_env(app, host, sandbox, ports)
    return host.popen(["sh", "-c", app["cmd"]], log_path=sandbox / "stdout", env=env, volume=volume,
                      cwd=Path(__file__).parents[2])


def wait_until(cond: Any, timeout_s: float, what: str, logs: list[Path] = ()) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                      for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{tails}")


def alive_workers(master: Any) -> int:
    try:
        with urllib.request.urlopen(f"http://{master.address}:8080/json/", timeout=3) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


def test_marathon_group_runs_on_separate_hosts(tmp_path: Path, seed: int) -> None:
    from metadata import connect as connect_metadata
    from spark_bookie.deploy.render import master_host, render_group
    from spark_bookie.local.hosts import namespaces_unavailable
    from spark_bookie.local.multihost import MultiHostCluster

    if why := namespaces_unavailable():
        pytest.skip(f"needs network namespaces: {why}")
    rng = random.Random(seed)
    mount = tmp_path / "volume-mount"
    mount.mkdir()
    with MultiHostCluster(tmp_path / "mh", WORKERS + 2, bookie_hosts=0) as cluster:
        hosts = list(cluster.hosts)
        master, workers, driver = hosts[0], hosts[1:1 + WORKERS], hosts[-1]
        group = render_group(options(cluster.connect_string, mount))
        apps = {a["id"].rsplit("/", 1)[-1]: a for a in group["apps"]}
        for h in hosts:
            h.name_hosts({master_host(NAME): master.address})
        logs = [tmp_path / f"sandbox-{n}" / "stdout" for n in apps]
        launch(apps["spark-master"], master, tmp_path, None)
        wait_until(lambda: alive_workers(master) >= 0 and _port_open(master.address, 7077), 180,
                   "the Spark master", logs)
        for w in workers:
            launch(apps["spark-workers"], w, w.root, str(mount))
        logs += [w.root / "sandbox-spark-workers" / "stdout" for w in workers]
        wait_until(lambda: alive_workers(master) == WORKERS, 300, f"{WORKERS} workers registered", logs)
        launch(apps["bookie-cluster-driver"], driver, tmp_path, None)
        zk = f"{cluster.connect_string}/{NAME}/ledgers"
        store = connect_metadata(zk)
        try:
            wait_until(lambda: _bookies_on(store, workers) == WORKERS, 600, "a bookie on every worker host", logs)
            run_cluster_checks(store, zk, cluster, workers, driver, rng, logs)
        finally:
            store.close()
            for h in hosts:
                cluster.hosts.kill(h)


def run_cluster_checks(store: Any, zk: str, cluster: Any, workers: list[Any], driver: Any, rng: random.Random,
                       logs: list[Path]) -> None:
    from ledger_client import ClientConfig, LedgerClient

    bookies = store.cluster.list_bookies()  # one per worker host, each id the host's address: one slot each
    assert sorted(b.rsplit(":", 1)[0] for b in bookies) == sorted(w.address for w in workers), bookies
    config = ClientConfig(add_timeout_ms=5_000, zk_session_timeout_ms=10_000)
    with LedgerClient(zk, config=config) as c:
        ledgers = []
        for _ in range(4):
            w = c.create_ledger(2, 2, 2)
            for i in range(100):
                w.append(b"deploy-%d-%d" % (w.ledger_id, i))
            w.close()
            ledgers.append(w.ledger_id)
        victim = rng.choice(workers)
        dead = [b for b in bookies if b.startswith(victim.address + ":")]
        print(f"killing worker host {victim.name} ({dead})")
        cluster.hosts.kill(victim)

        def repaired() -> bool:
            return all(not set(dead) & set(store.ledgers.read_ledger_metadata(lid)[0].bookies()) for lid in ledgers) \
                and not store.underreplication.list_underreplicated()
        wait_until(repaired, 600, f"the ledgers on {dead} re-replicated", logs)
        for lid in ledgers:
            md = store.ledgers.read_ledger_metadata(lid)[0]
            for ensemble in md.ensembles.values():
                assert len({b.rsplit(":", 1)[0] for b in ensemble}) == len(ensemble), ensemble
            r = c.open_ledger(lid, recovery=False)
            assert [e.data for e in r.read(0, 99)] == [b"deploy-%d-%d" % (lid, i) for i in range(100)]
    health: dict[str, Any] = {}

    def status_says_so() -> bool:
        nonlocal health
        status = driver.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "status", "--zk", zk,
                             "--name", NAME, "--json"], timeout_s=120)
        health = json.loads(status.stdout or "{}")
        return health.get("under_replicated") == 0 and health.get("slots_serving") == WORKERS - 1
    wait_until(status_says_so, 180, "`cluster status` to show the lost slot and nothing under-replicated", logs)
    print(json.dumps(health, indent=1))
    lost = [s for s in health["slots"].values() if s["bookie_id"] in dead]
    assert lost and all(s["state"] != "serving" for s in lost), health


def _bookies_on(store: Any, workers: list[Any]) -> int:
    addresses = {w.address for w in workers}
    return len({b.rsplit(":", 1)[0] for b in store.cluster.list_bookies()} & addresses)


def _port_open(address: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((address, port), timeout=1).close()
        return True
    except OSError:
        return False
