"""Striping and quorum coverage (BookKeeper's RoundRobinDistributionSchedule)."""

from __future__ import annotations


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    """Indexes into the ensemble that store `entry_id`: Qw consecutive bookies from entry_id mod E."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


class QuorumCoverage:
    """Has every write set heard enough definitive answers?

    Covered once, in every one of the E write sets, fewer than Qa bookies are still unknown (no
    answer yet, or an error). Then no entry can have been acknowledged by Qa bookies that did not
    answer, which is what fencing (all unknowns < Qa ⇒ no new entry can reach Qa) and "this entry
    does not exist" both rest on.
    """

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        self.e, self.qw, self.qa = ensemble_size, write_quorum_size, ack_quorum_size
        self.answered = [False] * ensemble_size

    def add(self, index: int) -> bool:
        self.answered[index] = True
        return self.covered()

    def covered(self) -> bool:
        for start in range(self.e):
            unknown = sum(1 for i in write_set(start, self.e, self.qw) if not self.answered[i])
            if unknown >= self.qa:
                return False
        return True
