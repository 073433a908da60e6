"""Ledger recovery decisions (BookKeeper's ReadLastConfirmedOp + LedgerRecoveryOp, after the
fixes its TLA+ model found, apache/bookkeeper#2614).

- Fencing reads go to every bookie of the last fragment; recovery may proceed once their answers
  cover every write set (QuorumCoverage): then no further entry can reach Qa acks.
- Reading starts after max(highest LAC seen, first entry of the last fragment − 1): everything
  before the last fragment was confirmed before that fragment was created, and starting lower
  could make a recovery ensemble change create a fragment key below an existing one.
- An entry is recoverable as soon as one bookie returns it (digest checked); it is absent only
  once Qw − Qa + 1 bookies of its write set say NO_ENTRY / NO_LEDGER (then it cannot have reached
  Qa acks); otherwise, when every answer is in, the outcome is unknown and recovery must abort.
- Every decision is taken from the answers in hand, the moment they settle it: a bookie that never
  answers (cut off, stopped) delays nothing that the others' answers decide (issue 27, item 5).
- An entry known to be confirmed (the one recovery starts after, whose header gives the ledger's
  length) is read the same way with `confirmed=True`: its first valid copy settles it, and "no such
  entry" answers prove nothing (a bookie that lost its disk says so too).
"""

from __future__ import annotations

import enum

from .quorum import write_set


def fence_start_point(last_fragment_first_entry: int, lacs: list[int]) -> int:
    """The last entry id known to be confirmed once fencing has covered the ensemble."""
    return max([*lacs, last_fragment_first_entry - 1, -1])


class ReadOutcome(enum.Enum):
    PENDING = "pending"
    FOUND = "found"
    ABSENT = "absent"
    UNKNOWN = "unknown"


class RecoveryReadTally:
    """Answers for one entry's recovery read from its write set, decided as soon as they settle it:
    FOUND at the first valid copy, ABSENT at the (Qw - Qa + 1)th "no such entry", UNKNOWN only once
    every bookie of the write set answered (or failed) without either; PENDING until then.

    `confirmed`: the entry is known to have reached Qa acks; only a copy, or every replica failing
    to give one, decides (never ABSENT)."""

    def __init__(self, entry_id: int, ensemble_size: int, write_quorum_size: int,
                 ack_quorum_size: int, *, confirmed: bool = False) -> None:
        self.entry_id = entry_id
        self.expected = set(write_set(entry_id, ensemble_size, write_quorum_size))
        self.absent_needed = write_quorum_size + 1 if confirmed else write_quorum_size - ack_quorum_size + 1
        self.absent: set[int] = set()
        self.errors: set[int] = set()
        self.found = False

    def _outcome(self) -> ReadOutcome:
        if self.found:
            return ReadOutcome.FOUND
        if len(self.absent) >= self.absent_needed:
            return ReadOutcome.ABSENT
        if self.absent | self.errors >= self.expected:
            return ReadOutcome.UNKNOWN
        return ReadOutcome.PENDING

    def on_found(self, index: int) -> ReadOutcome:
        if index in self.expected:
            self.found = True
        return self._outcome()

    def on_absent(self, index: int) -> ReadOutcome:
        if index in self.expected:
            self.absent.add(index)
        return self._outcome()

    def on_error(self, index: int) -> ReadOutcome:
        """No answer, a transport error or a replica that failed its digest: not a definitive no."""
        if index in self.expected:
            self.errors.add(index)
        return self._outcome()
