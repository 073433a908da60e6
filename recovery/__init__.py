"""Re-replication, the cluster side of recovery (BookKeeper's AutoRecovery).

When a bookie is lost, the **auditor** (one per cluster, elected through ZooKeeper) marks every
ledger that names it under-replicated; **replication workers** take those ledgers off the queue,
copy the affected fragments to other bookies and swap the bookie in the metadata by CAS.
**Decommission** moves every ledger off one bookie on demand. Distinct from ledger recovery on
open (``ledger_client.recovery``: fence, find the end, close), which the worker uses for open
ledgers whose writer is gone.

    from recovery import AutoRecovery, AutoRecoveryConfig
    ar = AutoRecovery("127.0.0.1:2181", AutoRecoveryConfig(), candidate_id="127.0.0.1:3181")
    ar.start(); ...; ar.stop()
"""

from __future__ import annotations

from ledger_client.protocol.grpc_setup import prepare_grpc

prepare_grpc()  # before anything here loads grpc (ledger_client/protocol/grpc_setup.py)


from . import errors
from .auditor import Auditor, AuditorStats, scan_ledgers
from .autorecovery import AutoRecovery
from .checker import FragmentChecker
from .config import AutoRecoveryConfig, load_autorecovery_config
from .copier import CopyStats, FragmentCopier
from .decommission import DrainProgress, delete_cookie, drain_bookie, is_registered
from .errors import (
    DecommissionError,
    FragmentUnrecoverableError,
    OpenFragmentError,
    RecoveryConfigError,
    RecoveryError,
    ReplicationError,
)
from .stream_maintenance import MaintenanceStats, StreamMaintenance, TierStep
from .tracker import LostBookieTracker
from .worker import ReplicationWorker, WorkerStats

__all__ = [
    "Auditor",
    "AuditorStats",
    "AutoRecovery",
    "AutoRecoveryConfig",
    "CopyStats",
    "DecommissionError",
    "DrainProgress",
    "FragmentChecker",
    "FragmentCopier",
    "FragmentUnrecoverableError",
    "LostBookieTracker",
    "MaintenanceStats",
    "OpenFragmentError",
    "RecoveryConfigError",
    "RecoveryError",
    "ReplicationError",
    "ReplicationWorker",
    "StreamMaintenance",
    "TierStep",
    "WorkerStats",
    "delete_cookie",
    "drain_bookie",
    "errors",
    "is_registered",
    "load_autorecovery_config",
    "scan_ledgers",
]
