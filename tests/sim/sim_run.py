"""One simulated run: the random schedule, the run itself (writer, crashes, competing recoveries,
a final clean recovery) and the invariant checks at its end. The simulated client (writer and
recovery) is sim_model, the world it runs in sim_world; see sim_model's docstring for why.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from random import Random

from sim_model import SimRecovery, SimWriter
from sim_world import (
    CURRENT,
    EARLY_FRAGMENTS,
    LEDGER_ID,
    OK,
    ClientModel,
    Faults,
    Sim,
    World,
)

from metadata.model import DigestType, LedgerMetadata

# ---------------------------------------------------------------------------------------- schedules

# A schedule's recovery read window: one at a time, a few, and the client's default (all of a
# short ledger's tail at once).
RECOVERY_READ_WINDOWS = (1, 3, 64)

@dataclass
class Schedule:
    """Everything random about one run except the message-level coin flips (same rng, drawn first)."""

    seed: int
    ensemble: int
    qw: int
    qa: int
    bookies: int
    entries: int
    window: int
    gap: float
    faults: Faults
    stale_registry: float
    crashes: list[tuple[float, int, float | None]]   # (time, bookie index, downtime; None = until the end)
    recoveries: list[float]
    writer_dies_at: float | None
    writer_closes: bool
    recovery_read_window: int = 64

    @classmethod
    def draw(cls, seed: int, rng: Random) -> Schedule:
        e = rng.randint(3, 5)
        qw = rng.randint(1, e) if rng.random() < 0.2 else rng.randint(max(1, e - 2), e)
        qa = rng.randint(1, qw)
        entries = rng.choice([0, 1, 2, rng.randint(3, 12), rng.randint(10, 40), rng.randint(10, 40),
                              rng.randint(40, 100)])
        gap = rng.uniform(0.1, 2.0)
        horizon = max(5.0, entries * gap)
        faults = Faults(drop=rng.choice([0.0, 0.01, 0.03, 0.08, rng.uniform(0.0, 0.2)]),
                        delay_max=rng.uniform(0.2, 3.0), slow=rng.choice([0.0, 0.05, 0.2]))
        crashes: list[tuple[float, int, float | None]] = []
        n_bookies = rng.randint(max(5, e), 7)
        for _ in range(rng.choice([0, 1, 2, 3, rng.randint(3, 8)])):
            down = None if rng.random() < 0.25 else rng.uniform(1.0, horizon)
            crashes.append((rng.uniform(0.0, horizon * 1.2), rng.randrange(n_bookies), down))
        recoveries = [rng.uniform(0.0, horizon * 1.3) for _ in range(rng.choice([0, 1, 2, 2, 3]))]
        dies = rng.uniform(0.0, horizon) if rng.random() < 0.25 else None
        schedule = cls(seed, e, qw, qa, n_bookies, entries, rng.randint(1, 12), gap, faults,
                       rng.choice([0.0, 0.3]), crashes, recoveries, dies, rng.random() < 0.7)
        if rng.random() < 0.4:
            schedule._storm(rng, horizon)
        # from the seed, not the rng: the regression seeds keep the schedules they were found with
        schedule.recovery_read_window = RECOVERY_READ_WINDOWS[seed % len(RECOVERY_READ_WINDOWS)]
        return schedule

    def _storm(self, rng: Random, horizon: float) -> None:
        """Recovery storm: the writer dies mid-stream, then recoveries race through faults.

        Interleavings of one recovery's ensemble change with another recovery (or a retry) are
        where recovery protocols break; uniform schedules reach them rarely.
        """
        if self.entries < 10:
            self.entries = rng.randint(10, 60)
            horizon = self.entries * self.gap
        self.writer_dies_at = dies = horizon * rng.uniform(0.5, 1.0)
        self.recoveries = [dies + rng.uniform(0.0, 30.0) for _ in range(rng.randint(2, 3))]
        self.faults.drop = max(self.faults.drop, rng.uniform(0.02, 0.12))
        for _ in range(rng.randint(1, 3)):
            self.crashes.append((dies + rng.uniform(0.0, 40.0), rng.randrange(self.bookies),
                                 rng.uniform(3.0, 30.0)))

    def without_spares(self) -> Schedule:
        """The same schedule on exactly E bookies: every crash of one leaves no spare, so the writer
        delays its ensemble changes (and recoveries run out of bookies)."""
        self.bookies = self.ensemble
        self.crashes = [(t, i % self.bookies, down) for t, i, down in self.crashes]
        return self

    def describe(self) -> str:
        f = self.faults
        return (f"E={self.ensemble} Qw={self.qw} Qa={self.qa} bookies={self.bookies} entries={self.entries} "
                f"window={self.window} drop={f.drop:.3f} delay<={f.delay_max:.2f} slow={f.slow} "
                f"crashes={[(round(t, 1), i, d if d is None else round(d, 1)) for t, i, d in self.crashes]} "
                f"recoveries={[round(t, 1) for t in self.recoveries]} writer_dies_at="
                f"{None if self.writer_dies_at is None else round(self.writer_dies_at, 1)} "
                f"writer_closes={self.writer_closes}")


# ---------------------------------------------------------------------------------------- one run

MAX_EVENTS = 300_000


@dataclass
class Outcome:
    """What a run did, so the test can show the schedules really exercised the protocol."""

    seed: int
    acked: int
    closed_at: int
    recoveries_done: int
    recovery_failures: int
    writer_error: str | None
    changes: int
    md_versions: int
    events: int
    final_recovery: bool
    trace: tuple[str, ...] = ()
    delays: int = 0          # ensemble changes the writer delayed for want of a spare
    rejoins: int = 0         # delayed bookies it took back with their id


class SimulationFailure(AssertionError):
    """A run broke an invariant (or the machines raised): carries the seed and the trace tail."""


def run_schedule(seed: int, model: ClientModel = CURRENT, trace_len: int = 80, no_spare: bool = False) -> Outcome:
    """Run the schedule drawn from `seed` and check invariants 1–5; replayable from the seed alone
    (and ``no_spare``: the schedule on exactly E bookies)."""
    rng = Random(seed)
    schedule = Schedule.draw(seed, rng)
    if no_spare:
        schedule.without_spares()
    sim = Sim(rng, trace_len)
    try:
        return _run(sim, schedule, model)
    except Exception as e:  # noqa: BLE001 - any failure is reported with its seed and trace
        trace = "\n    ".join(sim.trace)
        raise SimulationFailure(
            f"seed {seed}: {type(e).__name__}: {e}\n  schedule: {schedule.describe()}\n"
            f"  replay: SPARK_BOOKIE_SIM_SEED={seed}{_model_env(model)} "
            ".venv/bin/pytest tests/sim -k replay -s\n"
            f"  trace (last events):\n    {trace}"
        ) from e


def _model_env(model: ClientModel) -> str:
    return " SPARK_BOOKIE_SIM_MODEL=early" if model == EARLY_FRAGMENTS else ""


def _run(sim: Sim, sch: Schedule, model: ClientModel) -> Outcome:
    names = [f"b{i}" for i in range(sch.bookies)]
    md = LedgerMetadata.new_open(LEDGER_ID, sim.rng.sample(names, sch.ensemble), write_quorum_size=sch.qw,
                                 ack_quorum_size=sch.qa, digest_type=DigestType.CRC32C, password=b"sim",
                                 ctime=0)
    world = World(sim, names, sch.faults, md, sch.stale_registry, model)
    world.recovery_read_window = sch.recovery_read_window
    writer = SimWriter(world, md, "writer")
    _drive_writer(world, writer, sch)
    for t, i, down in sch.crashes:
        sim.at(t, _crash, world, names[i], down)
    recoveries = [SimRecovery(world, f"rec{i}", retries=2) for i in range(len(sch.recoveries))]
    for r, t in zip(recoveries, sch.recoveries, strict=True):
        sim.at(t, r.start)
    if sch.writer_dies_at is not None:
        sim.at(sch.writer_dies_at, _kill, writer)
    sim.run(MAX_EVENTS)
    final = _final_recovery(world)
    if final is not None:
        recoveries.append(final)
    check_final(world, recoveries)
    check_marks(world, writer)
    return Outcome(sch.seed, len(world.acked), world.store.md.last_entry_id,
                   sum(r.result is not None for r in recoveries), sum(len(r.errors) for r in recoveries),
                   writer.error, writer.sm.changes, len(world.store.history), sim.events, final is not None,
                   tuple(sim.trace), writer.delays, writer.rejoins)


def _drive_writer(world: World, writer: SimWriter, sch: Schedule) -> None:
    """The application: append `entries` payloads with a bounded window, then maybe close."""
    sim, appended = world.sim, [0]

    def step() -> None:
        if writer.dead or writer.closed:
            return
        if writer.error is not None or appended[0] >= sch.entries:
            if sch.writer_closes:
                writer.close(lambda md, exc: sim.log("writer closed" if md else f"writer close: {exc!r}"))
            return
        if writer.sm.outstanding < sch.window:
            data = sim.rng.randbytes(sim.rng.randint(1, 48))
            eid = writer.append(data, lambda eid, err: None)
            if eid is not None:
                world.payloads[eid] = data
                appended[0] += 1
        sim.at(sim.rng.expovariate(1.0 / sch.gap), step)

    sim.at(0.0, step)


def _crash(world: World, name: str, down: float | None) -> None:
    world.sim.log(f"CRASH {name}" + ("" if down is None else f" for {down:.1f}"))
    world.bookies[name].crash(world.sim.rng)
    if down is not None:
        world.sim.at(down, _restart, world, name)


def _restart(world: World, name: str) -> None:
    world.sim.log(f"RESTART {name}")
    world.bookies[name].restart()


def _kill(writer: SimWriter) -> None:
    writer.sim.log("the writer's process dies")
    writer.dead = True
    writer.in_flight_at_death = {(e, b) for b, conn in writer.conns.items() for e in conn.sent.values()}


def _final_recovery(world: World) -> SimRecovery | None:
    """Heal everything and, if the ledger is still open, recover it once more: it must succeed."""
    sim = world.sim
    for b in world.bookies.values():
        b.restart()
    world.faults.drop, world.faults.slow, world.stale_registry = 0.0, 0.0, 0.0
    sim.log("--- healed: final recovery ---")
    if world.store.md.is_closed:
        return None
    final = SimRecovery(world, "final", retries=0)
    final.start()
    sim.run(MAX_EVENTS)
    sim.check(final.result is not None,
              f"a recovery with all bookies up and no faults failed: {final.errors}")
    return final


def check_final(world: World, recoveries: list[SimRecovery]) -> None:
    """Invariants 1–4 on the end state (5 and most of 2 were checked as they happened)."""
    sim, md = world.sim, world.store.md
    sim.check(md.is_closed, "the ledger is not closed at the end")
    last = md.last_entry_id
    acked = [e for _, e in world.acked]
    sim.check(acked == list(range(len(acked))), f"writer completions not 0,1,2,...: {acked[:20]}")
    for r in recoveries:
        if r.fenced_at is not None:
            late = [e for t, e in world.acked if t > r.fenced_at and e > last]
            sim.check(not late, f"invariant 3: entries {late} acknowledged after {r.name} fenced, "
                                f"beyond the closed end {last}")
    sim.check(not acked or acked[-1] <= last,
              f"invariant 4: entry {acked[-1] if acked else None} was acknowledged, "
              f"the ledger closed at {last}")
    for e in range(last + 1):
        check_entry(world, md, e, acknowledged=e < len(acked))
    sim.check(md.length == sum(len(world.payloads[e]) for e in range(last + 1)),
              f"closed length {md.length} is not the sum of entries 0..{last}")
    for r in recoveries:
        if r.result is not None:
            sim.check((r.result.last_entry_id, r.result.length) == (last, md.length),
                      f"invariant 4: {r.name} closed at {r.result.last_entry_id}, the ledger at {last}")
    for v in world.store.history:
        keys = list(v.ensembles)
        sim.check(all(a < b for a, b in itertools.pairwise(keys)), f"invariant 5: keys {keys}")


def check_entry(world: World, md: LedgerMetadata, e: int, acknowledged: bool) -> None:
    """Invariant 1: entry `e` of the closed ledger reads back byte for byte from its write set.

    An entry the writer saw acknowledged must be on ≥ Qa bookies of that write set (no disk is lost
    in this model, so fewer copies means a loss of fewer than Qa disks could lose it). An entry that
    was never acknowledged but lies within the closed end must be readable (≥ 1 copy).
    """
    sim = world.sim
    sim.check(e in world.payloads, f"entry {e} is in the closed ledger but was never appended")
    ensemble = md.ensemble_at(e)
    copies: list[str] = []
    for i in md.write_set(e):
        reply = world.bookies[ensemble[i]].read(LEDGER_ID, e, False)
        if reply.status == OK and reply.body is not None:
            sim.check(reply.body.data == world.payloads[e],
                      f"invariant 1: entry {e} on {ensemble[i]} differs")
            copies.append(ensemble[i])
    where = f"write set {[ensemble[i] for i in md.write_set(e)]} of fragment {ensemble}"
    sim.check(copies,
              f"invariant 1: entry {e} (closed end {md.last_entry_id}) is on no bookie of its {where}")
    if acknowledged:
        sim.check(len(copies) >= md.ack_quorum_size,
                  f"invariant 1: acknowledged entry {e} is on only {copies} (< Qa={md.ack_quorum_size}) "
                  f"of its {where}")


def check_marks(world: World, writer: SimWriter) -> None:
    """Delayed ensemble changes leave no silent gap: an entry of the closed ledger that the writer
    never sent to a bookie of its write set (delayed: no spare) is on that bookie (taken back and
    resent, or rewritten by a recovery), or the writer marked the ledger under-replicated for it.
    A writer that never finishes its last fragment (its process died, or it stopped writing
    without closing and the ledger was recovered) marks nothing for it: the auditor's periodic
    check (the first and last entry of each bookie of a fragment) is left to find those gaps, so
    that fragment is not checked then. Nor is an entry the writer did send the bookie in the end
    (it took the bookie back and resent it) and was still waiting for that bookie's answer when
    its process died: an ack owed at a writer's death is the auditor's to find, in any fragment,
    as in BookKeeper (seed 69487483: the writer finished the entry's fragment at Qa acks and died
    before the add timeout would have failed the bookie that owed it)."""
    sim, md = world.sim, world.store.md
    abandoned = writer.dead or (not writer.closed and writer.error is None)
    for e, b in sorted(writer.skipped):
        if e > md.last_entry_id or (abandoned and e >= writer.sm.last_key):
            continue
        if writer.dead and (e, b) in writer.in_flight_at_death:
            continue
        ensemble = md.ensemble_at(e)
        if b not in [ensemble[i] for i in md.write_set(e)]:
            continue
        holds = world.bookies[b].entries.get(LEDGER_ID, {}).get(e) is not None
        sim.check(holds or b in world.marks,
                  f"entry {e} was never sent to {b} (written on without it) and the ledger was not marked "
                  f"under-replicated for it (marks {sorted(world.marks)})")
