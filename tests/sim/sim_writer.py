"""The simulated writer: ``ledger_client/write_handle.py`` step for step over sim_world (see
sim_model's docstring for why a simulator), delayed ensemble changes included.

Besides driving AddState it keeps its own view (ensembles applied, bookies reported failed, the
bookies it writes on without, entries it never sent to them, the under-replication marks it made)
so the run can check invariant 2 and the delayed-change rules independently of the machine:
completions in order, LAC monotonic, none while a reported-failed bookie that is not delayed is
still in the ensemble, each completed entry really stored on ≥ Qa bookies of its write set, and
(at the end, sim_run.check_marks) every entry never sent to a delayed bookie either reached it
later or the ledger was marked under-replicated for it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sim_world import (
    ADD_TIMEOUT,
    CHANGES_MAX,
    E_FENCED,
    E_METADATA,
    E_NOT_ENOUGH,
    E_TIMEOUT,
    FENCED,
    LEDGER_ID,
    OK,
    OPERATION_TIMEOUT,
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
from ledger_client.machines import AddState, Completion, Send, write_set
from metadata import transitions
from metadata.model import LedgerMetadata, LedgerState

AddDone = Callable[[int | None, str | None], None]


class SimWriter:
    """WriteHandle over the simulated network: the same AddState calls, in the same order."""

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
        self.delayed_view: set[str] = set()         # bookies the writer decided to write on without
        self.skipped: set[tuple[int, str]] = set()  # (entry, bookie of its write set it was not sent to)
        self.seen_lac = lac
        self.on_idle: list[Callable[[], None]] = []
        self.deferred: dict[int, list[str]] = {}
        self.sent_at: dict[int, float] = {}
        self.first_sent: dict[int, float] = {}      # every entry's append time (owed acks' ages)
        self.suspect: set[str] = set()
        self.back: set[str] = set()
        self.probe_at: dict[str, float] = {}
        self.rejoined: dict[str, int] = {}
        self.stall_since: float | None = None
        self.conns: dict[str, _Connection] = {}
        self.in_flight_at_death: set[tuple[int, str]] = set()   # (entry, bookie) unanswered when it died
        self.ticking = False
        self.timeouts = 0
        self.delays = 0
        self.rejoins = 0
        # WriteHandle._debts (debts.py): after end_changes (closing, or a recovery's rewrites all
        # completed) a failure replaces no bookie; a recovery's marks wait for its close.
        self.debts: set[str] = set()
        self.changes_ended = False
        self.ledger_closed = False
        self.forgotten = False   # the client's ticker let it go (its close failed)

    # -- adds
    def append(self, data: bytes, done: AddDone) -> int | None:
        """append_async: None (and no effect) when the handle already failed or closed."""
        if self.error is not None or self.closed:
            return None
        eid, length, bookies = self.sm.append(len(data))
        sends = [Send(eid, -1, b) for b in bookies]  # the position only matters for resends
        ensemble = self.view[max(self.view)]
        for i in write_set(eid, self.sm.e, self.sm.qw):
            if ensemble[i] not in bookies:
                self.skipped.add((eid, ensemble[i]))
        self.bodies[eid] = Body(eid, self.sm.lac, length, data)
        self.waiters[eid] = done
        self.sim.log(f"{self.name} append {eid} -> {[s.bookie for s in sends]}")
        self.sent_at[eid] = self.first_sent[eid] = self.sim.now
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
            conn = self.conns.setdefault(s.bookie, _Connection())
            seq = conn.send(s.entry_id)
            self.w.net.call(s.bookie, add, partial(self._on_answer, s.bookie, conn.epoch, seq))

    def _on_answer(self, bookie: str, epoch: int, seq: int, reply: Reply | None) -> None:
        """The transport: one connection per bookie delivers its answers in the order the adds
        were sent, and a failure breaks it, failing every add still outstanding on it (the next
        add opens a new one). AddState.on_acks relies on that order."""
        conn = self.conns[bookie]
        for entry_id, answer in conn.answered(epoch, seq, reply):
            self._on_reply(bookie, entry_id, answer)

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
            if self.changes_ended:   # WriteHandle._on_status: closed or closing, one more entry missed
                self._on_failure(bookie)
            else:
                self._fail(E_FENCED)

    def _on_failure(self, bookie: str) -> None:
        if self.changes_ended:   # WriteHandle._note_failure with Debts.ended
            if self.sm.write_off(bookie):
                self.sim.log(f"{self.name}: {bookie} failed owing entries")
                self._mark({bookie})
            return
        if self.error is not None:
            return
        self.suspect.add(bookie)
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
        changing = self.reported_failed - self.delayed_view
        self.sim.check(not changing, f"{name}: entry {eid} completed during an ensemble change ({changing})")
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
        if self.dead or self.error is not None or not self.sm.changing or self.changes_ended:
            return
        key, indexes = self.sm.change_plan()
        ensemble = list(self.sm.ensemble)
        planned = {ensemble[i] for i in indexes}
        back, self.back = self.back & self.sm.delayed, set()
        if self.sm.changes >= CHANGES_MAX:
            self._fail_and_close(E_NOT_ENOUGH)
            return
        exclude, delayed = planned | self.suspect, set()
        try:
            new = self.w.placement.replace(ensemble, indexes, self.w.writable(), exclude)
        except NotEnoughBookiesError:
            if self.recovery:   # a recovery's rewrites never delay (WriteHandle._may_delay)
                self.sim.log(f"{self.name}: no spare bookie to replace {sorted(planned)}")
                self._fail_and_close(E_NOT_ENOUGH)
                return
            new, left = self.w.placement.replace_available(ensemble, indexes, self.w.writable(), exclude, back)
            delayed = {ensemble[i] for i in left} - back
            if len(left) == len(indexes) and not back:
                self._delay(planned)
                return
        self.sim.log(f"{self.name} change: fragment {key} {ensemble} -> {new} (back {sorted(back - delayed)}, "
                     f"delayed {sorted(delayed)})")
        if self.recovery and self.w.model.recovery_fragments_at_close:
            self.deferred[key] = list(new)
            self.sim.at(self.w.md_delay(), self._changed, key, new, delayed, back, self.md, None)
            return
        update_async(self.w, self.name, lambda m: self._with_fragment(m, key, new),
                     lambda md, exc: self._changed(key, new, delayed, back, md, exc))

    def _delay(self, planned: set[str]) -> None:
        self.sim.log(f"{self.name}: no spare for {sorted(planned)}: writing on without them")
        self.delays += 1
        self.delayed_view |= planned
        self._note_delayed(planned)
        completions = self.sm.delay_change()
        self._mark(self.sm.take_short())   # WriteHandle._delay: owed entries of finished fragments
        self._deliver(completions)
        if self.sm.changing:
            self.sim.at(0.01, self._change_ensemble)

    def _with_fragment(self, md: LedgerMetadata, key: int, ensemble: list[str]) -> LedgerMetadata:
        if md.state is LedgerState.CLOSED or (md.state is LedgerState.IN_RECOVERY and not self.recovery):
            raise _Fenced(f"ledger is {md.state.name}")
        return transitions.set_fragment(md, key, ensemble)

    def _changed(self, key: int, new: list[str], delayed: set[str], back: set[str], md: LedgerMetadata | None,
                 exc: BaseException | None) -> None:
        if self.dead:
            return
        if md is None:
            self.sim.log(f"{self.name} change of fragment {key} failed: {exc!r}")
            self._fail(error_kind(exc) if exc is not None else E_METADATA)
            return
        self.md = md
        if self.error is not None:   # WriteHandle._changed: failed meanwhile
            return
        sends, completions = self.sm.apply_change(key, new, delayed)
        self.view[key] = list(new)
        self.reported_failed = (self.reported_failed & set(new)) - (back - delayed)
        self.delayed_view = set(delayed)
        self.rejoins += len(back - delayed)
        for b in back - delayed:
            self.rejoined[b] = self.rejoined.get(b, 0) + 1
        self._note_delayed(delayed)
        self._mark(self.sm.take_short())
        self._send(sends)   # before the completions drop their bodies (WriteHandle._changed sends under the lock)
        self._deliver(completions)
        if self.sm.changing:
            self.sim.at(0.01, self._change_ensemble)

    def _note_delayed(self, delayed: set[str]) -> None:
        """WriteHandle._note_delayed: a delayed bookie is probed from 1 s on (2, 4 ... up to 60 s
        for one taken back before that failed again)."""
        for b in delayed:
            self.probe_at.setdefault(b, self.sim.now + min(60.0, 2.0 ** self.rejoined.get(b, 0)))
        for b in list(self.probe_at):
            if b not in self.sm.delayed and b not in self.suspect:
                del self.probe_at[b]

    def _mark(self, short: set[str]) -> None:
        if short and self.recovery and not self.ledger_closed:   # Debts.short
            self.debts |= short
            return
        if short:
            self.sim.log(f"{self.name} marks the ledger under-replicated for {sorted(short)}")
            self.w.marks |= short

    def end_changes(self) -> None:
        """WriteHandle.end_changes; the client's ticker watches the owed acks."""
        self.changes_ended = True
        if not self.ticking:
            self.ticking = True
            self.sim.at(TICK, self._tick)

    def closed_with_debts(self) -> None:
        """WriteHandle.closed_with_debts: mark for the bookies short of entries so far."""
        self.ledger_closed = True
        short, self.debts = self.debts | self.sm.finish(), set()
        self._mark(short)

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
        self._mark(self.sm.finish())
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
        ADD_TIMEOUT ago is treated as failed (the age counts from the append, not the resend),
        pending or completed without it; a delayed change is retried; a write stalled for lack
        of bookies fails after OPERATION_TIMEOUT."""
        if self.dead or self.forgotten or (self.error is not None and not self.changes_ended) or not (
                self.sent_at or (self.changes_ended and self.sm.owed)):
            self.ticking = False
            return
        now, sm = self.sim.now, self.sm
        late: set[str] = set()
        for eid, t in self.sent_at.items():
            if now - t < ADD_TIMEOUT:
                break
            late.update(sm.unacked(eid))
        late.update(b for b, (eid, _) in sm.owed.items() if now - self.first_sent[eid] >= ADD_TIMEOUT)
        for b in sorted(late - sm.failed - sm.delayed):
            self.timeouts += 1
            self.sim.log(f"{self.name}: no ack from {b} in time")
            self._on_failure(b)
        if self.error is None and sm.pending and sm.quorum_lost:
            self.stall_since = now if self.stall_since is None else self.stall_since
            if not sm.changing and now - self.stall_since >= OPERATION_TIMEOUT:
                self.sim.log(f"{self.name}: stalled for lack of bookies")
                self._fail_and_close(E_NOT_ENOUGH)
        else:
            self.stall_since = None
        if self.error is None and sm.delayed and not sm.changing:
            self._try_rejoin()
        self.sim.at(TICK, self._tick)

    def _try_rejoin(self) -> None:
        """WriteHandle._try_rejoin: a spare registered (a suspect one must answer), or a delayed
        bookie answers again (a probe: is it up?)."""
        writable = [n.bookie_id for n in self.w.writable()]
        ensemble = self.sm.ensemble
        answers = self.w.bookies

        def ok(b: str) -> bool:   # WriteHandle._answers: probed at most once a second, backing off
            if self.sim.now < self.probe_at.get(b, 0.0):
                return False
            if answers[b].up:
                self.suspect.discard(b)
                return True
            self.probe_at[b] = self.sim.now + 1.0
            return False

        spare = any(b not in ensemble and (b not in self.suspect or ok(b)) for b in writable)
        back = set() if spare else {b for b in self.sm.delayed if b in writable and ok(b)}
        if (spare or back) and self.sm.begin_change():
            self.back = back
            self.sim.at(0.01, self._change_ensemble)

    def _close_metadata(self, done: MdDone) -> None:
        lac, length = self.sm.lac, self.sm.lac_length
        self.sim.log(f"{self.name} closes the ledger at {lac}")

        def finished(md: LedgerMetadata | None, exc: BaseException | None) -> None:
            if md is not None:
                self.md = md
                self.closed_with_debts()
            else:
                self.forgotten = True
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
            self.end_changes()
            self._close_metadata(done)

        self.on_idle.append(go)
        self.sim.at(wait, go)
        self._maybe_idle()


def ensemble_at(ensembles: dict[int, list[str]], entry_id: int) -> list[str]:
    return ensembles[max(k for k in ensembles if k <= entry_id)]


class _Connection:
    """A writer's connection to one bookie, as the transport's: answers in send order."""

    def __init__(self) -> None:
        self.epoch = 0
        self.next_seq = 0
        self.sent: dict[int, int] = {}                      # seq -> entry id, outstanding
        self.early: dict[int, Reply | None] = {}            # answers that came before an older one's

    def send(self, entry_id: int) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.sent[seq] = entry_id
        return seq

    def answered(self, epoch: int, seq: int, reply: Reply | None) -> list[tuple[int, Reply | None]]:
        """What the writer hears now, in order: nothing for an answer on a connection that broke
        since; the failure of every outstanding add when the answer released is a failure."""
        if epoch != self.epoch:
            return []
        self.early[seq] = reply
        out: list[tuple[int, Reply | None]] = []
        while self.sent and (first := min(self.sent)) in self.early:
            answer = self.early.pop(first)
            entry_id = self.sent.pop(first)
            if answer is None:
                out.append((entry_id, None))
                out.extend((e, None) for _, e in sorted(self.sent.items()))
                self.epoch, self.sent, self.early = self.epoch + 1, {}, {}
                break
            out.append((entry_id, answer))
        return out
