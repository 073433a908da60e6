"""`spark-bookie cluster status|stop` and `spark-bookie sandbox --spark`: the Spark-hosted bookie
cluster seen from outside, through what its driver and slots write in ZooKeeper."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from metadata import MetadataError, MetadataStore
from spark_bookie.hosting.health import cluster_health, health_line
from spark_bookie.hosting.slots import DEFAULT_NAME, STOPPED, app_key, decode_status, request_stop

if TYPE_CHECKING:
    from spark_bookie.local.sandbox_dir import SandboxDir, SandboxRecord


def add_cluster_parser(p: argparse.ArgumentParser, zk_default: str) -> None:
    sub = p.add_subparsers(dest="cluster_command", required=True)
    stop = sub.add_parser("stop", help="ask the running bookie-cluster application to stop gracefully")
    status = sub.add_parser("status", help="the hosting application's driver, slots and health")
    for q in (stop, status):
        q.add_argument("--zk", default=zk_default)
        q.add_argument("--name", default=DEFAULT_NAME, help="the application's --name")
    stop.add_argument("--wait-s", type=float, default=120.0, help="wait this long for the driver to stop (0: don't)")
    status.add_argument("--json", action="store_true")


def run_cluster(args: argparse.Namespace) -> int:
    from ledger_client.errors import LedgerError
    from metadata import connect as connect_md
    from spark_bookie.cli.common import client_config

    try:   # a secured cluster's ZooKeeper credentials and TLS: those of --client-conf
        cfg = client_config(getattr(args, "client_conf", None))
    except LedgerError as e:
        print(f"spark-bookie: error: {e}", file=sys.stderr)
        return 2
    try:
        store = connect_md(args.zk, zk_auth=cfg.zk_auth, zk_tls=cfg.zookeeper_tls())
    except MetadataError as e:
        print(f"spark-bookie: error: cannot reach ZooKeeper at {args.zk}: {e}", file=sys.stderr)
        return 2
    try:
        if args.cluster_command == "stop":
            return _cluster_stop(store, args.name, args.wait_s)
        return _cluster_status(store, args.name, args.json)
    except MetadataError as e:
        print(f"spark-bookie: error: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()


def _cluster_stop(store: MetadataStore, name: str, wait_s: float) -> int:
    driver = decode_status(store.cluster.get_app_data(app_key(name, "driver")))
    if not driver or driver.get("state") == STOPPED:
        print(f"spark-bookie: bookie cluster {name!r} is not running", file=sys.stderr)
        return 1
    request_stop(store, name, "spark-bookie cluster stop")
    print(f"stop requested for bookie cluster {name!r} ({driver.get('app_id')})", flush=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if decode_status(store.cluster.get_app_data(app_key(name, "driver"))).get("state") == STOPPED:
            print("stopped")
            return 0
        time.sleep(0.5)
    if wait_s > 0:
        print(f"spark-bookie: the driver did not report stopped within {wait_s:g} s", file=sys.stderr)
        return 1
    return 0


def _cluster_status(store: MetadataStore, name: str, as_json: bool) -> int:
    from ledger_client.stream.placement import namespaces_problems  # here: the CLI starts without grpc

    driver = decode_status(store.cluster.get_app_data(app_key(name, "driver")))
    wanted = int(driver.get("bookies", 0) or 0)
    h = cluster_health(store, name, wanted)
    last = decode_status(store.cluster.get_app_data(app_key(name, "health")))
    h["driver"] = driver
    h["driver_is_auditor"] = last.get("driver_is_auditor")
    h["resubmits"] = driver.get("resubmits", 0)
    for slot in h["slots"].values():
        slot["http_state"] = _bookie_http_state(slot)
    h["placement_problems"] = namespaces_problems(store)
    if as_json:
        print(json.dumps(h, indent=2, sort_keys=True))
        return 0 if driver else 1
    for ns, problems in h["placement_problems"].items():   # any cluster's, Spark-hosted or not
        print(f"placement: namespace {ns}: " + "; ".join(problems))
    if not driver:
        print(f"no bookie cluster {name!r} has run on this ZooKeeper root")
        return 1
    age = (h["time_ms"] - int(driver.get("heartbeat_ms", 0))) / 1000
    print(f"driver: {driver.get('state')} ({driver.get('app_id')} on {driver.get('host')}, pid "
          f"{driver.get('pid')}, last heartbeat {age:.0f} s ago)")
    for k, slot in h["slots"].items():
        http = slot["http_state"]
        seen = "" if http is None else (f"; http: {http['error']}" if "error" in http else
                                        f"; http: {'read-only' if http['readOnly'] else 'writable'}")
        print(f"slot {k}: {slot['state']} {slot['bookie_id']}" + (f" ({slot['error']})" if slot["error"] else "")
              + seen)
    print(f"health: {health_line(h)}")
    return 0


def _bookie_http_state(slot: dict[str, object]) -> dict[str, object] | None:
    """The bookie's own /api/v1/bookie/state when its slot serves HTTP (bookie_cluster.py
    --bookie-http-base-port): what the bookie says, beside what its slot wrote in ZooKeeper."""
    import urllib.request

    port, bookie_id = slot.get("http_port"), slot.get("bookie_id")
    if not port or not isinstance(bookie_id, str):
        return None
    url = f"http://{bookie_id.rpartition(':')[0]}:{port}/api/v1/bookie/state"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            state = json.loads(resp.read())
    except (OSError, ValueError) as e:
        return {"url": url, "error": f"unreachable ({e})"}
    if not isinstance(state, dict):
        return {"url": url, "error": "not a state object"}
    return {"url": url, **state}


def run_spark_sandbox(root: str, bookies: int, zk_port: int | None, wait: Callable[[], object],
                      secure: bool = False, sandbox_dir: SandboxDir | None = None,
                      resume: SandboxRecord | None = None) -> int:
    """`spark-bookie sandbox --spark`: ZooKeeper + this application on local-cluster[N,1,1024].
    With ``secure`` (`--secure`), the executors' bookies run with mTLS, tokens and zk_auth, and the
    client config that gets in is printed (spark_bookie/local/secure.py). With ``resume`` (a
    previous sandbox's record), ZooKeeper and the bookies come back on its ports, with its data
    and credentials; ``sandbox_dir`` gets the record of this one once it is up."""
    from spark_bookie.local.sandbox import SparkSandbox
    from spark_bookie.local.sandbox_dir import SPARK, SandboxRecord
    from spark_bookie.local.secure import load_secure_files, sandbox_secure_files

    files = None
    if secure:
        files = load_secure_files(root) if resume is not None else sandbox_secure_files(root)
    settings = files.bookie_settings() if files is not None else None
    with SparkSandbox(root, bookies, zk_port=resume.zk_port if resume else zk_port, bookie_settings=settings,
                      base_port=resume.bookie_ports[0] if resume and resume.bookie_ports else None,
                      zk_tls=files.zookeeper_tls() if files is not None else None) as sb:
        if sandbox_dir is not None:
            sandbox_dir.save(SandboxRecord(SPARK, files is not None, bookies, zk_port=sb.zk.port if sb.zk else 0,
                                           bookie_ports=[sb.base_port + k for k in range(bookies)], pids=sb.pids))
        print(f"sandbox up (Spark local-cluster[{bookies},1,1024]{', secure' if files else ''}): ZooKeeper at "
              f"{sb.connect_string}, bookies {', '.join(sb.bookie_ids)}; driver log {sb.driver_log}", flush=True)
        if files is not None:
            files.announce()
        print(f"export SPARK_BOOKIE_ZK={sb.connect_string}", flush=True)
        wait()   # says "press Ctrl-C to stop" once Ctrl-C is handled
        print("stopping the bookie cluster (graceful)...", flush=True)
    return 0
