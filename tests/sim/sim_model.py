"""A seeded, single-threaded simulation of the replication protocol (DESIGN §5, invariants 1–5).

Why a simulator: the protocol's decisions live in pure state machines (``ledger_client.machines``)
and pure metadata transitions (``metadata.transitions``); the real client drives them over gRPC and
ZooKeeper, where the interleavings that break protocols (a fence racing an ack, two recoveries
racing an ensemble change) are rare and unrepeatable. Here the same machines are driven, step for
step as ``ledger_client/write_handle.py`` and ``ledger_client/recovery.py`` drive them, over an
in-memory network with crashes, restarts, drops and delays, all chosen by one ``random.Random(seed)``
so any failing schedule replays exactly from its seed.

Model (the world it runs in -- bookies, network, metadata store, event loop -- is sim_world):
- ``SimWriter`` (sim_writer) = WriteHandle (including its ticker: add timeouts, delayed ensemble
  changes retried, stalled writes failed), ``SimRecovery`` = LedgerRecovery
  (an application retrying a failed open), ``sim_world.ClientModel`` = the recovery-handle choices
  that differ from BookKeeper, ``sim_run.run_schedule`` = one run, a final clean recovery,
  the invariant checks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial

from sim_world import (
    E_FENCED,
    E_METADATA,
    E_READ,
    E_UNAVAILABLE,
    E_VERSION,
    LEDGER_ID,
    NO_ENTRY,
    OK,
    Reply,
    SimBookie,
    World,
    error_kind,
    update_async,
)
from sim_writer import SimWriter

from ledger_client.machines import QuorumCoverage, ReadOutcome, RecoveryReadTally, fence_start_point, write_set
from metadata import transitions
from metadata.model import LedgerMetadata

__all__ = ["SimRecovery", "SimWriter"]

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
            writer.end_changes()
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
