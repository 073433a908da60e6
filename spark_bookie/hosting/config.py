"""The hosting application's configuration: what the driver needs besides the slots' own
(``HostingConfig``), its command-line arguments (stable: deploy/mesos renders them) and the
Spark settings a long-running service needs."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_bookie.errors import ConfigError
from spark_bookie.hosting.slots import DEFAULT_BASE_PORT, DEFAULT_LOCATION_TEMPLATE, DEFAULT_NAME, HostingConfig
from spark_bookie.server.config import read_toml_table


@dataclass(frozen=True)
class ClusterAppConfig:
    hosting: HostingConfig
    master: str | None = None  # None: what spark-submit / spark-defaults say, else local[N]
    app_name: str = "spark-bookie cluster"
    spark_conf: tuple[tuple[str, str], ...] = ()  # the script's --conf k=v (spark-submit's --conf works too)
    task_max_failures: int = 1_000
    resubmit_delay_ms: int = 5_000
    health_interval_ms: int = 10_000
    driver_heartbeat_ms: int = 2_000
    stop_timeout_ms: int = 60_000
    driver_stale_ms: int = 15_000  # another driver of this name counts as alive if it beat this recently
    http_port: int = 0  # the driver's /metrics and admin API (spark_bookie.http); 0 = off
    http_host: str = "127.0.0.1"


def spark_conf_pairs(cfg: ClusterAppConfig) -> dict[str, str]:
    """The Spark settings of the hosting application (user's ``--conf`` pairs are applied after)."""
    return {
        "spark.speculation": "false",
        "spark.dynamicAllocation.enabled": "false",
        "spark.task.maxFailures": str(cfg.task_max_failures),
        # Spark 4.1+: an idle-timeout kill would take a blocking service task down (FACTS.md).
        "spark.python.worker.killOnIdleTimeout": "false",
        "spark.python.worker.reuse": "true",
        "spark.python.use.daemon": "true",
        # A host that saw executor failures must stay eligible: its slot directories live there.
        "spark.excludeOnFailure.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def _read_toml_table(path: str | None, table: str) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(read_toml_table(path, table).items()))


def _read_rack_map(path: str | None, what: str = "rack map", value: str = "/location") -> tuple[tuple[str, str], ...]:
    """``host location`` per line (``#`` comments), or a JSON object host → location; the group
    map (``host group``) has the same form, with a group name (not starting with "/") as value."""
    if path is None:
        return ()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from e
    if text.lstrip().startswith("{"):
        try:
            return tuple(sorted((str(k), str(v)) for k, v in json.loads(text).items()))
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"{what} {path} is not a JSON object of host → {value.lstrip('/')}: {e}") from e
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or words[1].startswith("/") != value.startswith("/"):
            raise ConfigError(f"{what} {path}:{n}: want 'host {value}', got {line!r}")
        pairs.append((words[0], words[1]))
    return tuple(sorted(pairs))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The job's arguments (stable: deploy/mesos renders them)."""
    ap.add_argument("--zk", required=True, help="ZooKeeper connect string host:port[,...][/root]")
    ap.add_argument("--bookies", type=int, required=True, help="number of bookie slots (one per executor)")
    ap.add_argument("--data-root", default=os.environ.get("SPARK_BOOKIE_DATA_ROOT", "/var/lib/spark-bookie"),
                    help="persistent directory on every executor host; slot k lives in <data-root>/<name>/slot-<k>")
    ap.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, help="slot k's bookie listens on base+k")
    ap.add_argument("--name", default=DEFAULT_NAME, help="application name in ZooKeeper (one driver per name)")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[N])")
    ap.add_argument("--bookie-conf", default=None, help="TOML [bookie] settings for every bookie (read here)")
    ap.add_argument("--autorecovery-conf", default=None, help="TOML [autorecovery] settings (read here)")
    ap.add_argument("--no-autorecovery", dest="autorecovery", action="store_false",
                    help="run no auditor or replication workers")
    ap.add_argument("--network-location", default=DEFAULT_LOCATION_TEMPLATE,
                    help="bookie network location template ({host}, {slot}) for hosts not in --rack-map")
    ap.add_argument("--rack-map", default=None, help="file of 'host /location' lines (or a JSON object)")
    ap.add_argument("--bookie-group", default="", help="placement group template ({host}, {slot}) of the bookies "
                    "on hosts not in --bookie-group-map, e.g. gold; empty = no group (docs/operations.md)")
    ap.add_argument("--bookie-group-map", default=None, help="file of 'host group' lines (or a JSON object): "
                    "the placement group of each executor host's bookies")
    ap.add_argument("--heartbeat-interval-s", type=float, default=2.0, help="slot status and stop-check period")
    ap.add_argument("--health-interval-s", type=float, default=10.0, help="driver health log period")
    ap.add_argument("--zk-session-timeout-ms", type=int, default=10_000)
    ap.add_argument("--task-max-failures", type=int, default=1_000)
    ap.add_argument("--stop-timeout-s", type=float, default=60.0)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    ap.add_argument("--http-port", type=int, default=0, help="the driver's /metrics and admin API (0 = off)")
    ap.add_argument("--http-host", default="127.0.0.1", help="address the driver's admin API binds")
    ap.add_argument("--bookie-http-base-port", type=int, default=0,
                    help="slot k's bookie serves /metrics and the admin API on base+k (0 = off)")


def config_from_args(args: argparse.Namespace) -> ClusterAppConfig:
    confs = []
    for kv in args.conf:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise ConfigError(f"--conf wants KEY=VALUE, got {kv!r}")
        confs.append((k, v))
    hosting = HostingConfig(
        zk_connect=args.zk, bookies=args.bookies, data_root=os.path.abspath(args.data_root), name=args.name,
        base_port=args.base_port, network_location_template=args.network_location,
        rack_map=_read_rack_map(args.rack_map), bookie_group_template=args.bookie_group,
        group_map=_read_rack_map(args.bookie_group_map, "bookie group map", "group"),
        bookie_settings=_read_toml_table(args.bookie_conf, "bookie"),
        autorecovery=args.autorecovery,
        autorecovery_settings=_read_toml_table(args.autorecovery_conf, "autorecovery"),
        heartbeat_interval_ms=int(args.heartbeat_interval_s * 1000),
        zk_session_timeout_ms=args.zk_session_timeout_ms, http_base_port=args.bookie_http_base_port).validate()
    _check_bookie_settings(hosting)
    return ClusterAppConfig(hosting=hosting, master=args.master, spark_conf=tuple(confs),
                            task_max_failures=args.task_max_failures,
                            health_interval_ms=int(args.health_interval_s * 1000),
                            stop_timeout_ms=int(args.stop_timeout_s * 1000),
                            http_port=_http_port(args.http_port), http_host=args.http_host)


def _http_port(port: int) -> int:
    if not 0 <= port < 65536:
        raise ConfigError(f"--http-port {port} is not 0 (off) or in 1..65535")
    return port


def _check_bookie_settings(hosting: HostingConfig) -> None:
    """Validate the bookie and autorecovery settings here, once, rather than in every task."""
    from spark_bookie.server.config import load_config

    load_config(None, **{**dict(hosting.bookie_settings), "journal_dirs": ["/j"], "ledger_dirs": ["/l"]})
    if hosting.autorecovery:
        try:
            from recovery import AutoRecovery, AutoRecoveryConfig  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"autorecovery is on but recovery.AutoRecovery is unavailable ({e}); "
                              "pass --no-autorecovery to run without re-replication") from e
        try:
            AutoRecoveryConfig(**dict(hosting.autorecovery_settings))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"bad autorecovery settings: {e}") from e


