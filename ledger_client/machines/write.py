"""The writer's protocol: striping, quorum acks, in-order completion, ensemble changes.

BookKeeper's PendingAddOp + LedgerHandle, without I/O. The handle calls `append` for each new
entry and sends what it returns; feeds every bookie answer back through `on_ack` or
`on_bookie_failure`; runs the ensemble change that `on_bookie_failure` asks for (placement and a
metadata CAS happen outside) and hands the result to `apply_change`, which says what to resend.

Rules (DESIGN §5, invariant 2):
- the LAC is the largest entry id such that every id up to it has Qa acks; it never goes back;
- completions come out strictly in entry-id order;
- while an ensemble change runs, nothing completes (acks are still counted);
- a new fragment starts at LAC + 1 — replacing the last fragment if that one is still empty —
  so fragment keys only grow (invariant 5);
- after a change, every pending entry whose write set lost a bookie forgets that bookie's ack
  and is resent to the replacement: the metadata now says the entry lives there.
"""

from __future__ import annotations

from collections.abc import Iterable
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
        # Write sets repeat every E entries: compute the E of them (and their bookies) once.
        self._write_sets = [tuple(write_set(i, ensemble_size, write_quorum_size)) for i in range(ensemble_size)]
        self._targets = self._targets_by_slot(self.ensemble)
        self.failed: set[str] = set()
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
        # A bookie known to have failed gets nothing; the running ensemble change resends to its successor.
        failed = self.failed
        if failed:
            return eid, self.length, tuple(b for b in targets if b not in failed)
        return eid, self.length, targets

    def on_ack(self, entry_id: int, bookie: str) -> list[Completion]:
        return self.on_acks(bookie, (entry_id,))

    def on_acks(self, bookie: str, entry_ids: Iterable[int]) -> list[Completion]:
        """Acks from one bookie (a whole stream message's worth); then whatever can complete."""
        pending, acked = self.pending, self._acked
        for eid in entry_ids:
            targets = pending.get(eid)
            if targets is not None and bookie in targets:
                acked[eid] |= 1 << targets.index(bookie)
            # else: a late ack for a completed entry, or from a bookie since replaced
        return self._complete()

    def unacked(self, entry_id: int) -> list[str]:
        """Bookies that still owe an ack for a pending entry (for add timeouts)."""
        targets = self.pending.get(entry_id, ())
        mask = self._acked.get(entry_id, 0)
        return [b for k, b in enumerate(targets) if not mask >> k & 1]

    def _complete(self) -> list[Completion]:
        if self.changing:
            return []
        done: list[Completion] = []
        pending, acked, lengths, qa = self.pending, self._acked, self._lengths, self.qa
        # The next entry to complete is always LAC + 1 (looking it up by key: iterating a dict
        # whose front was deleted costs O(deleted) per call).
        while (mask := acked.get(self.lac + 1)) is not None and mask.bit_count() >= qa:
            eid = self.lac + 1
            del pending[eid], acked[eid]
            length = lengths.pop(eid)
            self.lac, self.lac_length = eid, length
            done.append(Completion(eid, length))
        return done

    # ------------------------------------------------------------------ ensemble changes

    def on_bookie_failure(self, bookie: str) -> bool:
        """Record a failed bookie; True when the caller must start an ensemble change now."""
        if bookie not in self.ensemble or bookie in self.failed:
            return False
        self.failed.add(bookie)
        if self.changing:
            return False
        self.changing = True
        return True

    def change_plan(self) -> tuple[int, list[int]]:
        """(first entry id of the new fragment, ensemble indexes to replace)."""
        invariant(self.changing, "no ensemble change in progress")
        return self.lac + 1, [i for i, b in enumerate(self.ensemble) if b in self.failed]

    def apply_change(self, first_entry_id: int, new_ensemble: list[str]) -> tuple[list[Send], list[Completion]]:
        """Adopt the fragment the metadata now has; returns (resends, completions now possible)."""
        invariant(first_entry_id >= self.last_key, "fragment keys must not go backwards")
        invariant(len(new_ensemble) == self.e and len(set(new_ensemble)) == self.e, "bad new ensemble")
        self.ensembles[first_entry_id] = list(new_ensemble)
        self.last_key = first_entry_id
        self.ensemble = list(new_ensemble)
        self._targets = self._targets_by_slot(self.ensemble)
        self.changes += 1
        sends: list[Send] = []
        for eid, targets in list(self.pending.items()):
            invariant(eid >= first_entry_id, f"pending entry {eid} below the new fragment {first_entry_id}")
            positions = self._write_sets[eid % self.e]
            new_targets = tuple([new_ensemble[i] for i in positions])
            if new_targets == targets:
                continue
            mask = self._acked[eid]
            for k, (i, old, new) in enumerate(zip(positions, targets, new_targets, strict=True)):
                if new != old:
                    mask &= ~(1 << k)  # the replaced bookie's copy no longer counts
                    if new not in self.failed:
                        sends.append(Send(eid, i, new))
            self.pending[eid] = new_targets
            self._acked[eid] = mask
        self.failed &= set(new_ensemble)
        self.changing = bool(self.failed)  # a bookie that failed meanwhile needs another change
        return sends, self._complete()

    def abort_change(self) -> None:
        """The change cannot be made (the handle is failing): leave the state consistent."""
        self.changing = False

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
