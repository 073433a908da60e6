"""What a replication is (DESIGN §4.12): its clusters, streams and checkpoint, bound to the checkpoint
by ``DIR/replicate.json`` at the first start, so that a restart with another source, target or glob
on the same checkpoint is refused. No Spark here: ``replicate status`` reads it too.

A checkpoint directory holds ``replicate.json`` (this), ``spark/`` (the query's Spark checkpoint)
and ``status.json`` (jobs/replication_monitor.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.connect import TASK_TIMEOUTS, client_conf_path
from jobs.connect import connect as connect_cluster
from jobs.options import parse_stream_patterns
from ledger_client.errors import IncorrectParameterError

if TYPE_CHECKING:
    from ledger_client import LedgerClient

CONFIG_FILE = "replicate.json"
STATUS_FILE = "status.json"
SPARK_DIR = "spark"
IDENTITY = ("from_zk", "to_zk", "streams")   # what a checkpoint is bound to


@dataclass(frozen=True)
class ReplicationConfig:
    """One replication: what it copies and how its query runs. Validated at construction."""

    from_zk: str
    to_zk: str
    streams: str                                  # globs, comma-separated, as option streams
    checkpoint: str
    from_client_conf: str | None = None
    to_client_conf: str | None = None
    subscription: str = ""                        # set from the checkpoint when empty
    master: str = "local[2]"
    trigger_interval_ms: int = 500
    max_records_per_trigger: int = 1_000_000        # records are copied by span, never held in memory
    min_partitions: int = 2                       # tasks per micro-batch at least (the cores of local[2])
    monitor_interval_ms: int = 1_000
    metrics_port: int = 9_250                     # 0: any free port (printed); -1: no /metrics
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in ("from_zk", "to_zk", "streams", "checkpoint"):
            if not str(getattr(self, name) or "").strip():
                raise IncorrectParameterError(f"replicate needs --{name.replace('_zk', '').replace('_', '-')}")
        if self.from_zk == self.to_zk:
            raise IncorrectParameterError(f"--from and --to are one cluster ({self.from_zk}): a stream cannot be "
                                          "its own replica")
        parse_stream_patterns(self.streams)
        for name in ("trigger_interval_ms", "max_records_per_trigger", "min_partitions", "monitor_interval_ms"):
            if int(getattr(self, name)) < (0 if name == "trigger_interval_ms" else 1):
                raise IncorrectParameterError(f"{name} must be positive, not {getattr(self, name)}")
        if not -1 <= self.metrics_port <= 65_535:
            raise IncorrectParameterError(f"metrics port {self.metrics_port} is not a port")

    @property
    def dir(self) -> Path:
        return Path(self.checkpoint)

    def identity(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in IDENTITY}

    def source(self) -> LedgerClient:
        return connect_cluster(self.from_zk, self.from_client_conf, **TASK_TIMEOUTS)

    def target(self) -> LedgerClient:
        return connect_cluster(self.to_zk, self.to_client_conf, **TASK_TIMEOUTS)


def prepared(cfg: ReplicationConfig) -> ReplicationConfig:
    """The configuration bound to its checkpoint: paths absolute, the subscription named, and
    ``DIR/replicate.json`` written at the first start or checked against at a restart."""
    # A side without its own client TOML takes $SPARK_BOOKIE_CLIENT_CONF, as every job does; resolved
    # here, so that the query's tasks, the monitor and `replicate status` use the same one.
    cfg = dataclasses.replace(cfg, checkpoint=os.path.abspath(cfg.checkpoint),
                              from_client_conf=client_conf_path(cfg.from_client_conf),
                              to_client_conf=client_conf_path(cfg.to_client_conf))
    cfg.dir.mkdir(parents=True, exist_ok=True)
    saved = load_saved(cfg.dir)
    if saved is None:
        digest = hashlib.sha1(f"{cfg.to_zk}|{cfg.checkpoint}".encode()).hexdigest()[:12]
        cfg = dataclasses.replace(cfg, subscription=cfg.subscription or f"replicate-{digest}")
    else:
        differs = {k: (saved.get(k), v) for k, v in cfg.identity().items() if saved.get(k) != v}
        if differs:
            raise IncorrectParameterError(f"checkpoint {cfg.checkpoint} belongs to another replication: "
                                          + ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in differs.items()))
        cfg = dataclasses.replace(cfg, subscription=str(saved["subscription"]))
    record = {**cfg.identity(), "subscription": cfg.subscription,     # the client TOMLs: for replicate status
              "from_client_conf": cfg.from_client_conf, "to_client_conf": cfg.to_client_conf}
    tmp = cfg.dir / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, cfg.dir / CONFIG_FILE)
    return cfg


def saved_config(directory: str | Path, **overrides: Any) -> ReplicationConfig:
    """The replication whose checkpoint is ``directory``, as its last start recorded it (with
    ``overrides`` where not None); IncorrectParameterError when none ran there."""
    d = Path(directory).absolute()
    saved = load_saved(d)
    if saved is None:
        raise IncorrectParameterError(f"{d} is not a replication's checkpoint (no {CONFIG_FILE})")
    given = {k: v for k, v in overrides.items() if v is not None}
    return ReplicationConfig(**{**{k: saved.get(k) for k in (*IDENTITY, "subscription", "from_client_conf",
                                                                "to_client_conf")},
                                "checkpoint": str(d), **given})


def load_saved(directory: Path) -> dict[str, Any] | None:
    """What ``DIR/replicate.json`` says (None: no replication ran with this checkpoint yet)."""
    path = directory / CONFIG_FILE
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise IncorrectParameterError(f"{path}: unreadable ({e})") from e
    if not isinstance(saved, dict) or any(k not in saved for k in (*IDENTITY, "subscription")):
        raise IncorrectParameterError(f"{path}: not a replication's record")
    return saved
