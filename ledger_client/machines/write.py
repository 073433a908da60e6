"""The writer's protocol: striping, quorum acks, in-order completion, ensemble changes.

BookKeeper's PendingAddOp + LedgerHandle, without I/O. The handle calls `append` for each new
entry and sends what it returns; feeds every bookie answer back through `on_ack` or
`on_bookie_failure`; runs the ensemble change that `on_bookie_failure` asks for (placement and a
metadata CAS happen outside) and hands the result to `apply_change`, which says what to resend —
or, when no bookie can take a failed one's place, to `delay_change`.

Rules (DESIGN §5, invariant 2):
- the LAC is the largest entry id such that every id up to it has Qa acks; it never goes back;
- completions come out strictly in entry-id order;
- while an ensemble change runs, nothing completes (acks are still counted);
- a new fragment starts at LAC + 1 — replacing the last fragment if that one is still empty —
  so fragment keys only grow (invariant 5);
- after a change, every pending entry whose write set lost a bookie forgets that bookie's ack
  and is resent to the replacement: the metadata now says the entry lives there.

Delayed ensemble change (BookKeeper's delayEnsembleChange): a failed bookie that no spare can
replace stays in the ensemble as *delayed*: it is sent nothing, and entries complete on the Qa
acks of the other bookies of their write sets (a write set left with fewer than Qa live bookies
completes nothing: `quorum_lost`, the handle fails the appends after its operation timeout). A
later change replaces a delayed bookie with a spare, or takes it back with the same id once it
answers again (`apply_change(..., delayed=...)` says which stay delayed). Entries it missed are
the reason for `take_short`: the bookies that owe acks of completed entries of a fragment this
writer finished (it changed away from them, or closed), for the ledger to be marked
under-replicated. `owed` keeps, per bookie, the oldest and newest completed entries it has not
acknowledged: with Qw > Qa an entry completes without the slowest bookie, and the add timeout
must still see that bookie fall behind.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from ..protocol.checks import invariant
from .quorum import write_set


class Send(NamedTuple):
    entry_id: int
    position: int   # index in the ensemble
    bookie: str


class Completion(NamedTuple):
    entry_id: int
    length: int     # the ledger's cumulative length up to and including this entry


class AddState:
    """Per pending entry it keeps three plain dict values (bookies per write-set slot, an acked
    bitmask, the cumulative length) rather than an object with a set and a dict: a writer has
    thousands of entries in flight and per-entry containers made Python's cyclic GC the largest
    cost of an append."""

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                 ensembles: dict[int, list[str]], last_add_confirmed: int = -1, length: int = 0) -> None:
        invariant(ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, "need E >= Qw >= Qa >= 1")
        invariant(bool(ensembles), "a ledger has at least one fragment")
        self.e, self.qw, self.qa = ensemble_size, write_quorum_size, ack_quorum_size
        self.ensembles = {k: list(v) for k, v in sorted(ensembles.items())}
        self.last_key = max(self.ensembles)
        self.ensemble = list(self.ensembles[self.last_key])
        invariant(last_add_confirmed >= self.last_key - 1, "the last fragment starts after the LAC + 1")
        self.lac = last_add_confirmed
        self.lac_length = length
        self.length = length
        self.next_entry_id = last_add_confirmed + 1
        self.pending: dict[int, tuple[str, ...]] = {}   # entry id -> bookie of each write-set slot
        self._acked: dict[int, int] = {}                 # entry id -> bitmask of acked slots
        self._lengths: dict[int, int] = {}               # entry id -> cumulative length
        self._full = (1 << write_quorum_size) - 1        # the mask of an entry every slot acked
        # Write sets repeat every E entries: compute the E of them (and their bookies) once.
        self._write_sets = [tuple(write_set(i, ensemble_size, write_quorum_size)) for i in range(ensemble_size)]
        self._targets = self._targets_by_slot(self.ensemble)
        self.failed: set[str] = set()     # reported failed; the running (or next) change handles them
        self.delayed: set[str] = set()    # failed, no spare: kept in the ensemble, sent nothing
        self._skip: set[str] = set()      # failed | delayed: what append leaves out
        self._planned: set[str] = set()   # the bookies the running change's plan replaces
        self.owed: dict[str, list[int]] = {}  # bookie -> [oldest, newest] completed entries it has not acked
        self._short: set[str] = set()     # bookies missing entries of a fragment that is finished
        self.changing = False
        self.changes = 0

    # ------------------------------------------------------------------ adds

    def _targets_by_slot(self, ensemble: list[str]) -> list[tuple[str, ...]]:
        return [tuple(ensemble[i] for i in positions) for positions in self._write_sets]

    def append(self, size: int) -> tuple[int, int, tuple[str, ...]]:
        """A new entry: (entry id, cumulative length, the bookies to send it to now)."""
        eid = self.next_entry_id
        self.next_entry_id = eid + 1
        self.length += size
        targets = self._targets[eid % self.e]   # shared tuple: nothing allocated per entry
        self.pending[eid] = targets
        self._acked[eid] = 0
        self._lengths[eid] = self.length
        # A failed bookie gets nothing: the running change resends to its successor; a delayed
        # one gets nothing until a change takes it back.
        skip = self._skip
        if skip:
            return eid, self.length, tuple(b for b in targets if b not in skip)
        return eid, self.length, targets

    def on_ack(self, entry_id: int, bookie: str) -> list[Completion]:
        return self.on_acks(bookie, (entry_id,))

    def on_acks(self, bookie: str, entry_ids: Collection[int]) -> list[Completion]:
        """Acks from one bookie (a whole stream message's worth); then whatever can complete."""
        pending, acked = self.pending, self._acked
        for eid in entry_ids:
            targets = pending.get(eid)
            if targets is not None and bookie in targets:
                acked[eid] |= 1 << targets.index(bookie)
            # else: a late ack for a completed entry, or from a bookie since replaced
        owed = self.owed
        if owed and entry_ids:
            debt = owed.get(bookie)
            # not for a failed or delayed bookie: its late acks say nothing of what it was not sent
            if debt is not None and bookie not in self._skip:
                self._settle(bookie, debt, max(entry_ids))
        return self._complete()

    def _settle(self, bookie: str, debt: list[int], top: int) -> None:
        """`bookie` acked up to `top`. A bookie answers its adds in order (one connection; a
        broken one fails them all), so everything it was sent up to `top` is answered: the debt
        is paid, or starts at its next entry after `top` (sent to it, completed, unanswered)."""
        if top >= debt[1]:
            del self.owed[bookie]
        elif top >= debt[0]:
            n = top + 1
            gap = (self.ensemble.index(bookie) - n) % self.e   # its next write set from n on
            debt[0] = n if gap < self.qw else n + gap - self.qw + 1

    def unacked(self, entry_id: int) -> list[str]:
        """Bookies that still owe an ack for a pending entry (for add timeouts); failed and
        delayed bookies owe nothing, they were sent nothing more."""
        targets = self.pending.get(entry_id, ())
        mask = self._acked.get(entry_id, 0)
        skip = self._skip
        return [b for k, b in enumerate(targets) if not mask >> k & 1 and b not in skip]

    def _complete(self) -> list[Completion]:
        if self.changing:
            return []
        done: list[Completion] = []
        pending, acked, lengths, qa = self.pending, self._acked, self._lengths, self.qa
        full, owed = self._full, self.owed
        # The next entry to complete is always LAC + 1 (looking it up by key: iterating a dict
        # whose front was deleted costs O(deleted) per call).
        while (mask := acked.get(self.lac + 1)) is not None and mask.bit_count() >= qa:
            eid = self.lac + 1
            if mask != full:   # completed without some of its write set: each of them owes it
                missing = full ^ mask
                if missing & (missing - 1):
                    self._owe(eid, pending[eid], mask)
                else:   # one bookie (Qw = Qa + 1, the usual case): inline, this runs per entry
                    b = pending[eid][missing.bit_length() - 1]
                    debt = owed.get(b)
                    if debt is None:
                        owed[b] = [eid, eid]
                    else:
                        debt[1] = eid
            del pending[eid], acked[eid]
            length = lengths.pop(eid)
            self.lac, self.lac_length = eid, length
            done.append(Completion(eid, length))
        return done

    def _owe(self, eid: int, targets: tuple[str, ...], mask: int) -> None:
        """`eid` completed without some of its write set: each of them owes it."""
        owed = self.owed
        for k, b in enumerate(targets):
            if not mask >> k & 1:
                debt = owed.get(b)
                if debt is None:
                    owed[b] = [eid, eid]
                else:
                    debt[1] = eid

    @property
    def quorum_lost(self) -> bool:
        """Some write set has fewer than Qa bookies that are neither failed nor delayed: its
        entries cannot complete until a change gives it bookies back."""
        skip = self._skip
        return bool(skip) and any(sum(b not in skip for b in t) < self.qa for t in self._targets)

    # ------------------------------------------------------------------ ensemble changes

    def on_bookie_failure(self, bookie: str) -> bool:
        """Record a failed bookie; True when the caller must start an ensemble change now."""
        if bookie not in self.ensemble or bookie in self._skip:
            return False
        self.failed.add(bookie)
        self._skip = self.failed | self.delayed
        if self.changing:
            return False
        self.changing = True
        return True

    def begin_change(self) -> bool:
        """A spare (or a delayed bookie back) is there: True when the caller must run a change
        for the delayed bookies now (False while one runs already: it covers them too)."""
        if self.changing or not self.delayed:
            return False
        self.changing = True
        return True

    def change_plan(self) -> tuple[int, list[int]]:
        """(first entry id of the new fragment, ensemble indexes to replace: failed and delayed)."""
        invariant(self.changing, "no ensemble change in progress")
        self._planned = self.failed | self.delayed
        return self.lac + 1, [i for i, b in enumerate(self.ensemble) if b in self._planned]

    def apply_change(self, first_entry_id: int, new_ensemble: list[str],
                     delayed: Collection[str] = ()) -> tuple[list[Send], list[Completion]]:
        """Adopt the fragment the metadata now has; returns (resends, completions now possible).

        ``delayed``: planned bookies left in their place for want of a spare (still sent nothing).
        A planned bookie in its place and not in ``delayed`` is taken back (it answers again)."""
        invariant(first_entry_id >= self.last_key, "fragment keys must not go backwards")
        invariant(len(new_ensemble) == self.e and len(set(new_ensemble)) == self.e, "bad new ensemble")
        planned, still = self._planned, set(delayed)
        invariant(still <= planned and all(new_ensemble[i] == b for i, b in enumerate(self.ensemble) if b in still),
                  "only a planned bookie stays delayed, in its place")
        back = {b for i, b in enumerate(self.ensemble) if b in planned and b not in still and new_ensemble[i] == b}
        leaving = set(self.ensemble) - set(new_ensemble)
        for b in leaving | back | still:   # the fragment they were short in is finished now
            if self.owed.pop(b, None) is not None:
                self._short.add(b)
        self.ensembles[first_entry_id] = list(new_ensemble)
        self.last_key = first_entry_id
        self.ensemble = list(new_ensemble)
        self._targets = self._targets_by_slot(self.ensemble)
        self.changes += 1
        self.failed = {b for b in self.failed if b not in planned and b in new_ensemble}  # failed meanwhile
        self.delayed = still
        self._skip = self.failed | still
        self._planned = set()
        sends = self._resends(first_entry_id, new_ensemble, back)
        self.changing = bool(self.failed)  # a bookie that failed meanwhile needs another change
        return sends, self._complete()

    def _resends(self, first_entry_id: int, new_ensemble: list[str], back: set[str]) -> list[Send]:
        sends: list[Send] = []
        skip = self._skip
        for eid, targets in list(self.pending.items()):
            invariant(eid >= first_entry_id, f"pending entry {eid} below the new fragment {first_entry_id}")
            positions = self._write_sets[eid % self.e]
            new_targets = tuple([new_ensemble[i] for i in positions])
            mask = self._acked[eid]
            for k, (i, old, new) in enumerate(zip(positions, targets, new_targets, strict=True)):
                if new != old:
                    mask &= ~(1 << k)  # the replaced bookie's copy no longer counts
                    if new not in skip:
                        sends.append(Send(eid, i, new))
                elif new in back and not mask >> k & 1:
                    sends.append(Send(eid, i, new))   # taken back: it gets what it was not sent
            self.pending[eid] = new_targets
            self._acked[eid] = mask
        return sends

    def delay_change(self) -> list[Completion]:
        """The change found no bookie for any planned position: its bookies stay in the
        ensemble, delayed, and entries complete on the others' acks (whatever can now). A delayed
        bookie that owes entries of an earlier, finished fragment is short now (`take_short`):
        only the last fragment is revisited by a later change or the close."""
        invariant(self.changing, "no ensemble change in progress")
        for b in self._planned:   # it owes entries of a fragment already finished: no change revisits it
            debt = self.owed.get(b)
            if debt is not None and debt[0] < self.last_key:
                self._short.add(b)
        self.delayed |= self._planned
        self.failed -= self._planned
        self._skip = self.failed | self.delayed
        self._planned = set()
        self.changing = bool(self.failed)
        return self._complete()

    def abort_change(self) -> None:
        """The change cannot be made (the handle is failing): leave the state consistent."""
        self.changing = False
        self._planned = set()

    def take_short(self) -> set[str]:
        """Bookies missing entries of fragments this writer finished since the last call."""
        short, self._short = self._short, set()
        return short

    def finish(self) -> set[str]:
        """The writer stops (closes or fails): the failed and delayed bookies that owe completed
        entries miss them in the last fragment too; with `take_short`'s."""
        for b in self._skip:
            if self.owed.pop(b, None) is not None:
                self._short.add(b)
        return self.take_short()

    def write_off(self, bookie: str) -> bool:
        """Nothing will be sent to ``bookie`` again (the writer closed the ledger, or a recovery is
        closing it at what it rewrote: no bookie is replaced): forget what it owes; True if it
        owed completed entries."""
        return self.owed.pop(bookie, None) is not None

    # ------------------------------------------------------------------ shutdown

    def drain_pending(self) -> list[int]:
        """Forget every pending entry (the handle failed them); returns their ids."""
        ids = list(self.pending)
        self.pending.clear()
        self._acked.clear()
        self._lengths.clear()
        return ids

    @property
    def outstanding(self) -> int:
        return len(self.pending)
