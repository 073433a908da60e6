"""The under-replication queue and auditor election: the cluster side of re-replication.

BookKeeper's ``LedgerUnderreplicationManager`` and ``AuditorElector`` as one interface with two
backends (ZooKeeper under ``metadata.zk``, the in-memory twin in ``metadata.memory``); a contract
suite runs against both. Layout under ``<root>/underreplication`` (BookKeeper's names):

- ``ledgers/<hierarchical path>/urL<id>``: one node per under-replicated ledger; its data lists
  the missing replicas (bookie ids). Marking again merges bookie ids into the node by CAS. The
  path is BookKeeper's: four buckets of 16 bits of the id as 4 hex digits, then ``urL%010d``
  (ledger 1: ``ledgers/0000/0000/0000/0001/urL0000000001``); emptied buckets are pruned.
- ``locks/urL<id>``: ephemeral, held by the worker replicating that ledger; it vanishes with the
  worker's session, so a dead worker's ledger is picked up by another.
- ``disable``: present while re-replication is disabled (workers stop acquiring).
- ``lostBookieRecoveryDelay``: seconds the auditor waits after a bookie disappears before marking
  its ledgers; changeable at run time (the auditor watches it).
- ``auditorelection/V_<seq>``: ephemeral sequential votes; the lowest is the auditor; the data of
  each vote is the candidate's id.

Everything here is called by ``recovery/`` (auditor, replication worker, shell); nothing here
knows about bookies' data. The record formats (versioned JSON) and the shared implementation are
in :mod:`metadata.underreplication.base`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping

#: ``on_change(is_auditor)``: told True when this candidate becomes the auditor and False when it
#: stops being it (session lost, withdrawn). Called on a store thread, one call at a time.
ElectionCallback = Callable[[bool], None]


class UnderReplicationStore(abc.ABC):
    """Queue of ledgers missing replicas, their locks, the enable switch, the lost-bookie delay,
    and the auditor election. Same deadline rules as the metadata store: ZooKeeper down means
    MetadataUnavailableError, never a hang."""

    # -- the queue ----------------------------------------------------------------------------
    @abc.abstractmethod
    def mark_underreplicated(self, ledger_id: int, missing: Iterable[str]) -> None:
        """Add ``missing`` bookie ids to the ledger's under-replication node (created if absent),
        by CAS so concurrent marks merge. Idempotent."""

    @abc.abstractmethod
    def mark_underreplicated_many(self, marks: Mapping[int, Iterable[str]]) -> None:
        """mark_underreplicated for many ledgers (ledger id → missing bookie ids), in as few
        round trips as the backend allows: an auditor marks hundreds of ledgers at once when a
        bookie dies, and one round trip each was most of the time before the first copy."""

    @abc.abstractmethod
    def list_underreplicated(self) -> dict[int, list[str]]:
        """Every under-replicated ledger → its missing replicas (sorted)."""

    @abc.abstractmethod
    def acquire_underreplicated(self, timeout_ms: int, exclude: Iterable[int] = ()) -> int | None:
        """Lock one under-replicated ledger not locked by anyone (and not in ``exclude``) and return
        its id; None if none became available within ``timeout_ms`` (or replication is disabled).

        Blocks up to ``timeout_ms`` (0: one look), woken by watches when a ledger is marked, a lock
        is released or replication is enabled again; while disabled it waits as on an empty queue.
        The lock is ephemeral (dies with this store's session: the holder then forgets it) and
        remembers the node version it saw, for :meth:`mark_replicated`. ValueError if
        ``timeout_ms`` is negative.
        """

    @abc.abstractmethod
    def release_underreplicated(self, ledger_id: int) -> None:
        """Drop our lock on the ledger (no-op if we do not hold it, or it went with a lost
        session); the ledger stays queued. Idempotent."""

    @abc.abstractmethod
    def mark_replicated(self, ledger_id: int) -> bool:
        """Remove the ledger from the queue and release our lock. The removal is a CAS on the
        version seen at acquire: if someone marked more missing replicas meanwhile, the node stays
        (False is returned) so the ledger is replicated again. True when removed (or already gone).

        Without our lock (never acquired, or gone with a lost session) nothing is deleted: False
        unless the node is gone already. On MetadataUnavailableError the lock is kept: call again."""

    @abc.abstractmethod
    def missing_replicas(self, ledger_id: int) -> list[str] | None:
        """The ledger's missing replicas, or None if it is not under-replicated."""

    # -- switches -----------------------------------------------------------------------------
    @abc.abstractmethod
    def set_replication_enabled(self, enabled: bool) -> None:
        """Enable or disable re-replication cluster-wide (the ``disable`` node). Idempotent."""

    @abc.abstractmethod
    def is_replication_enabled(self) -> bool:
        """False while the ``disable`` node exists."""

    @abc.abstractmethod
    def lost_bookie_recovery_delay_s(self) -> int:
        """The stored delay (0 if never set)."""

    @abc.abstractmethod
    def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        """Store the delay (ValueError if negative or not an int)."""

    @abc.abstractmethod
    def watch_lost_bookie_recovery_delay(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(seconds)`` now and whenever the delay changes; returns a cancel function.

        Calls come on a store thread (never ZooKeeper's), one at a time, without repeats; the
        watch survives reconnections and session loss."""

    # -- auditor election -----------------------------------------------------------------------
    @abc.abstractmethod
    def elect_auditor(self, candidate_id: str, on_change: ElectionCallback) -> Callable[[], None]:
        """Stand as auditor candidate: an ephemeral sequential vote; the lowest vote wins.

        ``on_change(True)`` when we become the auditor, ``on_change(False)`` when we stop being it
        (session lost: then we stand again on the new session; withdrawn; store closed). Returns a
        withdraw function (deletes our vote; idempotent). The first vote is cast before this
        returns, so ZooKeeper down (MetadataUnavailableError) or an uninitialised cluster
        (NoNodeError) is the caller's error; later failures are retried in the background."""

    @abc.abstractmethod
    def current_auditor(self) -> str | None:
        """The id of the candidate holding the lowest vote, or None if nobody stands."""
