"""A seeded, single-threaded simulation of the replication protocol (DESIGN §5, invariants 1–5).

Why a simulator: the protocol's decisions live in pure state machines (``ledger_client.machines``)
and pure metadata transitions (``metadata.transitions``); the real client drives them over gRPC and
ZooKeeper, where the interleavings that break protocols (a fence racing an ack, two recoveries
racing an ensemble change) are rare and unrepeatable. Here the same machines are driven, step for
step as ``ledger_client/write_handle.py`` and ``ledger_client/recovery.py`` drive them, over an
in-memory network with crashes, restarts, drops and delays, all chosen by one ``random.Random(seed)``
so any failing schedule replays exactly from its seed.

Model (the world it runs in -- bookies, network, metadata store, event loop -- is sim_world):
- ``SimWriter`` = WriteHandle (including its add-timeout ticker), ``SimRecovery`` = LedgerRecovery
  (an application retrying a failed open), ``sim_world.ClientModel`` = the recovery-handle choices
  that differ from BookKeeper, ``sim_run.run_schedule`` = one run, a final clean recovery,
  the invariant checks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from sim_world import (
    ADD_TIMEOUT,
    CHANGES_MAX,
    E_FENCED,
    E_METADATA,
    E_NOT_ENOUGH,
    E_READ,
    E_TIMEOUT,
    E_UNAVAILABLE,
    E_VERSION,
    FENCED,
    LEDGER_ID,
    NO_ENTRY,
    OK,
    TICK,
    Body,
    MdDone,
    Reply,
    SimBookie,
    World,
    _Fenced,
    error_kind,
    update_async,
)

from ledger_client.errors import NotEnoughBookiesError
from ledger_client.machines import (
    AddState,
    Completion,
    QuorumCoverage,
    ReadOutcome,
    RecoveryReadTally,
    Send,
    fence_start_point,
    write_set,
)
from metadata import transitions
from metadata.model import LedgerMetadata, LedgerState

# ---------------------------------------------------------------------------------------- writer

AddDone = Callable[[int | None, str | None], None]


class SimWriter:
    """WriteHandle over the simulated network: the same AddState calls, in the same order.

    Besides driving AddState it keeps its own view (ensembles applied, bookies reported failed) to
    check invariant 2 independently of the machine: completions in order, LAC monotonic, none while
    a reported-failed bookie is still in the ensemble, and each completed entry really stored on
    ≥ Qa bookies of its write set.
    """

    def __init__(self, world: World, md: LedgerMetadata, name: str, *, recovery: bool = False,
                 lac: int = -1, length: int = 0) -> None:
        self.w, self.sim, self.name, self.recovery = world, world.sim, name, recovery
        self.md = md
        self.sm = AddState(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size, md.ensembles,
                           lac, length)
        self.bodies: dict[int, Body] = {}
        self.waiters: dict[int, AddDone] = {}
        self.error: str | None = None
        self.closed = False
        self.dead = False
        self.completed: list[int] = []
        self.view = {k: list(v) for k, v in md.ensembles.items()}
        self.reported_failed: set[str] = set()
        self.seen_lac = lac
        self.on_idle: list[Callable[[], None]] = []
        self.deferred: dict[int, list[str]] = {}
        self.sent_at: dict[int, float] = {}
        self.ticking = False
        self.timeouts = 0

    # -- adds
    def append(self, data: bytes, done: AddDone) -> int | None:
        """append_async: None (and no effect) when the handle already failed or closed."""
        if self.error is not None or self.closed:
            return None
        eid, length, bookies = self.sm.append(len(data))
        sends = [Send(eid, -1, b) for b in bookies]  # the position only matters for resends
        self.bodies[eid] = Body(eid, self.sm.lac, length, data)
        self.waiters[eid] = done
        self.sim.log(f"{self.name} append {eid} -> {[s.bookie for s in sends]}")
        self.sent_at[eid] = self.sim.now
        self._send(sends)
        if not self.recovery and not self.ticking:   # the client's ticker knows only create_ledger's handles
            self.ticking = True
            self.sim.at(TICK, self._tick)
        return eid

    def _send(self, sends: list[Send]) -> None:
        for s in sends:
            body = self.bodies.get(s.entry_id)
            if body is None:
                continue
            add = partial(SimBookie.add, ledger_id=LEDGER_ID, body=body, recovery=self.recovery)
            self.w.net.call(s.bookie, add, partial(self._on_reply, s.bookie, s.entry_id))

    def _on_reply(self, bookie: str, entry_id: int, reply: Reply | None) -> None:
        if self.dead:
            return
        if reply is None:
            self.sim.log(f"{self.name} add {entry_id} to {bookie} failed")
            self._on_failure(bookie)
        elif reply.status == OK:
            self._deliver(self.sm.on_acks(bookie, [entry_id]))
        elif reply.status == FENCED:
            self.sim.log(f"{self.name} add {entry_id} to {bookie}: FENCED")
            self._fail(E_FENCED)

    def _on_failure(self, bookie: str) -> None:
        if self.error is not None:
            return
        if bookie in self.view[max(self.view)]:
            self.reported_failed.add(bookie)
        if self.sm.on_bookie_failure(bookie):
            self.sim.at(0.01, self._change_ensemble)

    def _deliver(self, completions: list[Completion]) -> None:
        self.sim.check(self.sm.lac >= self.seen_lac,
                       f"{self.name}: LAC went back {self.seen_lac} -> {self.sm.lac}")
        for c in completions:
            self._check_completion(c)
            self.seen_lac = c.entry_id
            self.completed.append(c.entry_id)
            self.sim.log(f"{self.name} completed {c.entry_id}")
            if not self.recovery:
                self.w.acked.append((self.sim.now, c.entry_id))
            self.bodies.pop(c.entry_id, None)
            self.sent_at.pop(c.entry_id, None)
            self.waiters.pop(c.entry_id)(c.entry_id, None)
        self.seen_lac = max(self.seen_lac, self.sm.lac)
        self._maybe_idle()

    def _check_completion(self, c: Completion) -> None:
        """Invariant 2 from outside the machine (and invariant 1 at the moment of the ack)."""
        eid, name = c.entry_id, self.name
        self.sim.check(not self.reported_failed,
                       f"{name}: entry {eid} completed during an ensemble change ({self.reported_failed})")
        self.sim.check(eid == self.seen_lac + 1,
                       f"{name}: completion {eid} out of order (LAC {self.seen_lac})")
        body = self.bodies[eid]
        self.sim.check(c.length == body.length,
                       f"{name}: completion {eid} has length {c.length} != {body.length}")
        ensemble = ensemble_at(self.view, eid)
        md = self.md
        holders = [ensemble[i] for i in write_set(eid, md.ensemble_size, md.write_quorum_size)
                   if self.w.bookies[ensemble[i]].entries.get(LEDGER_ID, {}).get(eid, None) is not None
                   and self.w.bookies[ensemble[i]].entries[LEDGER_ID][eid].data == body.data]
        self.sim.check(len(holders) >= md.ack_quorum_size,
                       f"{name}: entry {eid} completed with only {holders} of its write set holding it")

    # -- ensemble changes
    def _change_ensemble(self) -> None:
        if self.dead or self.error is not None or not self.sm.changing:
            return
        key, indexes = self.sm.change_plan()
        ensemble, exclude = list(self.sm.ensemble), set(self.sm.failed)
        if self.sm.changes >= CHANGES_MAX:
            self._fail_and_close(E_NOT_ENOUGH)
            return
        try:
            new = self.w.placement.replace(ensemble, indexes, self.w.writable(), exclude)
        except NotEnoughBookiesError:
            self.sim.log(f"{self.name}: no spare bookie to replace {sorted(exclude)}")
            self._fail_and_close(E_NOT_ENOUGH)
            return
        self.sim.log(f"{self.name} change: fragment {key} {ensemble} -> {new}")
        if self.recovery and self.w.model.recovery_fragments_at_close:
            self.deferred[key] = list(new)
            self.sim.at(self.w.md_delay(), self._changed, key, new, self.md, None)
            return
        update_async(self.w, self.name, lambda m: self._with_fragment(m, key, new),
                     lambda md, exc: self._changed(key, new, md, exc))

    def _with_fragment(self, md: LedgerMetadata, key: int, ensemble: list[str]) -> LedgerMetadata:
        if md.state is LedgerState.CLOSED or (md.state is LedgerState.IN_RECOVERY and not self.recovery):
            raise _Fenced(f"ledger is {md.state.name}")
        return transitions.set_fragment(md, key, ensemble)

    def _changed(self, key: int, new: list[str], md: LedgerMetadata | None,
                 exc: BaseException | None) -> None:
        if self.dead:
            return
        if md is None:
            self.sim.log(f"{self.name} change of fragment {key} failed: {exc!r}")
            self._fail(error_kind(exc) if exc is not None else E_METADATA)
            return
        self.md = md
        sends, completions = self.sm.apply_change(key, new)
        self.view[key] = list(new)
        self.reported_failed &= set(new)
        self._deliver(completions)
        self._send(sends)
        if self.sm.changing:
            self.sim.at(0.01, self._change_ensemble)

    # -- failure and close
    def _fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
        self.sm.abort_change()
        for eid in self.sm.drain_pending():
            self.bodies.pop(eid, None)
            self.sent_at.pop(eid, None)
            waiter = self.waiters.pop(eid, None)
            if waiter is not None:
                waiter(None, error)
        self._maybe_idle()

    def _fail_and_close(self, error: str) -> None:
        """No way forward: fail what is pending; a writer (not a recovery) closes at its LAC."""
        self._fail(error)
        if self.recovery and not self.w.model.recovery_closes_on_failure:
            return
        self._close_metadata(lambda md, exc: None)
        self.closed = True

    def _tick(self) -> None:
        """check_timeouts: every bookie that still owes an ack for an entry appended more than
        ADD_TIMEOUT ago is treated as failed (the age counts from the append, not the resend)."""
        if self.dead or self.error is not None or not self.sent_at:
            self.ticking = False
            return
        late: set[str] = set()
        for eid, t in self.sent_at.items():
            if self.sim.now - t < ADD_TIMEOUT:
                break
            late.update(self.sm.unacked(eid))
        for b in sorted(late):
            self.timeouts += 1
            self.sim.log(f"{self.name}: no ack from {b} in time")
            self._on_failure(b)
        self.sim.at(TICK, self._tick)

    def _close_metadata(self, done: MdDone) -> None:
        lac, length = self.sm.lac, self.sm.lac_length
        self.sim.log(f"{self.name} closes the ledger at {lac}")

        def finished(md: LedgerMetadata | None, exc: BaseException | None) -> None:
            if md is not None:
                self.md = md
            done(md, exc)

        update_async(self.w, self.name, lambda m: self._close_transition(m, lac, length), finished)

    def _close_transition(self, md: LedgerMetadata, lac: int, length: int) -> LedgerMetadata:
        if not (self.recovery and self.w.model.recovery_fragments_at_close):
            return transitions.close(md, lac, length)
        if md.state is not LedgerState.IN_RECOVERY:
            return md
        for key, ensemble in sorted(self.deferred.items()):
            md = transitions.set_fragment(md, key, ensemble)
        return transitions.close(md, lac, length)

    def _maybe_idle(self) -> None:
        if not self.sm.pending or self.error is not None:
            waiting, self.on_idle = self.on_idle, []
            for fn in waiting:
                fn()

    def close(self, done: MdDone, wait: float = 60.0) -> None:
        """WriteHandle.close: wait (bounded) for pending adds, fail leftovers, close at the LAC."""
        if self.closed:
            return
        state = {"fired": False}

        def go() -> None:
            if state["fired"] or self.dead:
                return
            state["fired"] = True
            if self.sm.pending and self.error is None:
                self._fail(E_TIMEOUT)
            self.closed = True
            self._close_metadata(done)

        self.on_idle.append(go)
        self.sim.at(wait, go)
        self._maybe_idle()


def ensemble_at(ensembles: dict[int, list[str]], entry_id: int) -> list[str]:
    return ensembles[max(k for k in ensembles if k <= entry_id)]


# ---------------------------------------------------------------------------------------- recovery

@dataclass
class _Attempt:
    """One LedgerRecovery.run(): callbacks of an attempt that is over are ignored (it has returned)."""

    number: int
    md: LedgerMetadata | None = None
    over: bool = False
    key: int = 0
    lacs: list[int] = field(default_factory=list)
    cov: QuorumCoverage | None = None
    start: int | None = None
    waiting: int = 0
    writer: SimWriter | None = None
    entry: int = 0                  # the next entry whose outcome decides (entry order)
    next_read: int = 0              # the next entry whose reads go out
    reads: dict[int, RecoveryReadTally] = field(default_factory=dict)      # undecided, in flight
    outcomes: dict[int, tuple[ReadOutcome, bytes | None]] = field(default_factory=dict)  # decided early
    reading_done: bool = False
    futures: deque[list[object]] = field(default_factory=deque)   # [entry id, None | OK | error]


class SimRecovery:
    """LedgerRecovery.run over the simulated network; the application retries a failed open."""

    def __init__(self, world: World, name: str, retries: int) -> None:
        self.w, self.sim, self.name, self.retries = world, world.sim, name, retries
        self.result: LedgerMetadata | None = None
        self.errors: list[str] = []
        self.fenced_at: float | None = None
        self.attempts: list[_Attempt] = []

    def start(self) -> None:
        att = _Attempt(len(self.attempts) + 1)
        self.attempts.append(att)
        self.sim.log(f"{self.name} starts (attempt {att.number})")
        update_async(self.w, self.name, transitions.begin_recovery, lambda md, exc: self._begun(att, md, exc))

    def _begun(self, att: _Attempt, md: LedgerMetadata | None, exc: BaseException | None) -> None:
        if md is None:
            self._fail(att, error_kind(exc) if exc is not None else E_METADATA, adoptable=False)
        elif md.is_closed:
            self._finish(att, md)
        else:
            att.md = md
            self._fence(att, md)

    # -- fencing
    def _fence(self, att: _Attempt, md: LedgerMetadata) -> None:
        att.key = max(md.ensembles)
        bookies = md.ensembles[att.key]
        att.cov = QuorumCoverage(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
        att.waiting = len(bookies)
        for i, b in enumerate(bookies):
            self.w.net.call(b, partial(SimBookie.read, ledger_id=LEDGER_ID, entry_id=-1, fence=True),
                            partial(self._fence_answer, att, i))

    def _fence_answer(self, att: _Attempt, index: int, reply: Reply | None) -> None:
        if att.over or att.start is not None or att.cov is None:
            return
        att.waiting -= 1
        lac: int | None = None
        if reply is not None and reply.status == OK and reply.body is not None:
            lac = reply.body.lac
        elif reply is not None and reply.status == NO_ENTRY:
            lac = -1
        if lac is not None:
            att.lacs.append(lac)
            if att.cov.add(index):
                att.start = fence_start_point(att.key, att.lacs)
                if self.fenced_at is None:
                    self.fenced_at = self.sim.now
                self.sim.log(f"{self.name} fenced (LACs {att.lacs}); recovering from {att.start + 1}")
                self._read_length(att, att.start, 0)
                return
        if att.waiting == 0:
            self._fail(att, E_UNAVAILABLE, adoptable=False)

    def _read_length(self, att: _Attempt, start: int, pos: int) -> None:
        """_entry_length: the cumulative length at `start`, from the first bookie that has it."""
        md = att.md
        assert md is not None
        if start < 0:
            self._rewrite(att, start, 0)
            return
        indexes = write_set(start, md.ensemble_size, md.write_quorum_size)
        if pos >= len(indexes):
            self._fail(att, E_READ, adoptable=False)
            return
        bookie = md.ensemble_at(start)[indexes[pos]]

        def answer(r: Reply | None) -> None:
            if att.over:
                return
            if r is not None and r.status == OK and r.body is not None:
                self._rewrite(att, start, r.body.length)
            else:
                self._read_length(att, start, pos + 1)

        self.w.net.call(bookie, lambda bk: bk.read(LEDGER_ID, start, False), answer)

    # -- read and rewrite
    def _rewrite(self, att: _Attempt, start: int, length: int) -> None:
        assert att.md is not None
        att.writer = SimWriter(self.w, att.md, f"{self.name}.w{att.number}", recovery=True,
                               lac=start, length=length)
        att.entry = att.next_read = start + 1
        self._fill_window(att)

    def _fill_window(self, att: _Attempt) -> None:
        """_read_and_rewrite: the reads of the next `recovery_read_window` entries are out at once."""
        md = att.md
        assert md is not None
        while att.next_read < att.entry + self.w.recovery_read_window:
            e = att.next_read
            att.next_read += 1
            bookies = md.ensemble_at(e)   # the ensembles recovery started with (TLA+ model)
            att.reads[e] = RecoveryReadTally(e, md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
            for i in write_set(e, md.ensemble_size, md.write_quorum_size):
                self.w.net.call(bookies[i], partial(SimBookie.read, ledger_id=LEDGER_ID, entry_id=e, fence=True),
                                partial(self._read_answer, att, e, i))

    def _read_answer(self, att: _Attempt, e: int, index: int, reply: Reply | None) -> None:
        tally = att.reads.get(e)
        if att.over or att.reading_done or tally is None:
            return
        data: bytes | None = None
        if reply is None:
            outcome = tally.on_error(index)
        elif reply.status == OK and reply.body is not None:
            outcome, data = tally.on_found(index), reply.body.data
        else:
            outcome = tally.on_absent(index)
        if outcome is ReadOutcome.PENDING:
            return
        del att.reads[e]
        att.outcomes[e] = (outcome, data)
        self._decide(att)

    def _decide(self, att: _Attempt) -> None:
        """_finish_read in entry order: an entry's outcome counts once every entry before it did."""
        while not att.over and not att.reading_done and att.entry in att.outcomes:
            e = att.entry
            outcome, data = att.outcomes.pop(e)
            if outcome is ReadOutcome.FOUND and data is not None:
                if not self._found(att, e, data):
                    return
            elif outcome is ReadOutcome.ABSENT:
                self.sim.log(f"{self.name}: entry {e} absent; recovery ends at {e - 1}")
                att.reading_done = True
                self._drain_rewrites(att)
                return
            else:
                self._fail(att, E_READ, adoptable=False)
                return
        if not att.over and not att.reading_done:
            self._fill_window(att)

    def _found(self, att: _Attempt, e: int, data: bytes) -> bool:
        writer = att.writer
        assert writer is not None
        self.sim.check(data == self.w.payloads.get(e),
                       f"{self.name}: recovery read wrong bytes for entry {e}")
        att.entry = e + 1
        slot: list[object] = [e, None]
        eid = writer.append(data, lambda _eid, err: self._rewritten(att, slot, err))
        if eid is None:   # append_async raises the handle's error
            self._fail(att, writer.error or "LedgerClosedError", adoptable=True)
            return False
        self.sim.check(eid == e, f"{self.name}: rewrote entry {e} as {eid}")
        att.futures.append(slot)
        return True

    def _rewritten(self, att: _Attempt, slot: list[object], err: str | None) -> None:
        slot[1] = err or OK
        if att.reading_done:
            self._drain_rewrites(att)

    def _drain_rewrites(self, att: _Attempt) -> None:
        """`for f in pending: f.result()` — the first failure in entry order aborts."""
        if att.over:
            return
        while att.futures and att.futures[0][1] == OK:
            att.futures.popleft()
        if att.futures:
            status = att.futures[0][1]
            if status is not None:
                self._fail(att, str(status), adoptable=True)
            return
        writer = att.writer
        assert writer is not None
        if not writer.closed:
            writer.close(lambda md, exc: self._closed(att, md, exc))

    def _closed(self, att: _Attempt, md: LedgerMetadata | None, exc: BaseException | None) -> None:
        if md is None:
            self._fail(att, error_kind(exc) if exc is not None else E_METADATA, adoptable=True)
        else:
            self._finish(att, md)

    # -- outcome
    def _finish(self, att: _Attempt, md: LedgerMetadata) -> None:
        if att.over:
            return
        att.over = True
        self.sim.check(md.is_closed, f"{self.name}: recovery returned an unclosed ledger")
        self.result = md
        self.sim.log(f"{self.name} done: closed at {md.last_entry_id}")

    def _fail(self, att: _Attempt, error: str, adoptable: bool) -> None:
        """run()'s except clause: a fenced or version error adopts a CLOSED ledger, else the open fails."""
        if att.over:
            return
        if adoptable and error in (E_FENCED, E_VERSION):
            latest, _ = self.w.store.read()
            if latest.is_closed:
                self._finish(att, latest)
                return
        att.over = True
        self.errors.append(error)
        self.sim.log(f"{self.name} attempt {att.number} failed: {error}")
        if len(self.attempts) <= self.retries:
            self.sim.at(self.sim.rng.uniform(1.0, 30.0), self.start)
