"""The asyncio surface of streams (AsyncLedgerClient's): the same operations, bridged like the
ledger handles are: blocking calls go to a thread, write futures are wrapped, and readers are
async iterators, so an event loop never waits for a quorum or a long poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from .. import errors
from .commits import COMMIT_INTERVAL_MS
from .dlsn import DLSN, LogRecord
from .namespace import Namespace, StreamInfo
from .quota import NamespaceUsage
from .reader import StreamReader
from .settings import NamespaceSettings
from .subscriptions import SubscriptionInfo
from .writer import StreamWriter

if TYPE_CHECKING:
    import pyarrow as pa


class AsyncStreamWriter:
    def __init__(self, writer: StreamWriter) -> None:
        self.sync = writer

    last_txid = property(lambda self: self.sync.last_txid)

    async def write(self, payload: bytes, txid: int | None = None) -> DLSN:
        return await asyncio.wrap_future(self.sync.write_async(payload, txid))

    def write_async(self, payload: bytes, txid: int | None = None) -> asyncio.Future[DLSN]:
        return asyncio.wrap_future(self.sync.write_async(payload, txid))

    async def flush(self) -> None:
        await asyncio.to_thread(self.sync.flush)

    async def truncate(self, dlsn: DLSN) -> None:
        await asyncio.to_thread(self.sync.truncate, dlsn)

    async def mark_end_of_stream(self) -> None:
        await asyncio.to_thread(self.sync.mark_end_of_stream)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncStreamWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncStreamReader:
    def __init__(self, reader: StreamReader) -> None:
        self.sync = reader

    position = property(lambda self: self.sync.position)
    subscription = property(lambda self: self.sync.subscription)

    async def commit(self, dlsn: DLSN, *, sync: bool = False) -> None:
        """The reader's ``commit``: batched, so it waits for ZooKeeper only with ``sync`` (or to check
        a position the reader has not read against the stream's end)."""
        if sync or tuple(dlsn) >= tuple(self.sync.position):
            await asyncio.to_thread(lambda: self.sync.commit(dlsn, sync=sync))
        else:
            self.sync.commit(dlsn)

    def commit_async(self, dlsn: DLSN) -> asyncio.Future[None]:
        return asyncio.wrap_future(self.sync.commit_async(dlsn))

    async def flush_commits(self) -> None:
        await asyncio.to_thread(self.sync.flush_commits)

    async def read_next(self, timeout_ms: int = 1_000) -> LogRecord | None:
        return await asyncio.to_thread(self.sync.read_next, timeout_ms)

    async def read_batch(self, max_records: int = 10_000, timeout_ms: int = 100) -> list[LogRecord]:
        return await asyncio.to_thread(self.sync.read_batch, max_records, timeout_ms)

    async def read_arrow_batch(self, max_records: int = 65_536, timeout_ms: int = 100) -> pa.RecordBatch | None:
        return await asyncio.to_thread(self.sync.read_arrow_batch, max_records, timeout_ms)

    async def __aiter__(self) -> AsyncIterator[LogRecord]:
        while True:
            try:
                batch = await self.read_batch(10_000, 1_000)
            except errors.EndOfStreamError:
                return
            for rec in batch:
                yield rec

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncStreamReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncNamespace:
    def __init__(self, ns: Namespace) -> None:
        self.sync = ns

    name = property(lambda self: self.sync.name)
    settings = property(lambda self: self.sync.settings)

    async def update_settings(self, **changes: Any) -> NamespaceSettings:
        return await asyncio.to_thread(lambda: self.sync.update_settings(**changes))

    async def grant_permission(self, role: str, actions: Iterable[str]) -> None:
        await asyncio.to_thread(self.sync.grant_permission, role, list(actions))

    async def revoke_permission(self, role: str) -> None:
        await asyncio.to_thread(self.sync.revoke_permission, role)

    async def permissions(self) -> dict[str, frozenset[str]]:
        return await asyncio.to_thread(self.sync.permissions)

    async def create_stream(self, name: str) -> None:
        await asyncio.to_thread(self.sync.create_stream, name)

    async def delete_stream(self, name: str) -> None:
        await asyncio.to_thread(self.sync.delete_stream, name)

    async def list_streams(self, prefix: str = "") -> list[str]:
        return await asyncio.to_thread(self.sync.list_streams, prefix)

    async def stream_exists(self, name: str) -> bool:
        return await asyncio.to_thread(self.sync.stream_exists, name)

    async def stream_info(self, name: str) -> StreamInfo:
        return await asyncio.to_thread(self.sync.stream_info, name)

    async def storage_usage(self) -> NamespaceUsage:
        return await asyncio.to_thread(self.sync.storage_usage)

    async def apply_retention(self, name: str) -> int:
        return await asyncio.to_thread(self.sync.apply_retention, name)

    async def open_writer(self, name: str, lock_timeout_ms: int = 30_000) -> AsyncStreamWriter:
        return AsyncStreamWriter(await asyncio.to_thread(self.sync.open_writer, name, lock_timeout_ms))

    async def open_reader(self, name: str, start: DLSN | str = DLSN.INITIAL, start_txid: int | None = None, *,
                          subscription: str | None = None,
                          commit_interval_ms: int = COMMIT_INTERVAL_MS) -> AsyncStreamReader:
        return AsyncStreamReader(await asyncio.to_thread(
            lambda: self.sync.open_reader(name, start, start_txid, subscription=subscription,
                                          commit_interval_ms=commit_interval_ms)))

    async def subscriptions(self, name: str) -> dict[str, SubscriptionInfo]:
        return await asyncio.to_thread(self.sync.subscriptions, name)

    async def commit_subscription(self, name: str, subscription: str, dlsn: DLSN) -> None:
        await asyncio.to_thread(self.sync.commit_subscription, name, subscription, dlsn)

    async def reset_subscription(self, name: str, subscription: str, dlsn: DLSN | str) -> None:
        await asyncio.to_thread(self.sync.reset_subscription, name, subscription, dlsn)

    async def delete_subscription(self, name: str, subscription: str) -> None:
        await asyncio.to_thread(self.sync.delete_subscription, name, subscription)
