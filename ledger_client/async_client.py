"""AsyncLedgerClient: the same surface as LedgerClient with `async` methods.

The protocol runs in the synchronous client's threads (gRPC callbacks, ensemble changes); the
asyncio layer only bridges: blocking calls go to a thread, append futures are wrapped, so an
event loop is never blocked by a quorum wait.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from metadata import LedgerMetadata

from .client import LedgerClient
from .config import ClientConfig
from .entry import LedgerEntry
from .protocol.framing import DigestType
from .read_handle import ReadHandle
from .stream.aio import AsyncNamespace
from .stream.tenants import TenantInfo
from .write_handle import WriteHandle

if TYPE_CHECKING:
    import pyarrow as pa


class AsyncWriteHandle:
    def __init__(self, handle: WriteHandle) -> None:
        self.sync = handle

    ledger_id = property(lambda self: self.sync.ledger_id)
    last_add_confirmed = property(lambda self: self.sync.last_add_confirmed)
    length = property(lambda self: self.sync.length)
    metadata = property(lambda self: self.sync.metadata)

    async def append(self, data: bytes) -> int:
        return await asyncio.wrap_future(self.sync.append_async(data))

    def append_async(self, data: bytes) -> asyncio.Future[int]:
        return asyncio.wrap_future(self.sync.append_async(data))

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncWriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReadHandle:
    def __init__(self, handle: ReadHandle) -> None:
        self.sync = handle

    ledger_id = property(lambda self: self.sync.ledger_id)
    last_add_confirmed = property(lambda self: self.sync.last_add_confirmed)
    is_closed = property(lambda self: self.sync.is_closed)
    length = property(lambda self: self.sync.length)
    metadata = property(lambda self: self.sync.metadata)

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        return await asyncio.to_thread(self.sync.read, first, last)

    async def read_arrow(self, first: int, last: int) -> pa.RecordBatch:
        return await asyncio.to_thread(self.sync.read_arrow, first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        return await asyncio.to_thread(self.sync.read_unconfirmed, first, last)

    async def read_last_add_confirmed(self) -> int:
        return await asyncio.to_thread(self.sync.read_last_add_confirmed)

    async def try_read_last_add_confirmed(self) -> int:
        return await asyncio.to_thread(self.sync.try_read_last_add_confirmed)

    async def read_last_add_confirmed_and_entry(self, entry_id: int,
                                                timeout_ms: int) -> tuple[int, LedgerEntry | None]:
        return await asyncio.to_thread(self.sync.read_last_add_confirmed_and_entry, entry_id, timeout_ms)

    async def tail(self, start_entry_id: int = 0, timeout_ms: int | None = None) -> AsyncIterator[LedgerEntry]:
        it = self.sync.tail(start_entry_id, timeout_ms)
        done = object()
        while True:
            entry = await asyncio.to_thread(next, it, done)
            if entry is done:
                return
            if isinstance(entry, LedgerEntry):
                yield entry


class AsyncLedgerClient:
    """Construct inside or outside a running loop; close with `await client.close()`."""

    def __init__(self, zk: str = "127.0.0.1:2181", *, config: ClientConfig | None = None,
                 **kwargs: Any) -> None:
        self.sync = LedgerClient(zk, config=config, **kwargs)

    async def create_ledger(self, ensemble_size: int = 3, write_quorum_size: int = 3, ack_quorum_size: int = 2,
                            digest_type: DigestType = DigestType.CRC32C, password: bytes = b"",
                            custom_metadata: Mapping[str, bytes] | None = None, *, namespace: str = "",
                            bookie_groups: Iterable[str] | None = None,
                            bookie_groups_secondary: Iterable[str] | None = None) -> AsyncWriteHandle:
        w = await asyncio.to_thread(functools.partial(
            self.sync.create_ledger, ensemble_size, write_quorum_size, ack_quorum_size, digest_type, password,
            custom_metadata, namespace=namespace, bookie_groups=bookie_groups,
            bookie_groups_secondary=bookie_groups_secondary))
        return AsyncWriteHandle(w)

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> AsyncReadHandle:
        return AsyncReadHandle(await asyncio.to_thread(self.sync.open_ledger, ledger_id, password, recovery))

    async def delete_ledger(self, ledger_id: int) -> None:
        await asyncio.to_thread(self.sync.delete_ledger, ledger_id)

    async def list_ledgers(self) -> list[int]:
        return list(await asyncio.to_thread(self.sync.list_ledgers))

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await asyncio.to_thread(self.sync.ledger_metadata, ledger_id)

    # -- streams (DESIGN §4.5) ----------------------------------------------------------------
    async def create_namespace(self, name: str, tenant: str = "public", **settings: Any) -> AsyncNamespace:
        return AsyncNamespace(await asyncio.to_thread(lambda: self.sync.create_namespace(name, tenant, **settings)))

    # -- tenants (DESIGN §4.9) ----------------------------------------------------------------
    async def create_tenant(self, name: str, admin_roles: list[str] | tuple[str, ...] = ()) -> None:
        await asyncio.to_thread(self.sync.create_tenant, name, admin_roles)

    async def update_tenant(self, name: str, admin_roles: list[str] | tuple[str, ...]) -> None:
        await asyncio.to_thread(self.sync.update_tenant, name, admin_roles)

    async def list_tenants(self) -> list[str]:
        return await asyncio.to_thread(self.sync.list_tenants)

    async def tenant_info(self, name: str) -> TenantInfo:
        return await asyncio.to_thread(self.sync.tenant_info, name)

    async def delete_tenant(self, name: str) -> None:
        await asyncio.to_thread(self.sync.delete_tenant, name)

    async def namespace(self, name: str) -> AsyncNamespace:
        return AsyncNamespace(await asyncio.to_thread(self.sync.namespace, name))

    async def list_namespaces(self) -> list[str]:
        return await asyncio.to_thread(self.sync.list_namespaces)

    async def delete_namespace(self, name: str, force: bool = False) -> None:
        await asyncio.to_thread(self.sync.delete_namespace, name, force)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
