"""A connection to one bookie: pipelined, batched adds on one stream, plus unary reads.

Adds are queued and a single request generator drains whatever is queued into one AddBatch
message, so batching follows load: one entry per message when idle, hundreds under load (Python
gRPC manages only a few thousand stream messages per second, so batching is what makes it fast).
Every call has a deadline; a broken stream fails its pending adds with BookieUnavailableError and
the next add opens a new one. Pending adds are bounded (back-pressure, not memory growth).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import grpc

from .. import errors
from ..protocol import bookkeeper_pb2 as pb
from ..protocol import bookkeeper_pb2_grpc as pb_grpc

AddCallback = Callable[[pb.AddResponse | None, BaseException | None], None]

_STATUS_ERRORS: dict[int, type[errors.LedgerError]] = {
    pb.ENOLEDGER: errors.NoSuchLedgerError,
    pb.ENOENTRY: errors.NoSuchEntryError,
    pb.EBADREQ: errors.BadRequestError,
    pb.EIO: errors.ReadError,
    pb.EUA: errors.UnauthorizedAccessError,
    pb.EFENCED: errors.LedgerFencedError,
    pb.EREADONLY: errors.WriteOnReadOnlyBookieError,
    pb.ETOOMANYREQUESTS: errors.TooManyRequestsError,
}


def status_error(status: int, detail: str, where: str) -> errors.LedgerError:
    cls = _STATUS_ERRORS.get(status, errors.LedgerError)
    name = pb.StatusCode.Name(status) if status in pb.StatusCode.values() else str(status)
    return cls(f"{where}: {name}{': ' + detail if detail else ''}")


_STOP = object()


class _AddStream:
    """One bidirectional AddStream call and the futures waiting on it."""

    def __init__(self, stub: pb_grpc.BookieStub, batch_entries_max: int, batch_bytes_max: int,
                 address: str) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: dict[int, AddCallback] = {}
        self._lock = threading.Lock()
        self._batch_entries_max = batch_entries_max
        self._batch_bytes_max = batch_bytes_max
        self._address = address
        self.broken: BaseException | None = None
        self._call = stub.AddStream(self._requests())
        self._reader = threading.Thread(target=self._read, name=f"add-stream-{address}", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.AddBatch]:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            batch = [item]
            size = len(item.body)
            while len(batch) < self._batch_entries_max and size < self._batch_bytes_max:
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    yield pb.AddBatch(adds=batch)
                    return
                batch.append(item)
                size += len(item.body)
            yield pb.AddBatch(adds=batch)

    def _read(self) -> None:
        try:
            for resp in self._call:
                for r in resp.responses:
                    with self._lock:
                        cb = self._pending.pop(r.request_id, None)
                    if cb is not None:
                        cb(r, None)
            self._fail(errors.BookieUnavailableError(f"add stream to {self._address} ended"))
        except grpc.RpcError as e:
            self._fail(errors.BookieUnavailableError(
                f"add stream to {self._address} failed: {e.code().name}: {e.details()}"))

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self.broken = exc
            pending, self._pending = self._pending, {}
        for cb in pending.values():
            cb(None, exc)

    def send(self, req: pb.AddRequest, cb: AddCallback) -> None:
        with self._lock:
            if self.broken is not None:
                raise self.broken
            self._pending[req.request_id] = cb
        self._q.put(req)

    def close(self) -> None:
        self._q.put(_STOP)
        self._call.cancel()


class BookieClient:
    """Thread-safe client of one bookie at `address` ("host:port")."""

    def __init__(self, address: str, *, timeout_ms: int = 10_000, batch_entries_max: int = 512,
                 batch_bytes_max: int = 4 << 20, message_bytes_max: int = 64 << 20,
                 pending_adds_max: int = 50_000) -> None:
        self.address = address
        self._timeout_s = timeout_ms / 1000.0
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", message_bytes_max),
            ("grpc.max_send_message_length", message_bytes_max),
        ])
        self._stub = pb_grpc.BookieStub(self._channel)
        self._batch = (batch_entries_max, batch_bytes_max)
        self._stream: _AddStream | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots = threading.BoundedSemaphore(pending_adds_max)
        self._closed = False

    # ------------------------------------------------------------------ adds

    def add_async(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
                  callback: AddCallback, *, recovery: bool = False) -> None:
        """Queue one add; `callback(response, None)` or `callback(None, error)` runs on a client thread."""
        if not self._slots.acquire(timeout=self._timeout_s):
            raise errors.LedgerTimeoutError(f"too many pending adds to {self.address}")

        def done(resp: pb.AddResponse | None, exc: BaseException | None) -> None:
            self._slots.release()
            callback(resp, exc)

        req = pb.AddRequest(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key, body=body,
                            flag=pb.RECOVERY_ADD if recovery else pb.ADD_NONE,
                            request_id=next(self._ids))
        try:
            self._add_stream().send(req, done)
        except BaseException:
            self._slots.release()
            raise

    def add(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes, *,
            recovery: bool = False) -> Future[pb.AddResponse]:
        fut: Future[pb.AddResponse] = Future()

        def cb(resp: pb.AddResponse | None, exc: BaseException | None) -> None:
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(resp)  # type: ignore[arg-type]

        self.add_async(ledger_id, entry_id, master_key, body, cb, recovery=recovery)
        return fut

    def _add_stream(self) -> _AddStream:
        with self._lock:
            if self._closed:
                raise errors.BookieUnavailableError(f"client of {self.address} is closed")
            if self._stream is None or self._stream.broken is not None:
                self._stream = _AddStream(self._stub, *self._batch, self.address)
            return self._stream

    # ------------------------------------------------------------------ unary calls

    def _call(self, method: Callable[..., Any], request: Any, timeout_s: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise errors.LedgerTimeoutError(f"{self.address}: deadline exceeded") from e
            raise errors.BookieUnavailableError(f"{self.address}: {e.code().name}: {e.details()}") from e

    def read(self, ledger_id: int, entry_id: int, *, fence: bool = False, master_key: bytes = b"",
             previous_lac: int | None = None, long_poll_timeout_ms: int = 0,
             piggyback: bool = False) -> pb.ReadResponse:
        flag = pb.FENCE_LEDGER if fence else (pb.ENTRY_PIGGYBACK if piggyback else pb.READ_NONE)
        req = pb.ReadRequest(ledger_id=ledger_id, entry_id=entry_id, flag=flag, master_key=master_key)
        if previous_lac is not None:
            req.has_previous_lac = True
            req.previous_lac = previous_lac
            req.timeout_ms = long_poll_timeout_ms
        return self._call(self._stub.Read, req, self._timeout_s + long_poll_timeout_ms / 1000.0)

    def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int = 0) -> pb.ReadRangeResponse:
        return self._call(self._stub.ReadRange, pb.ReadRangeRequest(
            ledger_id=ledger_id, first_entry_id=first, last_entry_id=last, max_bytes=max_bytes))

    def read_lac(self, ledger_id: int) -> pb.ReadLacResponse:
        return self._call(self._stub.ReadLac, pb.ReadLacRequest(ledger_id=ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes) -> pb.WriteLacResponse:
        return self._call(self._stub.WriteLac, pb.WriteLacRequest(
            ledger_id=ledger_id, lac=lac, master_key=master_key, body=body))

    def info(self) -> pb.BookieInfoResponse:
        return self._call(self._stub.GetBookieInfo, pb.BookieInfoRequest())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._channel.close()

    def __enter__(self) -> BookieClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
