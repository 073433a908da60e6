"""The simulated world the protocol runs in (see sim_model, which drives the client's machines
through it): a seeded event loop, bookies with journals, a network that drops, delays and resets,
and a versioned metadata store with CAS. Everything is chosen by one ``random.Random(seed)``.

- ``SimBookie``: entries per ledger, a fenced flag, a journal: an add is acked and a fencing read
  answered only once journaled, a crash loses a suffix of what was not (never what was answered)
  and every request and reply in flight on its connections; a restart keeps the rest.
- ``Network``: every request gets exactly one outcome at its sender — a reply, or ``None`` (dropped,
  timed out, connection reset), which the client treats as the real one treats a failed call.
- ``MetadataStore``: versioned ``LedgerMetadata`` with CAS and the full history of versions; every
  change goes through ``update_async``, the event-driven twin of ``metadata.update.update_ledger``
  (read, transition, CAS later, re-read on a lost race), so races between parties really happen.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from random import Random

from ledger_client.placement import BookieNode, EnsemblePlacement
from metadata import transitions
from metadata.errors import BadVersionError, LedgerClosedConflict, MetadataUpdateConflictError
from metadata.model import LedgerMetadata, LedgerState

LEDGER_ID = 1
OK, FENCED, NO_ENTRY = "OK", "FENCED", "NO_ENTRY"
CHANGES_MAX = 32            # ClientConfig.ensemble_changes_max
ADD_TIMEOUT = 10.0          # ClientConfig.add_timeout_ms, in simulated time
TICK = 0.5                  # the client's ticker period (check_timeouts)
OPERATION_TIMEOUT = 60.0    # ClientConfig.operation_timeout_ms: a write stalled for lack of bookies fails
METADATA_RETRIES_MAX = 20   # update_ledger's retries_max

# Client-side error kinds (the real client's exception classes, as plain names).
E_FENCED = "LedgerFencedError"
E_VERSION = "MetadataVersionError"
E_METADATA = "MetadataServiceError"
E_NOT_ENOUGH = "NotEnoughBookiesError"
E_READ = "ReadError"
E_UNAVAILABLE = "BookieUnavailableError"
E_TIMEOUT = "LedgerTimeoutError"


@dataclass(frozen=True)
class ClientModel:
    """Where a recovery's write handle could differ from BookKeeper's: each switch is one choice.

    - recovery_closes_on_failure: a recovery's write handle that runs out of spare bookies closes
      the ledger at its own LAC, below entries the writer may have had acknowledged. The first cut
      of WriteHandle._fail_and_close did; it no longer does (BookKeeper's
      handleUnrecoverableErrorDuringAdd: never close a ledger IN_RECOVERY, "we may lose entry").
    - recovery_fragments_at_close: a recovery's ensemble changes are kept local and written in the
      same CAS as the close (BookKeeper's ReadOnlyLedgerHandle: newEnsemblesFromRecovery, written by
      closeRecovered), instead of being CAS'd into the IN_RECOVERY metadata as they happen
      (WriteHandle._with_fragment today).

    ``CURRENT`` is what ledger_client/write_handle.py does (since bug B was fixed, BookKeeper's
    choice); ``EARLY_FRAGMENTS`` is the client before that fix, kept to prove the sweep catches it.
    """

    recovery_closes_on_failure: bool = False
    recovery_fragments_at_close: bool = False


BOOKKEEPER = ClientModel(recovery_closes_on_failure=False, recovery_fragments_at_close=True)
CURRENT = BOOKKEEPER
EARLY_FRAGMENTS = ClientModel(recovery_closes_on_failure=False, recovery_fragments_at_close=False)


class Violation(AssertionError):
    """An invariant of DESIGN §5 (or of the simulator's own bookkeeping) did not hold."""


class _Fenced(Exception):
    """Raised inside a metadata transition: the writer's ``_with_fragment`` found it taken over."""


def error_kind(exc: BaseException) -> str:
    """The client error a metadata failure becomes (client.metadata_errors + the handles' wrapping)."""
    if isinstance(exc, _Fenced):
        return E_FENCED
    if isinstance(exc, (LedgerClosedConflict, MetadataUpdateConflictError, BadVersionError)):
        return E_VERSION
    return E_METADATA


@dataclass(frozen=True, slots=True)
class Body:
    """A framed entry: what the real client's Digester.frame puts on the wire (digest aside)."""

    entry_id: int
    lac: int
    length: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    status: str
    body: Body | None = None


# ---------------------------------------------------------------------------------------- event loop

class Sim:
    """Discrete-event loop: one clock, one heap, one rng, and a bounded trace for failure reports."""

    def __init__(self, rng: Random, trace_len: int = 80) -> None:
        self.rng = rng
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[object, ...]]] = []
        self._seq = itertools.count()
        self.trace: deque[str] = deque(maxlen=trace_len)
        self.events = 0

    def at(self, delay: float, fn: Callable[..., None], *args: object) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), fn, args))

    def log(self, msg: str) -> None:
        self.trace.append(f"t={self.now:8.2f} {msg}")

    def check(self, cond: object, msg: str) -> None:
        if not cond:
            self.log(f"VIOLATION {msg}")
            raise Violation(msg)

    def run(self, max_events: int) -> None:
        """Run until nothing is scheduled; a run that never settles is itself a failure (livelock)."""
        while self._heap:
            self.events += 1
            self.check(self.events <= max_events, f"no quiescence after {max_events} events (livelock?)")
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)


# ---------------------------------------------------------------------------------------- bookies, network

class SimBookie:
    """A bookie's observable behaviour (spark_bookie/processor.py's rules), with a journal.

    Changes (an add, a fence) reach storage at once, so reads may see them, but they are durable
    only once the journal is synced; an add is acked and a fencing read answered only after that.
    A crash loses a random suffix of what was not yet synced (the journal is replayed as a prefix),
    never anything that was acknowledged or answered.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.up = True
        self.incarnation = 0
        self.entries: dict[int, dict[int, Body]] = {}
        self.fenced: set[int] = set()
        self.journal_seq = 0
        self._unsynced: list[tuple[int, Callable[[], None]]] = []   # (seq, undo), oldest first

    def _journal(self, undo: Callable[[], None]) -> None:
        self.journal_seq += 1
        self._unsynced.append((self.journal_seq, undo))

    def sync(self, seq: int) -> None:
        """Group commit: everything journaled up to `seq` is on disk."""
        self._unsynced = [(s, u) for s, u in self._unsynced if s > seq]

    def crash(self, rng: Random) -> None:
        keep = rng.randint(0, len(self._unsynced))
        for _, undo in reversed(self._unsynced[keep:]):
            undo()
        self._unsynced.clear()
        self.up = False
        self.incarnation += 1

    def restart(self) -> None:
        if not self.up:
            self.up = True
            self.incarnation += 1

    def add(self, ledger_id: int, body: Body, recovery: bool) -> Reply:
        """A normal add is refused once fenced; a RECOVERY add is always taken (BookKeeper's rule)."""
        if ledger_id in self.fenced and not recovery:
            return Reply(FENCED)
        stored = self.entries.setdefault(ledger_id, {})
        previous = stored.get(body.entry_id)
        stored[body.entry_id] = body

        def undo() -> None:
            if previous is None:
                stored.pop(body.entry_id, None)
            else:
                stored[body.entry_id] = previous

        self._journal(undo)
        return Reply(OK)

    def read(self, ledger_id: int, entry_id: int, fence: bool) -> Reply:
        """Entry -1 is the highest stored entry; a fencing read is journaled before it is answered."""
        if fence:
            was_fenced = ledger_id in self.fenced
            self.fenced.add(ledger_id)
            self._journal(lambda: None if was_fenced else self.fenced.discard(ledger_id))
        stored = self.entries.get(ledger_id, {})
        if entry_id == -1:
            return Reply(OK, stored[max(stored)]) if stored else Reply(NO_ENTRY)
        body = stored.get(entry_id)
        return Reply(OK, body) if body is not None else Reply(NO_ENTRY)


@dataclass
class Faults:
    drop: float = 0.0           # chance that a request, and separately its reply, is lost
    delay_max: float = 2.0      # uniform network delay per hop
    slow: float = 0.05          # chance of a hop 10x slower (reordering)
    timeout: float = 12.0       # how long a client waits before treating a lost message as failed
    fsync_max: float = 0.5      # journal sync latency of a bookie
    md_delay_max: float = 1.5   # metadata store latency per read or write


class Network:
    """Request/response over lossy, reordering links; a crash resets the bookie's connections."""

    def __init__(self, sim: Sim, bookies: dict[str, SimBookie], faults: Faults) -> None:
        self.sim, self.bookies, self.faults = sim, bookies, faults

    def delay(self) -> float:
        d = self.sim.rng.uniform(0.05, self.faults.delay_max)
        return d * 10 if self.sim.rng.random() < self.faults.slow else d

    def call(self, bookie: str, op: Callable[[SimBookie], Reply],
             on_reply: Callable[[Reply | None], None]) -> None:
        b = self.bookies[bookie]
        if not b.up:
            self.sim.at(self.delay(), on_reply, None)   # connection refused
            return
        if self.sim.rng.random() < self.faults.drop:
            self.sim.at(self.faults.timeout, on_reply, None)
            return
        self.sim.at(self.delay(), self._deliver, b, b.incarnation, op, on_reply)

    def _deliver(self, b: SimBookie, incarnation: int, op: Callable[[SimBookie], Reply],
                 on_reply: Callable[[Reply | None], None]) -> None:
        if not b.up or b.incarnation != incarnation:
            self.sim.at(self.delay(), on_reply, None)   # the crash reset the connection
            return
        seq = b.journal_seq
        reply = op(b)
        if b.journal_seq == seq:
            self._send_reply(b, reply, on_reply)
        else:   # answered only once the journal holds the change
            self.sim.at(self.sim.rng.uniform(0.0, self.faults.fsync_max), self._synced, b, incarnation,
                        b.journal_seq, reply, on_reply)

    def _synced(self, b: SimBookie, incarnation: int, seq: int, reply: Reply,
                on_reply: Callable[[Reply | None], None]) -> None:
        if not b.up or b.incarnation != incarnation:
            self.sim.at(self.delay(), on_reply, None)   # crashed before the sync: no answer
            return
        b.sync(seq)
        self._send_reply(b, reply, on_reply)

    def _send_reply(self, b: SimBookie, reply: Reply, on_reply: Callable[[Reply | None], None]) -> None:
        if self.sim.rng.random() < self.faults.drop:
            self.sim.at(self.faults.timeout, on_reply, None)
            return
        self.sim.at(self.delay(), self._reply, b, b.incarnation, reply, on_reply)

    def _reply(self, b: SimBookie, incarnation: int, reply: Reply,
               on_reply: Callable[[Reply | None], None]) -> None:
        on_reply(reply if b.incarnation == incarnation else None)


# ---------------------------------------------------------------------------------------- metadata

class MetadataStore:
    """One ledger's versioned metadata with compare-and-set; checks invariant 5 on every write."""

    def __init__(self, sim: Sim, md: LedgerMetadata) -> None:
        self.sim = sim
        self.md, self.version = md, 0
        self.history: list[LedgerMetadata] = [md]

    def read(self) -> tuple[LedgerMetadata, int]:
        return self.md, self.version

    def write(self, md: LedgerMetadata, version: int, who: str) -> int:
        if version != self.version:
            raise BadVersionError(f"version {version} != {self.version}")
        check_metadata_change(self.sim, self.md, md)
        self.md, self.version = md, self.version + 1
        self.history.append(md)
        self.sim.log(f"md v{self.version} by {who}: {md.state.name} last={md.last_entry_id} "
                     f"fragments={ {k: v for k, v in md.ensembles.items()} }")
        return self.version


def check_metadata_change(sim: Sim, old: LedgerMetadata, new: LedgerMetadata) -> None:
    """Invariant 5, and the closed-is-final rule that invariant 4 rests on."""
    keys = list(new.ensembles)
    sim.check(all(a < b for a, b in itertools.pairwise(keys)), f"fragment keys not increasing: {keys}")
    old_keys = list(old.ensembles)
    for k in old_keys[:-1]:
        sim.check(new.ensembles.get(k) == old.ensembles[k], f"fragment {k} of a sealed range was rewritten")
    sim.check(old_keys[-1] in new.ensembles, f"last fragment {old_keys[-1]} disappeared")
    added = [k for k in keys if k not in old.ensembles]
    sim.check(all(k > old_keys[-1] for k in added), f"new fragment key below an existing one: {added}")
    if old.is_closed:
        sim.check(new.is_closed and (new.last_entry_id, new.length) == (old.last_entry_id, old.length),
                  "a closed ledger's end changed")
        sim.check(new.ensembles == old.ensembles, "a closed ledger's fragments changed")
    if old.state is LedgerState.IN_RECOVERY:
        sim.check(new.state is not LedgerState.OPEN, "IN_RECOVERY went back to OPEN")


class World:
    """Everything one run shares: clock, rng, bookies, network, metadata, and what was observed."""

    def __init__(self, sim: Sim, bookies: list[str], faults: Faults, md: LedgerMetadata,
                 stale_registry: float, model: ClientModel) -> None:
        self.sim, self.model = sim, model
        self.bookies = {b: SimBookie(b) for b in bookies}
        self.net = Network(sim, self.bookies, faults)
        self.faults = faults
        self.store = MetadataStore(sim, md)
        self.placement = EnsemblePlacement(sim.rng)
        self.stale_registry = stale_registry
        self.acked: list[tuple[float, int]] = []     # (time, entry id) the original writer completed
        self.marks: set[str] = set()                 # bookies the ledger was marked under-replicated for
        self.payloads: dict[int, bytes] = {}
        self.recovery_read_window = 64               # ClientConfig.recovery_read_window_entries

    def writable(self) -> list[BookieNode]:
        """The registry's view: live bookies, plus crashed ones whose session has not expired yet."""
        return [BookieNode(b.name) for b in self.bookies.values()
                if b.up or self.sim.rng.random() < self.stale_registry]

    def md_delay(self) -> float:
        return self.sim.rng.uniform(0.01, self.faults.md_delay_max)


MdDone = Callable[[LedgerMetadata | None, BaseException | None], None]


def update_async(world: World, who: str, transition: Callable[[LedgerMetadata], LedgerMetadata],
                 done: MdDone, attempt: int = 0) -> None:
    """metadata.update.update_ledger, event-driven: the read and the CAS happen at different times."""

    def read() -> None:
        md, version = world.store.read()
        try:
            new = transition(md)
        except Exception as e:  # noqa: BLE001 - the transition's verdict goes to the caller
            done(None, e)
            return
        if transitions.unchanged(md, new):
            done(md, None)
            return
        world.sim.at(world.md_delay(), cas, new, version)

    def cas(new: LedgerMetadata, version: int) -> None:
        try:
            world.store.write(new, version, who)
        except BadVersionError:
            if attempt >= METADATA_RETRIES_MAX:
                done(None, MetadataUpdateConflictError("lost the CAS too often"))
            else:
                update_async(world, who, transition, done, attempt + 1)
            return
        done(new, None)

    world.sim.at(world.md_delay(), read)
