"""What a recovery's rewrites still owe when the recovery closes the ledger.

Recovery rewrites each entry past the last confirmed one to its whole write set and closes the
ledger once every rewrite has Qa acknowledgements (ledger_client/recovery.py). With Qw > Qa a
bookie may then still owe some: the slowest one, or one that failed or fell silent. Nothing
replaces such a bookie any more (the recovery is closing the ledger at what it rewrote; an
ensemble change now would rewrite fragments it already decided), so what it missed stays missing
there, and a bookie replaced by an ensemble change during the rewrites misses the rewrites it did
not acknowledge before. Either way the ledger is marked under-replicated for that bookie, as a
writer marks the bookies it leaves short, but only once the recovery's close is in the metadata:
a recovery that aborts is started over by the next, which rewrites the same entries again.

Found by the simulator (seed 2687121037): E5/Qw4/Qa3, a recovery closed the ledger on the Qa
acks of its rewrites while the fourth bookie of a write set had crashed; that bookie's adds failed
after the close, nobody marked the ledger, and the closed ledger stayed an entry short there.
"""

from __future__ import annotations

import logging

from metadata import MetadataError, UnderReplicationStore

from .machines import AddState

log = logging.getLogger("ledger_client.write_handle")   # where a writer's marks were always logged


class RewriteDebts:
    """A recovery writer's bookies that miss rewrites, until its close lets them be marked.
    Called under the writer's lock."""

    __slots__ = ("closed", "ended", "_noted")

    def __init__(self) -> None:
        self.ended = False     # every rewrite completed: failures replace no bookie now
        self.closed = False    # the recovery's close is in the metadata: marks go out at once
        self._noted: set[str] = set()

    def short(self, bookies: set[str]) -> set[str]:
        """Bookies left short of rewrites (an ensemble change replaced them, or the writer
        stopped): the ones to mark now, the rest kept for the close."""
        if self.closed:
            return set(bookies)
        self._noted |= bookies
        return set()

    def failed(self, sm: AddState, bookie: str) -> set[str]:
        """After the rewrites ended, ``bookie`` failed or fell silent: it gets nothing again, and
        what it owes is short (to mark now, or at the close)."""
        return self.short({bookie}) if sm.write_off(bookie) else set()

    def close(self, sm: AddState) -> set[str]:
        """The recovery closed the ledger: every bookie to mark for what it missed so far."""
        self.closed = True
        noted, self._noted = self._noted, set()
        return noted | sm.finish()

    def settled(self, sm: AddState) -> bool:
        """Closed, and no bookie owes a rewrite: nothing more to watch."""
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
