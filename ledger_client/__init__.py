"""spark-bookie's ledger client (DESIGN §4.1): replicated, durable, append-only ledgers.

The public names are imported lazily (PEP 562): the bookie imports `ledger_client.protocol`
without pulling in the client, and a forking process (Spark's Python daemon) can import this
package before grpc is loaded.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metadata import LedgerMetadata, LedgerState

    from . import errors
    from .async_client import AsyncLedgerClient, AsyncReadHandle, AsyncWriteHandle
    from .client import LedgerClient
    from .config import ClientConfig
    from .entry import LedgerEntry
    from .protocol.framing import DigestType
    from .read_handle import ReadHandle
    from .write_handle import WriteHandle

# gRPC's C core installs fork handlers that, while another thread is inside gRPC, can abort a
# forked child before it execs (absl "Mutex::Fer with pending CondVar"): subprocess.Popen with
# preexec_fn, e.g. PySpark launching its JVM, then fails ~7% of the time in a process with live
# bookie streams. Python's gRPC already refuses to be used across fork, so the handlers buy
# nothing here. The core reads this once, when grpc is first imported: every package of the
# project that uses grpc imports this one first. An explicit setting by the user wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

_EXPORTS = {
    "AsyncLedgerClient": ".async_client", "AsyncReadHandle": ".async_client",
    "AsyncWriteHandle": ".async_client", "ClientConfig": ".config", "DigestType": ".protocol.framing",
    "LedgerClient": ".client", "LedgerEntry": ".entry", "ReadHandle": ".read_handle",
    "WriteHandle": ".write_handle", "LedgerMetadata": "metadata", "LedgerState": "metadata",
}

__all__ = sorted([*_EXPORTS, "errors"])


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module(".errors", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod = importlib.import_module(module, __name__ if module.startswith(".") else None)
    return getattr(mod, name)
