"""The writer of one ledger: pipelined appends, quorum acks, ensemble changes, close.

The protocol decisions live in machines.AddState; this module does the I/O around it. Threads:
the caller's (append), the one reading the bookies' answers (acks: the client's add reader, or a
gRPC stream's own), and one short-lived thread per ensemble change (placement + metadata CAS).
Completions leave in entry-id order through a single drainer, so user callbacks never run under
the handle's lock and never out of order.

A failed bookie with no spare to replace it (ClientConfig.delay_ensemble_change) stays in the
ensemble, delayed: appends go on while every write set has Qa other bookies; the client's ticker
(`check_timeouts`) retries the change when a spare registers or the bookie answers again (it is
then taken back with its id), and fails a write stalled for lack of bookies after the operation
timeout. Whenever the writer leaves a fragment short of a bookie (it changed away from it, took it
back, closed or failed), it marks the ledger under-replicated for that bookie: the replication
workers copy what it missed.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from metadata import LedgerMetadata, LedgerState, MetadataError, transitions

from . import errors
from .completer import InOrderCompleter
from .debts import Debts, mark_underreplicated
from .futures import AppendFuture
from .machines import AddState, Completion, Send
from .protocol import bookkeeper_pb2 as pb
from .protocol.framing import Digester
from .transport import TRANSPORT_FAILURE, status_error
from .write_timing import BookieProbes, SendClock, StallClock, late_bookies

if TYPE_CHECKING:
    from .core import LedgerCore

log = logging.getLogger(__name__)

# Answers that mean "this bookie cannot take the entry": replace it (ensemble change).
_REPLACE_BOOKIE = {pb.EIO, pb.EREADONLY, pb.ETOOMANYREQUESTS, pb.ENOLEDGER, pb.EUNKNOWNLEDGERSTATE}

REJOIN_CHECK_S = 0.5       # a writer with delayed bookies looks for a spare this often


class WriteHandle:
    """Appends to one ledger. Thread-safe; also a context manager (close on exit)."""

    def __init__(self, client: LedgerCore, md: LedgerMetadata, digester: Digester, master_key: bytes,
                 *, recovery: bool = False, last_add_confirmed: int = -1, length: int = 0,
                 version: int | None = None) -> None:
        self._client = client
        self.ledger_id = md.ledger_id
        self._md = md
        self._version = version   # md's znode version when known (a new ledger's: 0): close skips a read
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
        # Completions leave through one in-order completer (ledger_client/completer.py): futures
        # are settled outside the lock, one thread at a time, in entry-id order.
        self._completer: InOrderCompleter[Completion, list[tuple[Future[int], int]]] = InOrderCompleter(
            self._lock, self._take_completed, _settle)
        self._outstanding = 0     # appends not yet completed or failed (bounded: back-pressure)
        self._error: errors.LedgerError | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._lac_sent = last_add_confirmed
        self._space = threading.Condition(self._lock)
        # Delayed ensemble changes (see the module docstring); recovery's rewrites never delay.
        self._may_delay = client.config.delay_ensemble_change and not recovery
        self._send_clock = SendClock()
        self._probes = BookieProbes()          # bookies that failed us: not spares until they answer
        self._back: set[str] = set()           # delayed bookies that answered: the next change takes them back
        self._rejoin_at = 0.0
        self._rejoining = False
        self._stall = StallClock()
        self._debts = Debts(recovery=recovery)   # bookies short of entries (a recovery's: marked at its close)

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
        """Block until Qa bookies have the entry durably; returns its entry id. A write that
        cannot reach Qa bookies (too few live, no spare) fails with NotEnoughBookiesError after
        the operation timeout."""
        fut = self.append_async(data)
        try:
            return fut.result(timeout=self._client.config.operation_timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            with self._lock:
                stalled = self._error is None and self._sm.quorum_lost
            if not stalled:
                raise
            self._give_up(self._stall_error())
            return fut.result(timeout=5)   # failed by now (with the stall, or what happened first)

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
                    self._completer.add(completions)
                    taken = self._completer.claim()
                else:
                    taken = None
            if taken is not None:
                self._completer.deliver(taken)
        for entry_id, status, detail in failed:
            self._on_status(bookie, entry_id, status, detail)

    def _on_status(self, bookie: str, entry_id: int, status: int, detail: str) -> None:
        if status == TRANSPORT_FAILURE or self._debts.ended:
            # closed or closing, a refusal (a recovery's fence, say) is one more entry the bookie misses
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
        self._probes.failed(bookie)
        if self._debts.ended:   # closed or closing: nothing replaces it, what it owes is short
            if self._sm.write_off(bookie):
                self._client.run_soon(functools.partial(self._mark_underreplicated, {bookie}))
        elif self._error is None and self._sm.on_bookie_failure(bookie):
            log.info("ledger %d: bookie %s failed (%s); changing ensemble", self.ledger_id, bookie, exc)
            self._client.run_soon(self._change_ensemble)

    def _take_completed(self, batch: list[Completion]) -> list[tuple[Future[int], int]]:
        """Under the lock, for the completer: forget what the completed entries held, make room
        for more appends; the futures to settle (outside the lock) with their entry ids."""
        futures, bodies, sent_at = self._futures, self._bodies, self._sent_at
        out = [(futures.pop(c.entry_id), c.entry_id) for c in batch]
        metrics = self._client.metrics
        if metrics is not None:
            now = time.monotonic()
            metrics.appended([now - sent_at[c.entry_id] for c in batch])
        for c in batch:
            del bodies[c.entry_id]
            del sent_at[c.entry_id]
        self._release(len(batch))
        return out

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
                if self._error is not None or not self._sm.changing or self._debts.ended:
                    return   # failed, done, or closing: a failed bookie's debt goes to the close (debts.py)
                key, indexes = self._sm.change_plan()
                ensemble = list(self._sm.ensemble)
                planned = {ensemble[i] for i in indexes}
                back, self._back = self._back & self._sm.delayed, set()
                too_many = self._sm.changes >= self._client.config.ensemble_changes_max
            if too_many:
                self._give_up(errors.NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: more than {self._client.config.ensemble_changes_max} ensemble changes"))
                return
            try:
                new, delayed = self._new_ensemble(ensemble, indexes, planned, back)
                if new is None:
                    # A delay writes no metadata, so nothing would tell this writer that a recovery
                    # took the ledger over (it would wait out the operation timeout): ask.
                    taken = self._taken_over()
                    if taken is not None:
                        self._fail(taken)
                        return
                    if self._delay(planned):
                        continue
                    return
                if self._recovery:
                    # A recovery's fragments stay local until the closing CAS (as in BookKeeper):
                    # published early, they would claim entries live on bookies that do not have
                    # them yet, and a recovery that then aborted would leave that claim behind.
                    md = transitions.set_fragment(self._md, key, new)
                else:
                    change = functools.partial(self._with_fragment, key=key, ensemble=new)
                    self._version = None   # md and version go stale together: close reads again
                    md = self._client.update_metadata(self.ledger_id, change)
            except errors.LedgerError as e:
                self._give_up(e)
                return
            if not self._changed(md, key, new, delayed, back):
                return

    def _new_ensemble(self, ensemble: list[str], indexes: list[int], planned: set[str],
                      back: set[str]) -> tuple[list[str] | None, set[str]]:
        """The change's ensemble and the planned bookies it leaves delayed; (None, ...) when it
        would change nothing (no spare, none back): the change is delayed. NotEnoughBookiesError
        when there is no spare and delaying is off."""
        writable, groups = self._client.registry.writable(), self._client.placement.groups_of(self._md)  # §4.10
        exclude = planned | self._probes.suspects() if self._may_delay else planned   # a suspect is probed when delayed
        placement = self._client.placement
        try:
            return placement.replace(ensemble, indexes, writable, exclude, groups), set()
        except errors.NotEnoughBookiesError:
            if not self._may_delay:
                raise
        new, left = placement.replace_available(ensemble, indexes, writable, exclude, back, groups)
        delayed = {ensemble[i] for i in left} - back
        if len(left) == len(indexes) and not back:
            return None, delayed
        return new, delayed

    def _changed(self, md: LedgerMetadata, key: int, new: list[str], delayed: set[str], back: set[str]) -> bool:
        """The new fragment is in the metadata: resend, complete, mark; True to run another change."""
        with self._lock:
            self._md = md
            if self._error is not None:   # failed meanwhile: nothing to resend or complete
                return False
            sends, completions = self._sm.apply_change(key, new, delayed)
            self._completer.add(completions)
            now = time.monotonic()
            for s in sends:  # the add timeout counts from the resend, not the first send
                if self._sent_at.pop(s.entry_id, None) is not None:
                    self._sent_at[s.entry_id] = now  # re-inserted last: the dict stays in time order
            self._send(sends)
            short = self._sm.take_short()
            self._probes.rejoined(back - delayed)
            self._probes.schedule(delayed, self._sm.delayed, now)
            self._stall.reset()
            again = self._sm.changing
        log.info("ledger %d: fragment %d is now %s%s%s", self.ledger_id, key, new,
                 f" ({sorted(back - delayed)} back)" if back - delayed else "",
                 f" ({sorted(delayed)} still delayed, no spare)" if delayed else "")
        if self._client.metrics is not None:
            self._client.metrics.ensemble_changes.inc()
        self._mark_underreplicated(short)
        self._completer.run()
        return again

    def _delay(self, planned: set[str]) -> bool:
        """No spare for the planned bookies: write on without them (BookKeeper's delayed ensemble
        change); True to run another change (a bookie failed meanwhile)."""
        with self._lock:
            if self._error is not None:
                return False
            fresh = planned - self._sm.delayed
            self._completer.add(self._sm.delay_change())
            self._probes.schedule(planned, self._sm.delayed, time.monotonic())
            quorum_lost, again, short = self._sm.quorum_lost, self._sm.changing, self._sm.take_short()
        self._mark_underreplicated(short)
        if fresh:
            log.warning("ledger %d: no spare bookie to replace %s; writing on without %s (%s)", self.ledger_id,
                        sorted(fresh), "them" if len(fresh) > 1 else "it",
                        "a write set has fewer than Qa live bookies: appends wait for one" if quorum_lost
                        else "the ledger is under-replicated until the ensemble changes")
        self._completer.run()
        return again

    # ------------------------------------------------------------------ delayed changes: retries

    def _try_rejoin(self) -> None:
        """A writer with delayed bookies: change the ensemble if a spare registered (a bookie that
        failed us counts once it answers) or a delayed bookie answers again (taken back)."""
        try:
            writable = self._client.registry.writable_ids()
            with self._lock:
                if self._error is not None or self._closed or not self._sm.delayed:
                    return
                ensemble, delayed = list(self._sm.ensemble), set(self._sm.delayed)
            probes = self._probes
            spare = any(b not in ensemble and (not probes.is_suspect(b) or probes.answers(b)) for b in writable)
            back = set() if spare else {b for b in delayed if b in writable and probes.answers(b)}
            if not spare and not back:
                return
            with self._lock:
                if self._error is not None:
                    return
                self._back = back
                start = self._sm.begin_change()
            if start:
                self._change_ensemble()
        finally:
            with self._lock:
                self._rejoining = False
                self._rejoin_at = time.monotonic() + REJOIN_CHECK_S

    def _mark_underreplicated(self, bookies: set[str]) -> None:
        """Entries this writer acknowledged are missing on ``bookies`` (it wrote on without them,
        or they never acknowledged them): queue the ledger for the replication workers. A
        recovery's once its close is in the metadata (debts.py)."""
        if bookies:
            with self._lock:
                bookies = self._debts.short(bookies)
        if bookies:
            mark_underreplicated(self._client.store.underreplication, self.ledger_id, bookies)

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
            self._completer.idle.notify_all()
            short = self._sm.finish()
        for f in futs:
            if not f.done():
                f.set_exception(error)
        if short:  # not on this thread: it may be the one reading the bookies' answers
            self._client.run_soon(functools.partial(self._mark_underreplicated, short))

    def _give_up(self, error: errors.LedgerError) -> None:
        """The ensemble change cannot go on. If the ledger is no longer this writer's (a recovery
        fenced it, someone closed it), that is what the writer is told, whatever stopped the
        change: a write-ahead log's leader learns it lost its ledger from LedgerFencedError, not
        from "not enough bookies" (its bookies may just have restarted; BookKeeper's
        TestFencing.testFencingAndRestartBookies). Otherwise NotEnoughBookiesError (a write
        stalled for lack of bookies past the operation timeout, too many ensemble changes, or no
        spare with delay_ensemble_change off) closes the ledger at its LAC, any other error fails
        the handle."""
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
        """No way forward (not enough bookies): close the ledger at its LAC, fail what is pending.

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
        """Called by the client's ticker: a bookie that has not acked an entry sent add_timeout_ms
        ago is replaced, whether the entry is pending or completed without it (Qw > Qa: it still
        owes it); delayed changes are retried; a write stalled for lack of bookies fails after
        the operation timeout."""
        limit = self._client.config.add_timeout_ms / 1000
        with self._lock:
            settled = self._debts.settled(self._sm)   # closed, and no bookie owes an entry
            if self._error is not None or settled:
                if settled:
                    self._client.forget_writer(self)
                return
            sm = self._sm
            self._send_clock.tick(sm.next_entry_id, now, limit)
            late = late_bookies(sm, self._sent_at, self._send_clock, now, limit)
            stalled = self._stall.due(sm, now, self._client.config.operation_timeout_ms / 1000)
            rejoin = bool(sm.delayed) and not sm.changing and not self._rejoining and now >= self._rejoin_at
            self._rejoining = self._rejoining or rejoin
        for b in late:
            self._on_failure(b, errors.LedgerTimeoutError(f"no ack from {b} in {limit:g}s"))
        if stalled:
            self._client.run_soon(functools.partial(self._give_up, self._stall_error()))
        if rejoin:
            self._client.run_soon(self._try_rejoin)

    def _stall_error(self) -> errors.NotEnoughBookiesError:
        with self._lock:
            delayed, ensemble = sorted(self._sm.delayed | self._sm.failed), list(self._sm.ensemble)
        return errors.NotEnoughBookiesError(
            f"ledger {self.ledger_id}: fewer than {self._sm.qa} live bookies in a write set of {ensemble} "
            f"({delayed} failed, no spare) for {self._client.config.operation_timeout_ms} ms")

    def send_explicit_lac(self, *, journaled: bool = True) -> None:
        """Tell the ensemble the LAC when no pending entry will carry it (BookKeeper's explicit LAC):
        by WriteLac, journaled (the periodic explicit_lac_interval_ms), or else announced on the add
        connections, applied on receipt and never journaled: an idle stream writer's last entry is
        seen by tailing readers at once, and its next entry shares no journal sync with the LAC."""
        with self._lock:
            lac, ensemble = self._sm.lac, list(self._sm.ensemble)
            if lac <= self._lac_sent or self._sm.pending or self._closed or self._error or self._recovery:
                return
            self._lac_sent = lac
        body = self._digester.frame_lac(self.ledger_id, lac)
        self._client.pool.send_lac(ensemble, self.ledger_id, lac, self._key, body, journaled)

    def end_changes(self) -> None:
        """No ensemble change from now on (the writer is closing, or a recovery's rewrites all
        completed): a bookie that fails or falls silent owes what it missed (debts.py)."""
        with self._lock:
            self._debts.ended = True

    def closed_with_debts(self) -> None:
        """The ledger is closed (by this writer, or by the recovery it rewrites for, which calls
        end_changes first): mark it for the bookies that missed entries; the ticker watches the
        ones that still owe some until they answer, fail or fall silent (debts.py)."""
        with self._lock:
            short = self._debts.close(self._sm)
            settled = self._debts.settled(self._sm)
        if settled:
            self._client.forget_writer(self)
        self._mark_underreplicated(short)

    def abandon(self) -> None:
        """Its owner is done with the handle without closing the ledger (a recovery that closed it
        by its own CAS): answers still on their way start no ensemble change."""
        self._fail(errors.LedgerClosedError(f"ledger {self.ledger_id}: this writer was abandoned"))

    def wait_idle(self, timeout_s: float) -> None:
        """Block until nothing is pending (or the handle failed, or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        idle = self._completer.idle   # notified after each delivery and when the handle fails
        with idle:
            while self._sm.pending or not self._completer.settled():
                left = deadline - time.monotonic()
                if left <= 0 or self._error is not None:
                    return
                idle.wait(left)

    def _close_metadata(self) -> LedgerMetadata:
        lac, length = self._sm.lac, self._sm.lac_length

        def close(md: LedgerMetadata) -> LedgerMetadata:
            try:
                return transitions.close(md, lac, length)
            except MetadataError as e:
                raise errors.MetadataVersionError(
                    f"ledger {self.ledger_id} was closed by someone else at another end: {e}") from e

        known = None if self._version is None else (self._md, self._version)
        self._md, self._version = self._client.update_metadata_versioned(self.ledger_id, close, known)
        return self._md

    def close(self) -> None:
        """Wait for pending appends, then close the ledger at its LAC (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            self.wait_idle(self._client.config.operation_timeout_ms / 1000)
            if self._sm.pending and self._error is None:
                self._fail(errors.LedgerTimeoutError(f"ledger {self.ledger_id}: appends still pending at close"))
            self._closed = True
            self.end_changes()
            try:
                self._close_metadata()
            except BaseException:
                self._client.forget_writer(self)
                raise
            self.closed_with_debts()

    def __enter__(self) -> WriteHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(done: list[tuple[Future[int], int]]) -> None:
    """The completer's delivery: each completed append's future gets its entry id, in order."""
    for f, eid in done:
        f.set_result(eid)
