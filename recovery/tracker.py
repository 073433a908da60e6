"""The auditor's lost-bookie bookkeeping, as a pure state machine with the time passed in.

BookKeeper's Auditor.submitAuditTask and its lostBookieRecoveryDelay handling:
- a bookie is *available* while it is registered writable or read-only (a read-only bookie still
  serves its data, so it is never lost);
- a bookie that was known (seen available, or named by a ledger) and is no longer available is
  *pending* from the moment it went; its ledgers are marked once the delay has passed;
- if it comes back within the delay, nothing is marked;
- if more than one bookie is pending, nothing waits: a second failure while the first is still in
  its delay means redundancy is draining, so every pending bookie is audited at once;
- a delay of 0 audits at once; setting the delay to a new value restarts the wait of pending
  bookies from now, and setting it to its current value (``triggerAudit``) audits them now.
After an audit the bookie is *audited*: later periodic audits re-mark any ledger still naming it
(e.g. one created by a writer that had not seen the bookie go), until it becomes available again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass
class LostBookieTracker:
    known: set[str] = field(default_factory=set)
    pending: dict[str, float] = field(default_factory=dict)   # lost bookie → when it was first seen lost
    audited: set[str] = field(default_factory=set)

    def observe(self, available: Collection[str], now: float, named: Collection[str] = ()) -> None:
        """Take a new view of the available bookies (and, after an index scan, the bookies that
        ledgers name: those are known even if this auditor never saw them up)."""
        avail = set(available)
        for b in list(self.pending):
            if b in avail:
                del self.pending[b]    # came back within the delay: nothing to do
        self.audited -= avail
        for b in (self.known | set(named)) - avail:
            if b not in self.pending and b not in self.audited:
                self.pending[b] = now
        self.known |= avail

    def due(self, delay_s: float, now: float) -> set[str]:
        """Pending bookies whose ledgers must be marked now."""
        if not self.pending:
            return set()
        if delay_s <= 0 or len(self.pending) > 1:
            return set(self.pending)
        return {b for b, t in self.pending.items() if now - t >= delay_s}

    def next_due_at(self, delay_s: float) -> float | None:
        """When the next pending bookie becomes due (None if none is pending)."""
        if not self.pending:
            return None
        if delay_s <= 0 or len(self.pending) > 1:
            return min(self.pending.values())
        return min(self.pending.values()) + delay_s

    def delay_changed(self, new_s: int, old_s: int | None, now: float) -> bool:
        """The stored delay was (re)set. True when pending bookies must be audited now (the new
        value is 0 or equals the old one: BookKeeper's triggerAudit); otherwise their wait restarts."""
        if new_s == 0 or new_s == old_s:
            return True
        for b in self.pending:
            self.pending[b] = now
        return False

    def mark_audited(self, bookies: Collection[str]) -> None:
        for b in bookies:
            self.pending.pop(b, None)
            self.audited.add(b)

    def forget(self, bookies: Collection[str]) -> None:
        """Bookies no ledger names any more (repaired or decommissioned): stop tracking them."""
        for b in bookies:
            self.pending.pop(b, None)
            self.audited.discard(b)
            self.known.discard(b)
