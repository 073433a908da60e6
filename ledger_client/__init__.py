"""spark-bookie's ledger client (DESIGN §4.1): replicated, durable, append-only ledgers.

The public names are imported lazily (PEP 562): the bookie imports `ledger_client.protocol`
without pulling in the client, and a forking process (Spark's Python daemon) can import this
package before grpc is loaded.
"""

from __future__ import annotations

import importlib
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
    from .stream.aio import AsyncNamespace, AsyncStreamReader, AsyncStreamWriter
    from .stream.dlsn import DLSN, LogRecord
    from .stream.namespace import Namespace, SegmentInfo, StreamInfo
    from .stream.quota import NamespaceUsage
    from .stream.reader import StreamReader
    from .stream.settings import NamespaceSettings
    from .stream.tenants import TenantInfo
    from .stream.writer import StreamWriter
    from .write_handle import WriteHandle

from .protocol.grpc_setup import prepare_grpc

prepare_grpc()  # before anything of ours loads grpc (see there)

_EXPORTS = {
    "AsyncLedgerClient": ".async_client", "AsyncReadHandle": ".async_client",
    "AsyncWriteHandle": ".async_client", "ClientConfig": ".config", "DigestType": ".protocol.framing",
    "LedgerClient": ".client", "LedgerEntry": ".entry", "ReadHandle": ".read_handle",
    "WriteHandle": ".write_handle", "LedgerMetadata": "metadata", "LedgerState": "metadata",
    "DLSN": ".stream.dlsn", "LogRecord": ".stream.dlsn", "Namespace": ".stream.namespace",
    "NamespaceSettings": ".stream.settings", "StreamInfo": ".stream.namespace", "SegmentInfo": ".stream.namespace",
    "StreamReader": ".stream.reader", "StreamWriter": ".stream.writer", "AsyncNamespace": ".stream.aio",
    "AsyncStreamReader": ".stream.aio", "AsyncStreamWriter": ".stream.aio", "TenantInfo": ".stream.tenants",
    "NamespaceUsage": ".stream.quota", "SubscriptionInfo": ".stream.subscriptions",
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
