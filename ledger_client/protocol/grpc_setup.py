"""The one process-wide setting gRPC needs from this project, made by an explicit call.

gRPC's C core installs fork handlers that, while another thread is inside gRPC, can abort a
forked child before it execs (absl "Mutex::Fer with pending CondVar"): subprocess.Popen with
preexec_fn, e.g. PySpark launching its JVM, then fails ~7% of the time in a process with live
bookie streams (tests/integration/test_fork_safety.py). Python's gRPC already refuses to be used
across fork, so the handlers buy nothing here. The core reads GRPC_ENABLE_FORK_SUPPORT once,
when grpc is first imported, so the call must come before that: each of the project's packages
that can load grpc (ledger_client, spark_bookie, recovery, jobs) makes it first thing in its
``__init__``, which every import of theirs runs before any of their modules. An explicit setting
by the user wins.
"""

from __future__ import annotations

import os

FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"


def prepare_grpc() -> None:
    """Turn gRPC's fork handlers off unless the user chose otherwise (idempotent)."""
    os.environ.setdefault(FORK_SUPPORT, "0")
