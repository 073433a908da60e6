"""A connection to one bookie: pipelined, batched adds on one stream, plus unary reads.

Adds are queued and a single request generator drains whatever is queued into one AddBatch
message, so batching follows load: one entry per message when idle, hundreds under load (Python
gRPC manages only a few thousand stream messages per second, so batching is what makes it fast).
Every call has a deadline; a broken stream fails its pending adds with BookieUnavailableError and
the next add opens a new one. Pending adds are bounded (back-pressure, not memory growth).
"""

from __future__ import annotations

import functools
import itertools
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc

from .. import errors
from ..protocol import bookkeeper_pb2 as pb
from ..protocol import bookkeeper_pb2_grpc as pb_grpc
from .add_readers import DEFAULT_READERS, AddReaders
from .add_stream import LAC_ITEM, TRANSPORT_FAILURE, AddSink, AddStream, StreamLimits
from .credentials import NO_CREDENTIALS, Credentials, PresentedToken
from .socket_reads import SocketReads
from .socket_stream import SocketAddStream
from .tls_probe import RefusalCache, tls_refusal

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


def rpc_error(exc: BaseException, address: str) -> errors.LedgerError:
    """The client error for a failed gRPC call (a timeout is a timeout, anything else: unavailable)."""
    if isinstance(exc, errors.LedgerError):
        return exc
    if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.LedgerTimeoutError(f"{address}: deadline exceeded")
    if isinstance(exc, grpc.RpcError) and exc.code() in _REFUSED:
        return errors.UnauthorizedAccessError(f"{address}: {exc.code().name}: {exc.details()}")
    if isinstance(exc, grpc.RpcError):
        return errors.BookieUnavailableError(f"{address}: {exc.code().name}: {exc.details()}")
    return errors.BookieUnavailableError(f"{address}: {type(exc).__name__}: {exc}")


def status_error(status: int, detail: str, where: str) -> errors.LedgerError:
    cls = _STATUS_ERRORS.get(status, errors.LedgerError)
    name = pb.StatusCode.Name(status) if status in pb.StatusCode.values() else str(status)
    return cls(f"{where}: {name}{': ' + detail if detail else ''}")




def _tls_client(credentials: Credentials, timeout_s: float, sock: socket.socket, host: str) -> socket.socket:
    """TLS on a TCP connection to the bookie; UnauthorizedAccessError when we do not trust its
    certificate (no other bookie would do better), OSError for the rest."""
    from .sockets import tls_client

    try:
        return tls_client(sock, credentials.ssl_context(), host, timeout_s)
    except ssl.SSLCertVerificationError as e:
        raise errors.UnauthorizedAccessError(f"{host}: the bookie's certificate is not trusted: "
                                             f"{e.verify_message or e}") from e

_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class _FutureSink:
    """Adapts the batched results of a single add to a Future of its AddResponse."""

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.future: Future[pb.AddResponse] = Future()

    def on_add_results(self, bookie: str, ok: list[int], failed: list[tuple[int, int, str]]) -> None:
        for eid in ok:
            self.future.set_result(pb.AddResponse(status=pb.EOK, ledger_id=self.ledger_id, entry_id=eid))
        for eid, status, detail in failed:
            if status == TRANSPORT_FAILURE:
                self.future.set_exception(errors.BookieUnavailableError(detail))
            else:
                self.future.set_result(pb.AddResponse(status=pb.StatusCode.Name(status), ledger_id=self.ledger_id,
                                                      entry_id=eid, detail=detail))


class GrpcAddStream(AddStream):
    """Adds on one bidirectional AddStream call (gRPC's threads send what `_requests` yields)."""

    def __init__(self, stub: pb_grpc.BookieStub, limits: StreamLimits, address: str,
                 metadata: tuple[tuple[str, str], ...] | None = None,
                 error_of: Callable[[grpc.RpcError], errors.LedgerError] | None = None,
                 token: Callable[[], str | None] = lambda: None) -> None:
        """`token`: the client's current token; the call's metadata carries the one of now, and a
        newer one goes with the next batch (the bookie serves the call only while it is valid)."""
        super().__init__(limits, address)
        self._error_of = error_of or (lambda e: rpc_error(e, address))
        self._token = PresentedToken(token)
        self._token.at_hello()
        self._call = stub.AddStream(self._requests(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name=f"add-stream-{address}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for resp in self._call:
                self._on_response(resp)
            self._fail(f"add stream to {self._address} ended")
        except grpc.RpcError as e:
            refused = isinstance(self._error_of(e), errors.UnauthorizedAccessError)
            self._fail(f"add stream to {self._address} failed: {e.code().name}: {e.details()}",
                       pb.EUA if refused else TRANSPORT_FAILURE)

    def _message(self, items: list[tuple[int, int, bytes, bytes, int, int]]) -> pb.AddBatch:
        msg = super()._message(items)
        rotated = self._token.rotated()
        if rotated:
            msg.auth_token = rotated
        return msg

    def close(self) -> None:
        super().close()
        self._call.cancel()


class BookieClient:
    """Thread-safe client of one bookie at `address` ("host:port")."""

    def __init__(self, address: str, *, timeout_ms: int = 10_000, batch_entries_max: int = 512,
                 batch_bytes_max: int = 4 << 20, message_bytes_max: int = 64 << 20,
                 limits: StreamLimits | None = None, read_transport: str = "tcp",
                 add_readers: AddReaders = DEFAULT_READERS, credentials: Credentials = NO_CREDENTIALS) -> None:
        """read_transport: "tcp" (range and listed reads on the bookie's TCP port) or "grpc";
        add_readers: the thread reading answers on add connections (the pool's: one per client);
        credentials: token and TLS material (with TLS, adds and reads use gRPC: the TCP port has none)."""
        self.address = address
        self._add_readers = add_readers
        self._timeout_s = timeout_ms / 1000.0
        self._creds = credentials
        options = [("grpc.max_receive_message_length", message_bytes_max),
                   ("grpc.max_send_message_length", message_bytes_max)]
        if credentials.tls:
            self._channel = grpc.secure_channel(address, credentials.channel_credentials(), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.BookieStub(self._channel)
        self._limits = limits or StreamLimits(batch_entries_max=batch_entries_max, batch_bytes_max=batch_bytes_max)
        self._secure: Callable[[socket.socket, str], socket.socket] | None = None
        if credentials.tls:   # the TCP port too: each connection's TLS runs in a pump (sockets.tls_client)
            self._secure = functools.partial(_tls_client, credentials, self._timeout_s)
        self._stream: AddStream | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._message_bytes_max = message_bytes_max
        self._add_port: int | None = None  # from GetBookieInfo; forgotten when it led nowhere
        self._read_transport = read_transport
        self._reads: SocketReads | None = None
        self._refusals = RefusalCache()

    # ------------------------------------------------------------------ adds

    def add_async(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
                  sink: AddSink, *, recovery: bool = False) -> None:
        """Queue one add; its result reaches `sink.on_add_results` on the thread reading this
        connection's answers (TRANSPORT_FAILURE when the connection broke). BookieUnavailableError when the bookie
        already has backlog_adds_max adds of ours waiting (see StreamLimits)."""
        send = self._prepare_add(ledger_id, entry_id, master_key, body, sink, recovery)  # may be under the sink's lock
        if send is not None:
            send()

    def add_deferred(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes,
                     sink: AddSink, *, recovery: bool = False) -> Callable[[], None] | None:
        """`add_async` in two steps, for a caller holding a lock its sink also takes: the add is
        noted as pending now (and raises now as add_async would); the function returned sends it
        (None: nothing to send, the connection broke meanwhile and the sink was told). Sending
        can be a system call into the bookie's socket: under the writer's lock it kept the
        readers of the bookies' answers waiting (~9% of their profile samples at 1,000 appends/s)."""
        try:
            return self._prepare_add(ledger_id, entry_id, master_key, body, sink, recovery)
        except errors.UnauthorizedAccessError as e:
            # The bookie refused our credentials: an answer (EUA) for the sink, given outside the
            # caller's lock, not a failure to connect, which would have the bookie replaced.
            return functools.partial(sink.on_add_results, self.address, [], [(entry_id, pb.EUA, str(e))])

    def _prepare_add(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes, sink: AddSink,
                     recovery: bool) -> Callable[[], None] | None:
        item = (ledger_id, entry_id, master_key, body, pb.RECOVERY_ADD if recovery else pb.ADD_NONE, next(self._ids))
        stream = self._stream
        if stream is None or stream.broken is not None:
            stream = self._new_stream()
        return functools.partial(stream.dispatch, item) if stream._register(item, sink) else None

    def announce_lac(self, ledger_id: int, master_key: bytes, body: bytes) -> None:
        """Tell the bookie the ledger's explicit LAC (framed) on the add connection, after the adds
        already sent there (pb.LedgerAdds.lac_body): unanswered and never raising. Without a live
        add connection nothing is sent: the writer's next entry carries the LAC anyway."""
        stream = self._stream
        if stream is not None and stream.broken is None:
            stream.dispatch((ledger_id, -1, master_key, body, LAC_ITEM, 0))

    def add(self, ledger_id: int, entry_id: int, master_key: bytes, body: bytes, *,
            recovery: bool = False) -> Future[pb.AddResponse]:
        """One add as a Future of its AddResponse (TRANSPORT_FAILURE → BookieUnavailableError)."""
        sink = _FutureSink(ledger_id)
        self.add_async(ledger_id, entry_id, master_key, body, sink, recovery=recovery)
        return sink.future

    def _new_stream(self) -> AddStream:
        with self._lock:
            if self._closed:
                raise errors.BookieUnavailableError(f"client of {self.address} is closed")
            stream = self._stream
            if stream is not None and stream.broken is None:
                return stream
            if stream is not None:
                stream.close()
            if self._limits.add_transport == "grpc":
                stream = GrpcAddStream(self._stub, self._limits, self.address, self._creds.grpc_metadata(),
                                       self.error_of, self._creds.token)
            else:
                stream = self._new_socket_stream()
            self._stream = stream
            return stream

    def _new_socket_stream(self) -> AddStream:
        """A connection to the add port, begun from here if the port is known (see socket_stream);
        a refusal the kernel already knows raises, and forgets the port: the bookie may have
        restarted on another one, which the next add asks for."""
        port = self._add_port
        known = (self.address.rsplit(":", 1)[0], port) if port else None
        try:
            return SocketAddStream(self._limits, self.address, self._add_endpoint, self._forget_port,
                                   self._timeout_s, self._message_bytes_max, known, self._add_readers,
                                   self._creds.token, self._secure)
        except OSError as e:
            self._forget_port()
            if known is None:
                raise errors.BookieUnavailableError(f"{self.address}: {e}") from e
            refused = e
        # The add port we knew refused: the bookie may be back on another one (a restart picks a
        # new port unless configured). Ask it once before calling it dead: a writer whose bookies
        # restarted must reach them, and learn, for one, that its ledger was fenced meanwhile.
        try:
            known = self._add_endpoint()
            return SocketAddStream(self._limits, self.address, self._add_endpoint, self._forget_port,
                                   self._timeout_s, self._message_bytes_max, known, self._add_readers,
                                   self._creds.token, self._secure)
        except errors.UnauthorizedAccessError:
            raise
        except (OSError, grpc.RpcError, errors.LedgerError) as e:
            self._forget_port()
            raise errors.BookieUnavailableError(f"{self.address}: {refused}; asked again: {e}") from e

    def _add_endpoint(self) -> tuple[str, int]:
        """(host, port) of the bookie's TCP add listener, asked once (GetBookieInfo)."""
        port = self._add_port
        if port is None:
            port = self._add_port = self.info().add_port
        return self.address.rsplit(":", 1)[0], port

    # ------------------------------------------------------------------ unary calls

    def _call(self, method: Callable[..., Any], request: Any, timeout_s: float | None = None,
              metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        """A unary call with our token (or `metadata`), its failure as a client error."""
        try:
            return method(request, timeout=timeout_s or self._timeout_s,
                          metadata=metadata if metadata is not None else self._creds.grpc_metadata())
        except grpc.RpcError as e:
            raise self.error_of(e) from e

    def error_of(self, exc: BaseException) -> errors.LedgerError:
        """rpc_error, except that a bookie refusing our TLS is UnauthorizedAccessError, not
        unavailable (see tls_probe: gRPC reports such a refusal as a closed socket)."""
        err = rpc_error(exc, self.address)
        if not (isinstance(err, errors.BookieUnavailableError) and isinstance(exc, grpc.RpcError)
                and exc.code() == grpc.StatusCode.UNAVAILABLE):
            return err
        details = (exc.details() or "").lower()
        if not (self._creds.tls or "socket closed" in details):
            return err   # a plaintext client, and not the sign of a TLS port: a bookie down
        reason = self._refusals.get(self._probe_tls)
        return errors.UnauthorizedAccessError(f"{self.address}: {reason}") if reason else err

    def _probe_tls(self) -> str | None:
        host, port = self.address.rsplit(":", 1)
        try:
            context = self._creds.probe_context() if self._creds.tls else None
        except errors.IncorrectParameterError as e:
            return str(e)
        return tls_refusal(host, int(port), context, min(self._timeout_s, 2.0))

    def read(self, ledger_id: int, entry_id: int, *, fence: bool = False, master_key: bytes = b"",
             previous_lac: int | None = None, long_poll_timeout_ms: int = 0,
             piggyback: bool = False) -> pb.ReadResponse:
        fut = self.read_future(ledger_id, entry_id, fence=fence, master_key=master_key, previous_lac=previous_lac,
                               long_poll_timeout_ms=long_poll_timeout_ms, piggyback=piggyback)
        try:
            return fut.result()
        except grpc.RpcError as e:
            raise self.error_of(e) from e

    def read_future(self, ledger_id: int, entry_id: int, *, fence: bool = False, master_key: bytes = b"",
                    previous_lac: int | None = None, long_poll_timeout_ms: int = 0,
                    piggyback: bool = False) -> grpc.Future:
        """Like read(), without blocking: a grpc Future (result() raises grpc.RpcError; see rpc_error)."""
        flag = pb.FENCE_LEDGER if fence else (pb.ENTRY_PIGGYBACK if piggyback else pb.READ_NONE)
        req = pb.ReadRequest(ledger_id=ledger_id, entry_id=entry_id, flag=flag, master_key=master_key)
        if previous_lac is not None:
            req.has_previous_lac = True
            req.previous_lac = previous_lac
            req.timeout_ms = long_poll_timeout_ms
        return self._stub.Read.future(req, timeout=self._timeout_s + long_poll_timeout_ms / 1000.0,
                                      metadata=self._creds.grpc_metadata())

    def read_lac_future(self, ledger_id: int) -> grpc.Future:
        return self._stub.ReadLac.future(pb.ReadLacRequest(ledger_id=ledger_id), timeout=self._timeout_s,
                                         metadata=self._creds.grpc_metadata())

    def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int = 0) -> pb.ReadRangeResponse:
        req = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last, max_bytes=max_bytes)
        if self._read_transport == "grpc":
            return self._call(self._stub.ReadRange, req)
        try:
            return self._socket_reads().submit(req).result(timeout=self._timeout_s)
        except TimeoutError as e:
            raise errors.LedgerTimeoutError(f"{self.address}: no answer to a range read in "
                                            f"{self._timeout_s:.0f}s") from e

    def poll_range_future(self, ledger_id: int, first: int, last: int, previous_lac: int, timeout_ms: int,
                          max_bytes: int = 0) -> Any:
        """A long-poll range read (ReadRangeRequest.wait_for_lac), without blocking: a Future of the
        ReadRangeResponse holding the entries first..min(last, LAC) once the bookie's LAC passed
        previous_lac (none if it did not within timeout_ms), and the LAC."""
        req = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last, max_bytes=max_bytes,
                                  wait_for_lac=True, previous_lac=previous_lac, timeout_ms=timeout_ms)
        if self._read_transport == "grpc":
            return self._stub.ReadRange.future(req, timeout=self._timeout_s + timeout_ms / 1000,
                                               metadata=self._creds.grpc_metadata())
        return self._socket_reads().submit(req)

    def read_entries_future(self, ledger_id: int, entry_ids: list[int], max_bytes: int = 0) -> Any:
        """A listed read (strictly ascending ids), without blocking: a Future of the
        ReadRangeResponse whose entry_ids name its bodies (see ReadRangeRequest.entry_ids).
        Its result() raises TimeoutError, a LedgerError, or (read transport "grpc") grpc.RpcError."""
        req = pb.ReadRangeRequest(ledger_id=ledger_id, entry_ids=entry_ids, max_bytes=max_bytes)
        if self._read_transport == "grpc":
            return self._stub.ReadRange.future(req, timeout=self._timeout_s, metadata=self._creds.grpc_metadata())
        return self._socket_reads().submit(req)

    def held_entries_future(self, ledger_id: int, entry_ids: list[int]) -> Any:
        """Which of the listed entries (strictly ascending ids) the bookie holds, without their
        bodies (ReadRangeRequest.ids_only): a Future of the ReadRangeResponse, as read_entries_future's."""
        req = pb.ReadRangeRequest(ledger_id=ledger_id, entry_ids=entry_ids, ids_only=True)
        if self._read_transport == "grpc":
            return self._stub.ReadRange.future(req, timeout=self._timeout_s, metadata=self._creds.grpc_metadata())
        return self._socket_reads().submit(req)

    def _socket_reads(self) -> SocketReads:
        with self._lock:
            if self._reads is None:
                if self._closed:
                    raise errors.BookieUnavailableError(f"client of {self.address} is closed")
                self._reads = SocketReads(self.address, self._add_endpoint, self._forget_port,
                                          self._timeout_s, self._message_bytes_max, self._creds.token,
                                          self._secure)
            return self._reads

    def _forget_port(self) -> None:
        """A connection to the port led nowhere (see socket_stream, socket_reads): ask again."""
        self._add_port = None

    def read_lac(self, ledger_id: int) -> pb.ReadLacResponse:
        return self._call(self._stub.ReadLac, pb.ReadLacRequest(ledger_id=ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes) -> pb.WriteLacResponse:
        return self._call(self._stub.WriteLac, pb.WriteLacRequest(
            ledger_id=ledger_id, lac=lac, master_key=master_key, body=body))

    def info(self) -> pb.BookieInfoResponse:
        return self._call(self._stub.GetBookieInfo, pb.BookieInfoRequest())

    def confirm_role(self, role: str) -> None:
        """Have the bookie check that our token has `role` (UnauthorizedAccessError when not; a
        bookie without token checks confirms any caller: an open cluster has no roles)."""
        self._call(self._stub.GetBookieInfo, pb.BookieInfoRequest(), metadata=self._creds.role_metadata(role))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
            reads, self._reads = self._reads, None
        if stream is not None:
            stream.close()
        if reads is not None:
            reads.close()
        self._channel.close()

    def __enter__(self) -> BookieClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
