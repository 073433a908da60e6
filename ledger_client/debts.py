"""What bookies still owe a writer that no longer changes its ensemble: one that closed the
ledger, or a recovery that is closing it.

With Qw > Qa an entry completes before its slowest bookie answers (AddState.owed). While a
writer writes, such a bookie is timed out or fails, and an ensemble change replaces it and marks
the ledger under-replicated for what it missed. Once the writer closed the ledger, or a
recovery's rewrites all completed and it is closing the ledger at them, no change may follow,
and a bookie that then fails, refuses (a recovery fenced it) or stays silent past
add_timeout_ms keeps what it missed missing: it is written off and the ledger marked
under-replicated for it. The writer's handle stays with the client's ticker until every bookie
answered what it owes or was marked.

A recovery marks only once its close is in the metadata (a recovery that aborts is redone by
the next, which rewrites the same entries), and what its rewrites left short before that (a
bookie replaced during them) is kept until then.

Found by the simulator: seed 2687121037 (E5/Qw4/Qa3, a recovery closed on the Qa acks of its
rewrites while the fourth bookie of a write set had crashed) and seed 4064566643 (E4/Qw4/Qa1,
the writer closed the ledger while a bookie it had taken back owed an entry, which the bookie
then refused: a recovery had fenced it). Both left the closed ledger an entry short on a bookie
with nothing to tell the replication workers; the auditor's periodic check reads only the first
and last entry of each bookie's fragment.
"""

from __future__ import annotations

import logging

from metadata import MetadataError, UnderReplicationStore

from .machines import AddState

log = logging.getLogger("ledger_client.write_handle")   # where a writer's marks were always logged


class Debts:
    """A writer's bookies that miss entries it acknowledged or a recovery rewrote. Called under
    the writer's lock."""

    __slots__ = ("closed", "ended", "_hold", "_noted")

    def __init__(self, *, recovery: bool) -> None:
        self.ended = False     # no ensemble change from now on: a failed bookie is written off
        self.closed = False    # the ledger is closed
        self._hold = recovery  # a recovery's marks wait for its close
        self._noted: set[str] = set()

    def short(self, bookies: set[str]) -> set[str]:
        """Bookies left short (an ensemble change replaced them, the writer stopped, or they
        failed owing entries after its last change): the ones to mark now, the rest kept for a
        recovery's close."""
        if self.closed or not self._hold:
            return set(bookies)
        self._noted |= bookies
        return set()

    def close(self, sm: AddState) -> set[str]:
        """The ledger is closed: every bookie to mark for what it missed so far."""
        self.ended = self.closed = True
        noted, self._noted = self._noted, set()
        return noted | sm.finish()

    def settled(self, sm: AddState) -> bool:
        """Closed, and no bookie owes an entry: nothing more to watch."""
        return self.closed and not sm.owed


def mark_underreplicated(queue: UnderReplicationStore, ledger_id: int, bookies: set[str]) -> None:
    """Queue the ledger for the replication workers: entries its writer acknowledged (or a
    recovery rewrote) miss on ``bookies``. A failure is logged: the auditor's periodic check is
    then left to find them."""
    try:
        queue.mark_underreplicated(ledger_id, sorted(bookies))
    except MetadataError as e:
        log.error("ledger %d: entries it acknowledged miss on %s, and marking it under-replicated failed: "
                  "%s (the auditor's periodic check is left to find them)", ledger_id, sorted(bookies), e)
        return
    log.warning("ledger %d: marked under-replicated: entries it acknowledged miss on %s", ledger_id, sorted(bookies))
