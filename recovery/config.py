"""Autorecovery configuration: one frozen dataclass, units in the names, validated at construction.

Every key is documented in ``conf/autorecovery.toml``. Values come from (lowest to highest
precedence) the defaults below, a TOML file (its ``[autorecovery]`` table, or the top level), and
explicit overrides. The lost-bookie delay is deliberately *not* a plain setting: it is cluster-wide
state in ZooKeeper, changeable at run time (``spark-bookie shell lostbookierecoverydelay``); the
key here only pins it for one process (tests, or a cluster that wants it fixed).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import RecoveryConfigError


@dataclass(frozen=True)
class AutoRecoveryConfig:
    # ---- ZooKeeper session (the auditor's vote and the workers' ledger locks are ephemerals of it)
    zk_session_timeout_ms: int = 10_000
    zk_connect_timeout_ms: int = 15_000
    # ---- auditor
    lost_bookie_recovery_delay_s: int | None = None   # None: the value stored in ZooKeeper
    audit_interval_ms: int = 900_000                  # periodic bookie check (index rebuilt, lost bookies marked)
    check_all_ledgers_interval_ms: int = 86_400_000   # periodic readability check of every fragment; 0 = off
    check_entry_sample_fraction: float = 0.0          # besides first and last, this fraction of a bookie's entries
    replicas_check_interval_ms: int = 86_400_000      # periodic check that bookies hold every entry of theirs; 0 = off
    placement_check_interval_ms: int = 86_400_000     # periodic placement-policy check; 0 = off
    placement_min_locations_per_write_quorum: int = 2  # a write set must span this many network locations
    metadata_reads_in_flight_max: int = 256           # ledger-metadata reads pipelined in one batch while scanning
    scan_cache_ledgers_max: int = 1_000_000           # ledgers whose decoded metadata the auditor keeps between scans
    # ---- replication worker
    worker_ledgers_in_flight_max: int = 4             # ledgers one worker re-replicates at once
    acquire_poll_ms: int = 1_000                      # how long one wait for a queued ledger lasts
    open_ledger_rereplication_grace_ms: int = 30_000  # an open ledger's writer gets this long before fencing
    worker_backoff_ms: int = 1_000                    # first backoff of a ledger whose repair failed
    worker_backoff_max_ms: int = 60_000               # backoff doubles per failure up to this
    copy_bytes_in_flight_max: int = 64 * 1024 * 1024  # entry bytes read but not yet acknowledged by targets
    copy_reads_in_flight_max: int = 64                # read RPCs outstanding per fragment copy
    copy_range_entries_max: int = 512                 # entries per range read (E == Qw fragments)
    copy_range_bytes_max: int = 4 * 1024 * 1024       # bytes per range read (the bookie caps it too)
    copy_add_burst_bytes_max: int = 4 * 1024 * 1024   # verified bytes gathered before a target's adds are sent
    copy_stall_timeout_ms: int = 60_000               # a copy with no progress this long fails
    bookie_timeout_ms: int = 10_000                   # deadline of one read RPC; add timeout of recovery writes
    recovery_operation_timeout_ms: int = 120_000      # fencing and closing an open ledger gives up after this
    # ---- streams (run by the auditor: one process per cluster)
    stream_maintenance_interval_ms: int = 60_000      # retention (and tiering) of every stream; 0 = off

    def __post_init__(self) -> None:
        problems: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                problems.append(f"{f.name} must be a number, got {v!r}")
            elif v < 0:
                problems.append(f"{f.name} must not be negative, got {v}")
        if not problems:
            if not 0.0 <= self.check_entry_sample_fraction <= 1.0:
                problems.append("check_entry_sample_fraction must be in [0, 1]")
            for name in ("worker_ledgers_in_flight_max", "copy_reads_in_flight_max", "copy_range_entries_max",
                         "metadata_reads_in_flight_max", "acquire_poll_ms", "copy_stall_timeout_ms",
                         "bookie_timeout_ms", "audit_interval_ms", "copy_add_burst_bytes_max"):
                if getattr(self, name) < 1:
                    problems.append(f"{name} must be at least 1")
            if self.copy_bytes_in_flight_max < self.copy_range_bytes_max:
                problems.append("copy_bytes_in_flight_max must be at least copy_range_bytes_max")
            if self.worker_backoff_max_ms < self.worker_backoff_ms:
                problems.append("worker_backoff_max_ms must be at least worker_backoff_ms")
        if problems:
            raise RecoveryConfigError("invalid autorecovery configuration: " + "; ".join(problems))


def load_autorecovery_config(path: str | Path | None = None, **overrides: Any) -> AutoRecoveryConfig:
    """Defaults < TOML file (``[autorecovery]`` table or top level) < overrides (None ignored)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError as e:
            raise RecoveryConfigError(f"autorecovery configuration file {path} does not exist") from e
        except tomllib.TOMLDecodeError as e:
            raise RecoveryConfigError(f"autorecovery configuration file {path} is not valid TOML: {e}") from e
        section = data.get("autorecovery", data)
        if not isinstance(section, dict):
            raise RecoveryConfigError(f"{path}: [autorecovery] must be a table")
        values.update(section)
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(AutoRecoveryConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise RecoveryConfigError(f"unknown autorecovery configuration keys: {unknown}")
    return AutoRecoveryConfig(**values)
