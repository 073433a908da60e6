"""The writer of one ledger: pipelined appends, quorum acks, ensemble changes, close.

The protocol decisions live in machines.AddState; this module does the I/O around it. Threads:
the caller's (append), the one reading the bookies' answers (acks: the client's add reader, or a
gRPC stream's own), and one short-lived thread per ensemble change (placement + metadata CAS).
Completions leave in entry-id order through a single drainer, so user callbacks never run under
the handle's lock and never out of order.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING

from metadata import LedgerMetadata, LedgerState, MetadataError, transitions

from . import errors
from .futures import AppendFuture
from .machines import AddState, Completion, Send
from .protocol import bookkeeper_pb2 as pb
from .protocol.framing import Digester
from .transport import TRANSPORT_FAILURE, status_error

if TYPE_CHECKING:
    from .client import LedgerClient

log = logging.getLogger(__name__)

# Answers that mean "this bookie cannot take the entry": replace it (ensemble change).
_REPLACE_BOOKIE = {pb.EIO, pb.EREADONLY, pb.ETOOMANYREQUESTS, pb.ENOLEDGER, pb.EUNKNOWNLEDGERSTATE}


class WriteHandle:
    """Appends to one ledger. Thread-safe; also a context manager (close on exit)."""

    def __init__(self, client: LedgerClient, md: LedgerMetadata, digester: Digester, master_key: bytes,
                 *, recovery: bool = False, last_add_confirmed: int = -1, length: int = 0) -> None:
        self._client = client
        self.ledger_id = md.ledger_id
        self._md = md
        self._digester = digester
        self._key = master_key
        self._recovery = recovery
        self._start_lac = last_add_confirmed
        self._sm = AddState(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size, md.ensembles,
                            last_add_confirmed, length)
        self._lock = threading.Lock()
        self._bodies: dict[int, bytes] = {}
        self._futures: dict[int, Future[int]] = {}
        self._sent_at: dict[int, float] = {}
        self._ready: deque[Completion] = deque()
        self._draining = False
        self._outstanding = 0     # appends not yet completed or failed (bounded: back-pressure)
        self._error: errors.LedgerError | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._lac_sent = last_add_confirmed
        self._idle = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)

    # ------------------------------------------------------------------ public surface

    @property
    def last_add_confirmed(self) -> int:
        return self._sm.lac

    @property
    def length(self) -> int:
        return self._sm.lac_length

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._closed

    def append(self, data: bytes) -> int:
        """Block until Qa bookies have the entry durably; returns its entry id."""
        return self.append_async(data).result(timeout=self._client.config.operation_timeout_ms / 1000)

    def append_async(self, data: bytes) -> Future[int]:
        """Future of the entry id; futures complete strictly in entry-id order."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise errors.IncorrectParameterError(f"entry data must be bytes, not {type(data).__name__}")
        data = bytes(data)
        limit = self._client.config.entry_size_bytes_max
        if len(data) > limit:
            raise errors.IncorrectParameterError(f"entry of {len(data)} bytes is over the limit of {limit}")
        fut: Future[int] = AppendFuture()
        cfg = self._client.config
        with self._lock:
            self._check_writable()
            if self._outstanding >= cfg.outstanding_adds_max:
                if not self._space.wait_for(lambda: self._outstanding < cfg.outstanding_adds_max
                                            or self._error is not None or self._closed,
                                            cfg.operation_timeout_ms / 1000):
                    raise errors.LedgerTimeoutError(f"ledger {self.ledger_id}: too many appends outstanding")
                self._check_writable()
            self._outstanding += 1
            eid, length, bookies = self._sm.append(len(data))
            # A recovery's rewrites carry the LAC recovery started from, which fencing proved;
            # the rewrite's own progress is not a confirmation anyone else may rely on.
            lac = self._start_lac if self._recovery else self._sm.lac
            body = self._digester.frame(self.ledger_id, eid, lac, length, data)
            self._bodies[eid] = body
            self._futures[eid] = fut
            self._sent_at[eid] = time.monotonic()
            pool, key, recovery = self._client.pool, self._key, self._recovery
            sends = []
            for b in bookies:
                try:
                    send = pool.get(b).add_deferred(self.ledger_id, eid, key, body, self, recovery=recovery)
                except errors.LedgerError as e:  # known at once (a refused connect): noted under
                    self._note_failure(b, e)     # the lock, so no later ack completes an entry first
                else:
                    if send is not None:
                        sends.append(send)
        for send in sends:  # outside the lock: the bookies' answers for earlier entries need it
            send()
        return fut

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise errors.LedgerClosedError(f"ledger {self.ledger_id} is closed")

    # ------------------------------------------------------------------ sending and acks

    def _send(self, sends: list[Send]) -> None:
        """Under the lock: resends after an ensemble change, each to its bookie's batching stream."""
        pool = self._client.pool
        for s in sends:
            body = self._bodies.get(s.entry_id)
            if body is None:
                continue
            try:
                pool.get(s.bookie).add_async(self.ledger_id, s.entry_id, self._key, body, self,
                                             recovery=self._recovery)
            except errors.LedgerError as e:  # not _note_failure: _change_ensemble, our caller, would
                # go on with the new change itself and the change it schedules would run beside it
                self._client.run_soon(functools.partial(self._on_failure, s.bookie, e))

    def on_add_results(self, bookie: str, ok: list[int], failed: list[tuple[int, int, str]]) -> None:
        """Transport sink: a batch of results from one bookie (on the thread reading its answers)."""
        if ok:
            with self._lock:
                completions = self._sm.on_acks(bookie, ok)
                if completions:
                    self._ready.extend(completions)
            if completions:
                self._drain()
        for entry_id, status, detail in failed:
            self._on_status(bookie, entry_id, status, detail)

    def _on_status(self, bookie: str, entry_id: int, status: int, detail: str) -> None:
        if status == TRANSPORT_FAILURE:
            self._on_failure(bookie, errors.BookieUnavailableError(detail))
            return
        err = status_error(status, detail, f"add {self.ledger_id}/{entry_id} on {bookie}")
        if status in _REPLACE_BOOKIE:
            self._on_failure(bookie, err)
        elif status == pb.EFENCED:
            self._fail(errors.LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery"))
        elif status == pb.EUA:
            self._fail(errors.UnauthorizedAccessError(str(err)))
        else:
            self._fail(errors.WriteError(str(err)))

    def _on_failure(self, bookie: str, exc: BaseException) -> None:
        with self._lock:
            self._note_failure(bookie, exc)

    def _note_failure(self, bookie: str, exc: BaseException) -> None:
        """Under the lock: from here on no entry completes until the ensemble change is done."""
        if self._error is None and self._sm.on_bookie_failure(bookie):
            log.info("ledger %d: bookie %s failed (%s); changing ensemble", self.ledger_id, bookie, exc)
            self._client.run_soon(self._change_ensemble)

    def _drain(self) -> None:
        """Complete ready futures in order; only one thread drains at a time."""
        with self._lock:
            if self._draining or not self._ready:
                return
            self._draining = True
        while True:
            with self._lock:
                if not self._ready:
                    self._draining = False
                    self._idle.notify_all()
                    return
                batch = list(self._ready)
                self._ready.clear()
                futs = [self._futures.pop(c.entry_id) for c in batch]
                metrics = self._client.metrics
                if metrics is not None:
                    now = time.monotonic()
                    metrics.appended([now - self._sent_at[c.entry_id] for c in batch])
                for c in batch:
                    del self._bodies[c.entry_id]
                    del self._sent_at[c.entry_id]
                self._release(len(batch))
            for c, f in zip(batch, futs, strict=True):
                f.set_result(c.entry_id)

    def _release(self, n: int) -> None:
        """Under the lock: `n` appends are finished; wake an append waiting for room."""
        full = self._outstanding >= self._client.config.outstanding_adds_max
        self._outstanding -= n
        if full:
            self._space.notify_all()

    # ------------------------------------------------------------------ ensemble change

    def _change_ensemble(self) -> None:
        while True:
            with self._lock:
                if self._error is not None or not self._sm.changing:
                    return
                key, indexes = self._sm.change_plan()
                ensemble = list(self._sm.ensemble)
                exclude = set(self._sm.failed)
                too_many = self._sm.changes >= self._client.config.ensemble_changes_max
            if too_many:
                self._give_up(errors.NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: more than {self._client.config.ensemble_changes_max} ensemble changes"))
                return
            try:
                new = self._client.placement.replace(ensemble, indexes, self._client.registry.writable(), exclude)
                if self._recovery:
                    # A recovery's fragments stay local until the closing CAS (as in BookKeeper):
                    # published early, they would claim entries live on bookies that do not have
                    # them yet, and a recovery that then aborted would leave that claim behind.
                    md = transitions.set_fragment(self._md, key, new)
                else:
                    change = functools.partial(self._with_fragment, key=key, ensemble=new)
                    md = self._client.update_metadata(self.ledger_id, change)
            except errors.LedgerError as e:
                self._give_up(e)
                return
            with self._lock:
                self._md = md
                sends, completions = self._sm.apply_change(key, new)
                self._ready.extend(completions)
                now = time.monotonic()
                for s in sends:  # the add timeout counts from the resend, not the first send
                    if self._sent_at.pop(s.entry_id, None) is not None:
                        self._sent_at[s.entry_id] = now  # re-inserted last: the dict stays in time order
                self._send(sends)
                again = self._sm.changing
            log.info("ledger %d: fragment %d is now %s", self.ledger_id, key, new)
            if self._client.metrics is not None:
                self._client.metrics.ensemble_changes.inc()
            self._drain()
            if not again:
                return

    def _with_fragment(self, md: LedgerMetadata, key: int, ensemble: list[str]) -> LedgerMetadata:
        if md.state is not LedgerState.OPEN:
            raise errors.LedgerFencedError(f"ledger {self.ledger_id} is {md.state.name}: a recovery took it over")
        return transitions.set_fragment(md, key, ensemble)

    # ------------------------------------------------------------------ failure and close

    def _fail(self, error: errors.LedgerError) -> None:
        """Fail every pending append with `error`; the handle accepts no more."""
        with self._lock:
            if self._error is None:
                self._error = error
            self._sm.abort_change()
            ids = self._sm.drain_pending()
            futs = [self._futures.pop(i) for i in ids if i in self._futures]
            for i in ids:
                self._bodies.pop(i, None)
                self._sent_at.pop(i, None)
            self._release(len(ids))
            self._idle.notify_all()
        for f in futs:
            if not f.done():
                f.set_exception(error)

    def _give_up(self, error: errors.LedgerError) -> None:
        """The ensemble change cannot go on. If the ledger is no longer this writer's (a recovery
        fenced it, someone closed it), that is what the writer is told, whatever stopped the
        change: a write-ahead log's leader learns it lost its ledger from LedgerFencedError, not
        from "not enough bookies" (its bookies may just have restarted; BookKeeper's
        TestFencing.testFencingAndRestartBookies). Otherwise: no spare bookie closes the ledger
        at its LAC, any other error fails the handle."""
        taken = self._taken_over()
        if taken is not None:
            self._fail(taken)
        elif isinstance(error, errors.NotEnoughBookiesError):
            self._fail_and_close(error)
        else:
            self._fail(error)

    def _taken_over(self) -> errors.LedgerFencedError | None:
        """LedgerFencedError when the metadata says the ledger is in recovery or closed (a
        recovery writer's own ledger is IN_RECOVERY: never taken over by that)."""
        if self._recovery:
            return None
        try:
            md = self._client.ledger_metadata(self.ledger_id)
        except errors.LedgerError as e:
            log.warning("ledger %d: cannot read its metadata while giving up: %s", self.ledger_id, e)
            return None
        if md.state is LedgerState.OPEN:
            return None
        end = f" at entry {md.last_entry_id}" if md.state is LedgerState.CLOSED else ""
        return errors.LedgerFencedError(f"ledger {self.ledger_id} is {md.state.name}{end}: "
                                        "a recovery fenced it, this writer can add no more")

    def _fail_and_close(self, error: errors.LedgerError) -> None:
        """No way forward (no spare bookie): close the ledger at its LAC, fail what is pending.

        A recovery writer never closes here: its LAC is only how far the rewrite got, and entries
        past it may have been acknowledged to the original writer. The ledger stays IN_RECOVERY
        and the next recovery starts over.
        """
        self._fail(error)
        if self._recovery:
            return
        try:
            self._close_metadata()
        except errors.LedgerError as e:
            log.warning("ledger %d: close after %s failed: %s", self.ledger_id, error, e)
        self._closed = True

    def check_timeouts(self, now: float) -> None:
        """Called by the client's ticker: a bookie that has not acked an old entry is replaced."""
        limit = self._client.config.add_timeout_ms / 1000
        late: set[str] = set()
        with self._lock:
            for eid, t in self._sent_at.items():
                if now - t < limit:
                    break
                late.update(self._sm.unacked(eid))
        for b in late:
            self._on_failure(b, errors.LedgerTimeoutError(f"no ack from {b} in {limit:.0f}s"))

    def send_explicit_lac(self) -> None:
        """Tell the ensemble the LAC when no entry will carry it (BookKeeper's explicit LAC)."""
        with self._lock:
            lac, ensemble = self._sm.lac, list(self._sm.ensemble)
            if lac <= self._lac_sent or self._sm.pending or self._closed or self._error:
                return
            self._lac_sent = lac
        body = self._digester.frame_lac(self.ledger_id, lac)
        for b in ensemble:
            try:
                self._client.pool.get(b).write_lac(self.ledger_id, lac, self._key, body)
            except errors.LedgerError as e:
                log.debug("explicit LAC to %s failed: %s", b, e)

    def wait_idle(self, timeout_s: float) -> None:
        """Block until nothing is pending (or the handle failed, or the timeout passed)."""
        self._wait_idle(timeout_s)

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._sm.pending or self._ready or self._draining:
                left = deadline - time.monotonic()
                if left <= 0 or self._error is not None:
                    return
                self._idle.wait(min(left, 0.1))

    def _close_metadata(self) -> LedgerMetadata:
        lac, length = self._sm.lac, self._sm.lac_length

        def close(md: LedgerMetadata) -> LedgerMetadata:
            try:
                return transitions.close(md, lac, length)
            except MetadataError as e:
                raise errors.MetadataVersionError(
                    f"ledger {self.ledger_id} was closed by someone else at another end: {e}") from e

        self._md = self._client.update_metadata(self.ledger_id, close)
        return self._md

    def close(self) -> None:
        """Wait for pending appends, then close the ledger at its LAC (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            self._wait_idle(self._client.config.operation_timeout_ms / 1000)
            if self._sm.pending and self._error is None:
                self._fail(errors.LedgerTimeoutError(f"ledger {self.ledger_id}: appends still pending at close"))
            self._closed = True
            self._client.forget_writer(self)
            self._close_metadata()

    def __enter__(self) -> WriteHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
