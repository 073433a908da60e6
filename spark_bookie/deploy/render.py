"""`spark-bookie deploy render`: DC/OS-style options -> the Marathon group that runs a bookie cluster.

Spark 4 has no Mesos scheduler, so on DC/OS / Marathon the cluster is Spark's *standalone* master and
workers run as Marathon apps, plus one driver app that submits `jobs/bookie_cluster.py` (DESIGN §3,
§4.4). One Spark worker per agent (UNIQUE hostname) hosts one executor, which hosts one bookie whose
journal and ledger directories live under the worker's Marathon local persistent volume.

The options follow the BookKeeper DC/OS package (mesosphere/universe `repo/packages/B/bookkeeper`):
`name`, `cpus`, `instances`, `mem`, `volume_size`, `zk_client`, `service_port`, in a `bookie`
section, plus a `spark` section. `OPTIONS_SCHEMA` below is the package's `config.json` (a unit test
keeps `deploy/mesos/config.json` equal to it), and `deploy/mesos/marathon.json.mustache` renders to
exactly what `render_group` returns (another test). Keep all three in step.

Everything here is pure (options in, dicts out) except `run_render`, the CLI entry.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_bookie.errors import ConfigError

# ---------------------------------------------------------------------- fixed names

VOLUME_NAME = "bookie-data"        # the persistent volume's relative containerPath (Marathon requires one level)
MESOS_DNS_SUFFIX = "marathon.mesos"
MASTER_APP = "spark-master"
WORKERS_APP = "spark-workers"
DRIVER_APP = "bookie-cluster-driver"
LEDGERS_ZNODE = "ledgers"          # the bookie cluster's ZooKeeper root is /<name>/ledgers
SPARK_RECOVERY_ZNODE = "spark-master"   # Spark master's ZOOKEEPER recovery state: /<name>/spark-master

# Memory a JVM needs beyond its heap (metaspace, threads, direct buffers), and Spark's default
# executor overhead (max(384 MiB, 10% of the heap); it also covers the executor's Python workers,
# i.e. the bookie process). Used to refuse task sizes that the OOM killer would end.
JVM_NON_HEAP_MB = 256
EXECUTOR_OVERHEAD_MIN_MB = 384
DRIVER_PYTHON_MB = 256             # the driver's Python process (auditor, placement, kazoo)
DRIVER_STOP_GRACE_S = 90           # > the hosting job's default --stop-timeout-s (60)

_NAME_PATTERN = "^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"
_HOSTS_PATTERN = "^[A-Za-z0-9.-]+:[0-9]{1,5}(,[A-Za-z0-9.-]+:[0-9]{1,5})*$"
_PATH_PATTERN = "^(/[A-Za-z0-9._-]+)+$"
_IMAGE_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"


def _port(default: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1025, "maximum": 65535, "default": default, "description": description}


def _section(description: str, properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"description": description, "type": "object", "additionalProperties": False,
            "properties": properties}


OPTIONS_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "bookie": _section("The bookie cluster: one Spark worker, executor and bookie per instance "
                           "(the options of the BookKeeper DC/OS package).", {
            "name": {"type": "string", "pattern": _NAME_PATTERN, "default": "spark-bookie",
                     "description": "Name of this DC/OS service: the Marathon group /NAME, the Mesos-DNS names "
                                    "and the ZooKeeper root /NAME (ledgers under /NAME/ledgers)."},
            "cpus": {"type": "number", "minimum": 0.5, "default": 2,
                     "description": "CPU shares for each worker task (Spark worker + executor + bookie)."},
            "instances": {"type": "integer", "minimum": 1, "default": 3,
                          "description": "Number of workers, hence bookies; one per agent. Use at least the "
                                         "largest ensemble size your ledgers need (3 for E3/Qw3/Qa2)."},
            "mem": {"type": "number", "minimum": 1024, "default": 4096,
                    "description": "Memory (MiB) for each worker task: worker daemon + executor heap + "
                                   "executor overhead (which holds the bookie's Python process)."},
            "volume_size": {"type": "integer", "minimum": 1024, "default": 20000,
                            "description": "Size (MiB) of each worker's local persistent volume (bookie journal, "
                                           "entry logs and index), mounted at data_root."},
            "zk_client": {"type": "string", "pattern": _HOSTS_PATTERN, "default": "master.mesos:2181",
                          "description": "ZooKeeper servers host:port[,host:port] (no chroot: the service uses "
                                         "/NAME). master.mesos:2181 is DC/OS's own ensemble."},
            "service_port": _port(3181, "Base of the bookies' gRPC ports (BookKeeper's 3181): the bookie of "
                                        "slot k listens on service_port+k on whichever worker agent hosts it, "
                                        "so keep service_port..service_port+instances-1 free on those agents."),
            "data_root": {"type": "string", "pattern": _PATH_PATTERN, "default": "/var/lib/spark-bookie",
                          "description": "Absolute path inside the worker container where the persistent "
                                         "volume is mounted; passed to the job as --data-root."},
        }),
        "spark": _section("Spark standalone master, workers and the driver that hosts the bookies.", {
            "docker_image": {"type": "string", "pattern": _IMAGE_PATTERN, "default": "spark-bookie:0.1.0",
                             "description": "Image with Java 17, Python 3.11 and spark-bookie installed "
                                            "(deploy/mesos/Dockerfile); used by every app."},
            "master_cpus": {"type": "number", "minimum": 0.1, "default": 0.5,
                            "description": "CPU shares for the Spark master."},
            "master_mem": {"type": "number", "minimum": 512, "default": 1024,
                           "description": "Memory (MiB) for the Spark master task."},
            "master_port": _port(7077, "Spark master RPC port (fixed: workers and the driver find the master "
                                       "as spark-master-NAME.marathon.mesos:master_port)."),
            "master_webui_port": _port(8080, "Spark master web UI port."),
            "worker_port": _port(7078, "Spark worker RPC port on every worker agent."),
            "worker_webui_port": _port(8081, "Spark worker web UI port on every worker agent."),
            "block_manager_port": _port(7079, "Executor block-manager port on every worker agent (fixed so "
                                              "Marathon reserves it)."),
            "daemon_memory_mb": {"type": "integer", "minimum": 256, "default": 512,
                                 "description": "Heap (MiB) of the master and worker JVMs (SPARK_DAEMON_MEMORY)."},
            "executor_cores": {"type": "integer", "minimum": 1, "default": 1,
                               "description": "Cores each worker offers = cores of its one executor."},
            "executor_memory_mb": {"type": "integer", "minimum": 512, "default": 2048,
                                   "description": "Executor heap (MiB); the worker offers exactly this, so it "
                                                  "runs one executor."},
            "driver_cpus": {"type": "number", "minimum": 0.5, "default": 1,
                            "description": "CPU shares for the driver (auditor and placement run there)."},
            "driver_mem": {"type": "number", "minimum": 1024, "default": 2048,
                           "description": "Memory (MiB) for the driver task."},
            "driver_memory_mb": {"type": "integer", "minimum": 512, "default": 1024,
                                 "description": "Driver JVM heap (MiB), spark.driver.memory."},
            "task_max_failures": {"type": "integer", "minimum": 1, "default": 1000,
                                  "description": "spark.task.maxFailures: how often a bookie's task may fail "
                                                 "(executor lost) before the driver resubmits the hosting job."},
        }),
    },
}

_SECTIONS = ("bookie", "spark")


# ---------------------------------------------------------------------- options

def default_options() -> dict[str, dict[str, Any]]:
    """Every option at its schema default (what `dcos package install` uses with no --options)."""
    return {sec: {k: copy.deepcopy(p["default"]) for k, p in OPTIONS_SCHEMA["properties"][sec]["properties"].items()}
            for sec in _SECTIONS}


def _format_schema_error(err: Any) -> str:
    where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    if err.validator == "additionalProperties":
        section = list(err.absolute_path)
        props = OPTIONS_SCHEMA if not section else OPTIONS_SCHEMA["properties"].get(str(section[0]), {})
        known = sorted(props.get("properties", {}))
        unknown = sorted(set(err.instance) - set(known)) if isinstance(err.instance, dict) else []
        return f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
    return f"{where}: {err.message}"


def validate_options(options: Mapping[str, Any]) -> None:
    """Check user options against `OPTIONS_SCHEMA`; ConfigError lists every problem, one per line."""
    try:
        import jsonschema
    except ImportError as e:  # a runtime-only install without the test extra
        raise ConfigError("validating deploy options needs the 'jsonschema' package (pip install jsonschema)") from e
    validator = jsonschema.Draft4Validator(OPTIONS_SCHEMA)
    errors = sorted(validator.iter_errors(options), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("invalid deploy options:\n  " + "\n  ".join(_format_schema_error(e) for e in errors))


def resolve_options(options: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Validate `options` (DC/OS style, sections may be partial) and fill in the defaults.

    Beyond the schema, refuses combinations Marathon or the kernel would reject later, at a worse
    time: task memory below what its JVMs and the bookie need, and fixed ports that collide.
    """
    given = dict(options or {})
    validate_options(given)
    merged = default_options()
    for sec in _SECTIONS:
        merged[sec].update(copy.deepcopy(given.get(sec, {})))
    _check_sizes(merged)
    _check_ports(merged)
    return merged


def executor_overhead_mb(executor_memory_mb: int) -> int:
    """Spark's default executor memory overhead: max(384 MiB, 10% of the heap)."""
    return max(EXECUTOR_OVERHEAD_MIN_MB, executor_memory_mb // 10)


def _check_sizes(o: Mapping[str, Mapping[str, Any]]) -> None:
    b, s = o["bookie"], o["spark"]
    problems = []
    worker_need = (s["daemon_memory_mb"] + JVM_NON_HEAP_MB + s["executor_memory_mb"]
                   + executor_overhead_mb(s["executor_memory_mb"]))
    if b["mem"] < worker_need:
        problems.append(
            f"bookie.mem: {b['mem']} MiB cannot hold the worker daemon ({s['daemon_memory_mb']} + "
            f"{JVM_NON_HEAP_MB} non-heap) and the executor ({s['executor_memory_mb']} heap + "
            f"{executor_overhead_mb(s['executor_memory_mb'])} overhead) = {worker_need} MiB; raise bookie.mem "
            f"or lower spark.executor_memory_mb")
    master_need = s["daemon_memory_mb"] + JVM_NON_HEAP_MB
    if s["master_mem"] < master_need:
        problems.append(f"spark.master_mem: {s['master_mem']} MiB is below the master JVM's "
                        f"{s['daemon_memory_mb']} heap + {JVM_NON_HEAP_MB} non-heap = {master_need} MiB")
    driver_need = s["driver_memory_mb"] + JVM_NON_HEAP_MB + DRIVER_PYTHON_MB
    if s["driver_mem"] < driver_need:
        problems.append(f"spark.driver_mem: {s['driver_mem']} MiB is below the driver JVM's "
                        f"{s['driver_memory_mb']} heap + {JVM_NON_HEAP_MB} non-heap + {DRIVER_PYTHON_MB} "
                        f"Python = {driver_need} MiB")
    if problems:
        raise ConfigError("invalid deploy options:\n  " + "\n  ".join(problems))


def _check_ports(o: Mapping[str, Mapping[str, Any]]) -> None:
    """Fixed ports all distinct and outside the bookies' range, so the master may share an agent
    with a worker and no Spark daemon takes a port a bookie slot will want."""
    b, s = o["bookie"], o["spark"]
    first, last = b["service_port"], b["service_port"] + b["instances"] - 1
    problems = []
    if last > 65535:
        problems.append(f"bookie.service_port: the bookies need ports {first}..{last}, past 65535")
    named = {f"spark.{k}": s[k] for k in
             ("master_port", "master_webui_port", "worker_port", "worker_webui_port", "block_manager_port")}
    by_port: dict[int, list[str]] = {}
    for key, port in named.items():
        by_port.setdefault(port, []).append(key)
        if first <= port <= last:
            problems.append(f"{key} {port} is inside the bookies' ports {first}..{last} "
                            f"(bookie.service_port .. + bookie.instances - 1)")
    problems += [f"port {p} is used by {' and '.join(keys)}" for p, keys in sorted(by_port.items()) if len(keys) > 1]
    if problems:
        raise ConfigError("invalid deploy options (ports):\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------- derived names

def master_host(name: str) -> str:
    """Mesos-DNS name of the master task of app /NAME/spark-master."""
    return f"{MASTER_APP}-{name}.{MESOS_DNS_SUFFIX}"


def bookie_zk(o: Mapping[str, Mapping[str, Any]]) -> str:
    """The bookie cluster's connect string (`--zk` of every spark-bookie command)."""
    return f"{o['bookie']['zk_client']}/{o['bookie']['name']}/{LEDGERS_ZNODE}"


def master_url(o: Mapping[str, Mapping[str, Any]]) -> str:
    return f"spark://{master_host(o['bookie']['name'])}:{o['spark']['master_port']}"


# ---------------------------------------------------------------------- Marathon apps

def _container(o: Mapping[str, Mapping[str, Any]], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"type": "DOCKER", "docker": {"image": o["spark"]["docker_image"], "forcePullImage": False}}
    if volumes is not None:
        c["volumes"] = volumes
    return c


def _common_env(o: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    # SPARK_BOOKIE_ZK lets `dcos task exec TASK spark-bookie shell ...` find the cluster without --zk.
    return {"SPARK_BOOKIE_ZK": bookie_zk(o), "PYSPARK_PYTHON": "python3"}


def _mesos_http_check(port_index: int, grace_s: int, max_failures: int, path: str = "/") -> dict[str, Any]:
    return {"protocol": "MESOS_HTTP", "portIndex": port_index, "path": path, "gracePeriodSeconds": grace_s,
            "intervalSeconds": 30, "timeoutSeconds": 10, "maxConsecutiveFailures": max_failures}


def _ports(*named: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"name": n, "port": p, "protocol": "tcp"} for n, p in named]


def master_app(o: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The Spark standalone master; ZOOKEEPER recovery so a relaunched master keeps workers and the app."""
    b, s = o["bookie"], o["spark"]
    recovery = (f"-Dspark.deploy.recoveryMode=ZOOKEEPER -Dspark.deploy.zookeeper.url={b['zk_client']} "
                f"-Dspark.deploy.zookeeper.dir=/{b['name']}/{SPARK_RECOVERY_ZNODE}")
    return {
        "id": f"/{b['name']}/{MASTER_APP}",
        "cmd": (f"exec spark-class org.apache.spark.deploy.master.Master --host $HOST "
                f"--port {s['master_port']} --webui-port {s['master_webui_port']}"),
        "cpus": s["master_cpus"],
        "mem": s["master_mem"],
        "instances": 1,
        "container": _container(o),
        "networks": [{"mode": "host"}],
        "portDefinitions": _ports(("master", s["master_port"]), ("webui", s["master_webui_port"])),
        "requirePorts": True,
        "env": {**_common_env(o), "SPARK_DAEMON_MEMORY": f"{s['daemon_memory_mb']}m",
                "SPARK_MASTER_OPTS": recovery},
        "healthChecks": [_mesos_http_check(1, 120, 3)],
        # One master with fixed ports: stop the old task before starting the new one.
        "upgradeStrategy": {"minimumHealthCapacity": 0, "maximumOverCapacity": 0},
    }


def workers_app(o: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`instances` resident Spark workers, one per agent, each with a persistent volume at data_root.

    The volume pair is Marathon's documented way to mount a local persistent volume (whose
    containerPath must be one relative name) at an absolute path. Resident apps need
    maximumOverCapacity 0 and unreachableStrategy disabled; minimumHealthCapacity 0.5 restarts at
    most half the workers at once during an upgrade. Executors inherit the worker's environment,
    so SPARK_BOOKIE_ADVERTISED_HOST=$HOST makes every bookie id AGENT_HOST:port, the address
    Mesos knows the agent by. The bookies' own ports (service_port + slot) are not in
    portDefinitions: which slot lands on which worker is the hosting job's choice, not fixed here.
    """
    b, s = o["bookie"], o["spark"]
    return {
        "id": f"/{b['name']}/{WORKERS_APP}",
        "cmd": (f"export SPARK_BOOKIE_ADVERTISED_HOST=$HOST && "
                f"exec spark-class org.apache.spark.deploy.worker.Worker --host $HOST "
                f"--port {s['worker_port']} --webui-port {s['worker_webui_port']} "
                f"--cores {s['executor_cores']} --memory {s['executor_memory_mb']}M "
                f"--work-dir $MESOS_SANDBOX/spark-work {master_url(o)}"),
        "cpus": b["cpus"],
        "mem": b["mem"],
        "instances": b["instances"],
        "constraints": [["hostname", "UNIQUE"]],
        "container": _container(o, [
            {"containerPath": b["data_root"], "hostPath": VOLUME_NAME, "mode": "RW"},
            {"containerPath": VOLUME_NAME, "mode": "RW", "persistent": {"type": "root", "size": b["volume_size"]}},
        ]),
        "networks": [{"mode": "host"}],
        "portDefinitions": _ports(("worker", s["worker_port"]), ("webui", s["worker_webui_port"]),
                                  ("blockmanager", s["block_manager_port"])),
        "requirePorts": True,
        "env": {**_common_env(o), "SPARK_DAEMON_MEMORY": f"{s['daemon_memory_mb']}m"},
        "healthChecks": [_mesos_http_check(1, 300, 3)],
        "residency": {"taskLostBehavior": "WAIT_FOREVER"},
        "unreachableStrategy": "disabled",
        "upgradeStrategy": {"minimumHealthCapacity": 0.5, "maximumOverCapacity": 0},
        "killSelection": "YOUNGEST_FIRST",
        "taskKillGracePeriodSeconds": 30,
        "dependencies": [f"/{b['name']}/{MASTER_APP}"],
    }


def driver_command(o: Mapping[str, Mapping[str, Any]]) -> str:
    """`spark-bookie init` (idempotent), then the hosting job's driver in client mode.

    The driver runs as `python3 -m jobs.bookie_cluster` (what spark-submit does for a Python app in
    client mode, with pyspark launching the JVM) so that Marathon's SIGTERM reaches the Python
    driver itself, which then stops every bookie gracefully; under spark-submit the JVM would get
    it and the bookies would die as if crashed. Its three ports are Marathon-assigned ($PORT0..2)
    and told to Spark, so executors on other agents reach it; executors use the fixed, reserved
    block-manager port. The job sets speculation, dynamic allocation and maxFailures itself. A
    fourth ($PORT3) serves the driver's /metrics and admin API on 127.0.0.1, where Mesos' HTTP
    health checks connect: /api/v1/bookie/is_ready answers 200 while the hosting job runs.
    """
    b, s = o["bookie"], o["spark"]
    zk = bookie_zk(o)
    confs = [
        "spark.driver.host=$HOST", "spark.driver.port=$PORT0", "spark.driver.blockManager.port=$PORT1",
        "spark.ui.port=$PORT2", f"spark.driver.memory={s['driver_memory_mb']}m",
        f"spark.blockManager.port={s['block_manager_port']}",
        f"spark.executor.cores={s['executor_cores']}", f"spark.executor.memory={s['executor_memory_mb']}m",
        "spark.pyspark.python=python3",
    ]
    return (f"spark-bookie init --zk {zk} && exec python3 -m jobs.bookie_cluster --master {master_url(o)} "
            f"--zk {zk} --bookies {b['instances']} --data-root {b['data_root']} --name {b['name']} "
            f"--base-port {b['service_port']} --task-max-failures {s['task_max_failures']} "
            "--http-port $PORT3 "
            + " ".join(f"--conf {c}" for c in confs))


def driver_app(o: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    b, s = o["bookie"], o["spark"]
    return {
        "id": f"/{b['name']}/{DRIVER_APP}",
        "cmd": driver_command(o),
        "cpus": s["driver_cpus"],
        "mem": s["driver_mem"],
        "instances": 1,
        "container": _container(o),
        "networks": [{"mode": "host"}],
        "portDefinitions": _ports(("driver", 0), ("blockmanager", 0), ("ui", 0), ("admin", 0)),
        "requirePorts": False,
        "env": _common_env(o),
        "healthChecks": [_mesos_http_check(3, 300, 3, "/api/v1/bookie/is_ready")],
        # Two drivers would run two competing applications: stop the old one first.
        "upgradeStrategy": {"minimumHealthCapacity": 0, "maximumOverCapacity": 0},
        # The driver's graceful stop (every slot stops its bookie, then Spark) takes up to the
        # job's --stop-timeout-s (60 s by default) before Marathon's SIGKILL.
        "taskKillGracePeriodSeconds": DRIVER_STOP_GRACE_S,
        "dependencies": [f"/{b['name']}/{WORKERS_APP}"],
    }


def render_group(options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Marathon group /NAME (for `POST /v2/groups`) from DC/OS-style options (validated first)."""
    o = resolve_options(options)
    return {"id": f"/{o['bookie']['name']}", "apps": [master_app(o), workers_app(o), driver_app(o)]}


def render_json(options: Mapping[str, Any] | None = None) -> str:
    return json.dumps(render_group(options), indent=2) + "\n"


# ---------------------------------------------------------------------- CLI

def load_options_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read options file {path}: {e.strerror or e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"options file {path} is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"options file {path} must hold a JSON object, got {type(data).__name__}")
    return data


def add_deploy_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="deploy_command", required=True)
    r = sub.add_parser("render", help="write the Marathon group JSON for DC/OS-style options (POST /v2/groups)")
    r.add_argument("--options", default=None,
                   help="options JSON like deploy/mesos/bk-config.json (default: every option at its default)")
    r.add_argument("--out", default=None, help="write here instead of stdout")


def run_render(args: argparse.Namespace) -> int:
    """Render, or print one line per problem and exit 2; never a traceback for bad options."""
    try:
        options = load_options_file(args.options) if args.options else {}
        text = render_json(options)
    except ConfigError as e:
        print(f"spark-bookie: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as e:
            print(f"spark-bookie: error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0
