"""The gRPC face of the bookie (grpc.aio): one servicer, statuses in the response, never a hang.

Adds arrive on a bidirectional stream in batches; answers are merged into as few stream messages
as possible. Each stream may have at most `in_flight_adds_per_stream_max` adds waiting for the
journal; more get ETOOMANYREQUESTS at once instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol import bookkeeper_pb2_grpc as pb_grpc
from metadata.tenancy import Caller
from spark_bookie.errors import BookieError
from spark_bookie.server.adds import Reply, add_groups, batch_size, group_failures
from spark_bookie.server.auth import ConnectionAccess, TokenVerifier, call_credentials
from spark_bookie.server.processor import RequestProcessor

log = logging.getLogger(__name__)
R = TypeVar("R")


async def _guard(make: Callable[[], Awaitable[R]], error: Callable[[pb.StatusCode, str], R]) -> R:
    """The answer of a request: `error(status, detail)` for a refusal, and for a bug (logged)."""
    try:
        return await make()
    except BookieError as e:
        return error(e.status, str(e))
    except Exception as e:  # a bug must not kill the connection: answer EIO and log it
        log.exception("request failed")
        return error(pb.EIO, f"internal error: {type(e).__name__}: {e}")


async def answer_read_range(p: RequestProcessor, request: pb.ReadRangeRequest,
                            caller: Caller | None = None) -> pb.ReadRangeResponse:
    """A range or listed read's answer, refusals included (gRPC's ReadRange and the TCP read
    connection answer alike)."""
    return await _guard(lambda: p.read_range(request, caller), lambda s, d: pb.ReadRangeResponse(
        status=s, ledger_id=request.ledger_id, first_entry_id=request.first_entry_id, detail=d))


class BookieServicer(pb_grpc.BookieServicer):
    def __init__(self, processor: RequestProcessor, bookie_id: str, data_dirs: list[str],
                 in_flight_adds_max: int, read_only: Callable[[], bool],
                 add_port: Callable[[], int] = lambda: 0, verifier: TokenVerifier | None = None) -> None:
        """`verifier`: the token checks' (the interceptor admitted each call; an AddStream call can
        outlive its token, so its batches are checked as the TCP port's are)."""
        self._p = processor
        self._verifier = verifier
        self._add_port = add_port
        self._bookie_id = bookie_id
        self._dirs = data_dirs
        self._in_flight_max = in_flight_adds_max
        self._read_only = read_only

    async def AddStream(self, request_iterator: AsyncIterator[pb.AddBatch],  # noqa: N802
                        context: Any) -> AsyncIterator[pb.AddBatchResponse]:
        out: asyncio.Queue[tuple[list[int], list[pb.AddResponse]] | None] = asyncio.Queue()
        state = {"in_flight": 0, "eof": False}
        access = self._access(context)

        def reply(ok: list[int], failed: list[pb.AddResponse]) -> None:
            state["in_flight"] -= len(ok) + len(failed)
            out.put_nowait((ok, failed))
            if state["eof"] and state["in_flight"] == 0:
                out.put_nowait(None)

        async def read_requests() -> None:
            try:
                async for batch in request_iterator:
                    why = None if access is None else access.refusal(batch.auth_token)
                    if why is not None:
                        out.put_nowait(([], [f for g in add_groups(batch) for f in group_failures(g, pb.EUA, why)]))
                        continue
                    caller = None if access is None else access.caller
                    await self._p.warm_add_checks(batch, caller)
                    n = batch_size(batch)
                    if state["in_flight"] + n > self._in_flight_max:
                        detail = f"more than {self._in_flight_max} adds in flight on this stream"
                        out.put_nowait(([], [f for g in add_groups(batch)
                                             for f in group_failures(g, pb.ETOOMANYREQUESTS, detail)]))
                        continue
                    state["in_flight"] += n
                    await self._apply(batch, reply, caller)
            except (asyncio.CancelledError, grpc.RpcError):
                pass
            except Exception:   # a bug must not end the stream unseen: the client then times out
                log.exception("add stream failed")
            finally:
                state["eof"] = True
                if state["in_flight"] == 0:
                    out.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read_requests())
        try:
            while True:
                item = await out.get()
                if item is None:
                    return
                resp = pb.AddBatchResponse()
                ok_ids, failures = resp.ok_request_ids, resp.responses
                while item is not None:  # coalesce everything already answered into one message
                    ok_ids.extend(item[0])
                    failures.extend(item[1])
                    if out.empty():
                        break
                    item = out.get_nowait()
                yield resp
                if item is None:
                    return
        finally:
            reader.cancel()

    async def _apply(self, batch: pb.AddBatch, reply: Reply, caller: Caller | None) -> None:
        """Apply the batch piece by piece, each once its write-rate hold and its flow's room in
        the journal are waited out (as the TCP add connections do, without blocking the loop)."""
        flow, pieces = self._p.admit(add_groups(batch))
        loop = asyncio.get_running_loop()
        started = loop.time()
        for groups, hold_s in pieces:
            if hold_s > 0:
                await asyncio.sleep(max(0.0, started + hold_s - loop.time()))
            if not self._p.wait_for_room(flow, 0.0):
                await loop.run_in_executor(None, self._p.wait_for_room, flow)
            self._p.process_adds(batch, reply, caller=caller, flow=flow, groups=groups)

    def _access(self, context: Any) -> ConnectionAccess | None:
        """The token checks of one AddStream call (None: the bookie checks no tokens)."""
        if self._verifier is None:
            return None
        return ConnectionAccess(self._verifier, call_credentials(context.invocation_metadata())[0])

    def _caller(self, context: Any) -> Caller | None:
        """Who a unary call comes from (the interceptor verified its token; None: no token checks)."""
        if self._verifier is None:
            return None
        return self._verifier.verify(call_credentials(context.invocation_metadata())[0]).caller

    async def Read(self, request: pb.ReadRequest, context: Any) -> pb.ReadResponse:  # noqa: N802
        return await _guard(lambda: self._p.read(request, self._caller(context)), lambda s, d: pb.ReadResponse(
            status=s, ledger_id=request.ledger_id, entry_id=request.entry_id, detail=d))

    async def ReadRange(self, request: pb.ReadRangeRequest, context: Any) -> pb.ReadRangeResponse:  # noqa: N802
        return await answer_read_range(self._p, request, self._caller(context))

    async def ReadLac(self, request: pb.ReadLacRequest, context: Any) -> pb.ReadLacResponse:  # noqa: N802
        return await _guard(lambda: self._p.read_lac(request, self._caller(context)), lambda s, d: pb.ReadLacResponse(
            status=s, ledger_id=request.ledger_id, detail=d))

    async def WriteLac(self, request: pb.WriteLacRequest, context: Any) -> pb.WriteLacResponse:  # noqa: N802
        async def run() -> pb.WriteLacResponse:
            await self._p.write_lac(request, self._caller(context))
            return pb.WriteLacResponse(status=pb.EOK, ledger_id=request.ledger_id)
        return await _guard(run, lambda s, d: pb.WriteLacResponse(
            status=s, ledger_id=request.ledger_id, detail=d))

    async def GetBookieInfo(self, request: pb.BookieInfoRequest, context: Any) -> pb.BookieInfoResponse:  # noqa: N802
        free, total = 0, 0
        for d in self._dirs:
            u = shutil.disk_usage(d)
            free, total = free + u.free, total + u.total
        return pb.BookieInfoResponse(status=pb.EOK, free_disk_bytes=free, total_disk_bytes=total,
                                     read_only=self._read_only(), bookie_id=self._bookie_id,
                                     add_port=self._add_port())


def grpc_options(message_bytes_max: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", message_bytes_max),
        ("grpc.max_send_message_length", message_bytes_max),
        ("grpc.so_reuseport", 0),  # a second bookie on the same port must fail, not share it
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
