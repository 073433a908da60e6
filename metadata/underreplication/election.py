"""The auditor election of the under-replication store (BookKeeper's AuditorElector), as a mixin of
:class:`~metadata.underreplication.base.UnderReplicationBase`: ephemeral sequential votes under
``underreplication/auditorelection``, the lowest is the auditor, every other candidate watches the
vote just below its own. Written on the same backend primitives as the queue, so both backends
share it; it runs on the store's under-replication thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from metadata.errors import MetadataError, MetadataUnavailableError, NoNodeError, StoreClosedError
from metadata.layout import UR_VOTE_PREFIX, ZkLayout, vote_sequence
from metadata.underreplication import ElectionCallback

if TYPE_CHECKING:
    from metadata.store import SessionWorker

log = logging.getLogger(__name__)

RETRY_S = 1.0  # election retry after a ZooKeeper error
_RECHECKS_MAX = 20  # votes vanishing under us this many times in a row means retry later

#: (data, version, ephemeral owner session or None), as the backends' primitives return nodes.
NodeState = tuple[bytes, int, int | None]
Wake = Callable[[object], None]


def ordered_votes(names: Iterable[str]) -> list[str]:
    """Auditor votes by ZooKeeper sequence number, lowest (the auditor) first; other names dropped."""
    seqs = [(seq, name) for name in names if (seq := vote_sequence(name)) is not None]
    return [name for _, name in sorted(seqs)]


@dataclass(eq=False)
class _Candidate:
    candidate_id: str
    on_change: ElectionCallback
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards the fields below
    stand_lock: threading.Lock = field(default_factory=threading.Lock)  # one vote creation at a time
    vote: str | None = None  # name of our vote node on the current session
    is_auditor: bool = False  # what on_change was last told
    withdrawn: bool = False
    uncertain: bool = False  # a vote creation's outcome is unknown: an orphan vote may exist
    retry_pending: bool = False
    wake: Wake = field(default=lambda _e: None)


class AuditorElection:
    """Mixin: the election half of the store. Needs the base's primitives and its ``_ur_worker``,
    ``_ur_mutex`` and ``_ur_candidates`` (set up by ``_ur_init``)."""

    paths: ZkLayout
    _ur_worker: SessionWorker
    _ur_mutex: threading.Lock
    _ur_candidates: set[_Candidate]

    if TYPE_CHECKING:

        def _ur_get(self, path: str) -> NodeState | None: ...

        def _ur_children_many(self, paths: list[str], *, watch: bool) -> list[list[str] | None]: ...

        def _ur_create_path(
            self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False
        ) -> str: ...

        def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None: ...

        def _ur_watch(self, path: str, wake: Wake) -> NodeState | None: ...

        def _ur_session(self) -> int | None: ...

    def elect_auditor(self, candidate_id: str, on_change: ElectionCallback) -> Callable[[], None]:
        """BookKeeper's AuditorElector: an ephemeral sequential vote; the lowest is the auditor and
        every other candidate watches the vote just below its own (no herd when one goes).

        The first vote is cast in the caller's thread (ZooKeeper down or no cluster is the caller's
        error); everything after, and every ``on_change`` call, runs on the store's thread."""
        if not isinstance(candidate_id, str) or not candidate_id:
            raise ValueError(f"candidate id must be a non-empty string, got {candidate_id!r}")
        cand = _Candidate(candidate_id, on_change)
        cand.wake = lambda _event: self._ur_worker.submit(partial(self._ur_step, cand))
        with self._ur_mutex:
            self._ur_candidates.add(cand)
        try:
            self._ur_stand(cand)
        except BaseException:
            self._ur_withdraw(cand)
            if cand.uncertain:
                self._ur_worker.submit(partial(self._ur_remove_orphans_later, cand))
            raise
        self._ur_worker.submit(partial(self._ur_step, cand))
        return partial(self._ur_withdraw, cand)

    def current_auditor(self) -> str | None:
        election = self.paths.auditor_election
        names = ordered_votes(self._ur_children_many([election], watch=False)[0] or [])
        for name in names:  # the lowest may vanish between the listing and the read
            got = self._ur_get(f"{election}/{name}")
            if got is not None:
                return got[0].decode(errors="replace")
        return None

    def _ur_votes(self) -> list[str]:
        return ordered_votes(self._ur_children_many([self.paths.auditor_election], watch=False)[0] or [])

    def _ur_stand(self, cand: _Candidate) -> None:
        """Cast a vote for ``cand`` unless it has one (any thread; one creation at a time)."""
        with cand.stand_lock:
            if cand.vote is not None or cand.withdrawn:
                return
            if cand.uncertain:
                self._ur_remove_orphans(cand)
            prefix = f"{self.paths.auditor_election}/{UR_VOTE_PREFIX}"
            try:
                created = self._ur_create_path(prefix, cand.candidate_id.encode(), ephemeral=True, sequential=True)
            except MetadataUnavailableError:
                cand.uncertain = True  # the vote may exist, unknown to us: clear it before the next
                raise
            name = created.rsplit("/", 1)[1]
            with cand.lock:
                withdrawn = cand.withdrawn
                if not withdrawn:
                    cand.vote = name
        if withdrawn:
            self._ur_delete_vote(name)

    def _ur_remove_orphans(self, cand: _Candidate) -> None:
        """Delete votes of our session holding ``cand``'s id that no candidate of ours knows: left
        by a creation whose answer was lost, they would block the election while we live."""
        election = self.paths.auditor_election
        votes = self._ur_votes()  # waits for a connection: then the session is known
        session = self._ur_session()
        if session is None:
            raise MetadataUnavailableError("looking for orphan auditor votes: no ZooKeeper session")
        with self._ur_mutex:
            known = {c.vote for c in self._ur_candidates}
        for name in votes:
            if name in known:
                continue
            got = self._ur_get(f"{election}/{name}")
            if got is not None and got[2] == session and got[0] == cand.candidate_id.encode():
                self._ur_delete_vote(name)
        cand.uncertain = False

    def _ur_remove_orphans_later(self, cand: _Candidate) -> None:
        """Worker thread: :meth:`_ur_remove_orphans` for a candidacy that failed, until it worked."""
        try:
            self._ur_remove_orphans(cand)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not look for orphan auditor votes (%s); retrying in %g s", e, RETRY_S)
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_remove_orphans_later, cand))

    def _ur_delete_vote(self, name: str) -> None:
        try:
            self._ur_delete(f"{self.paths.auditor_election}/{name}")
        except NoNodeError:
            pass

    def _ur_step(self, cand: _Candidate) -> None:
        """Worker thread: stand if we have no vote, then see whether we lead; retry on errors."""
        cand.retry_pending = False
        if cand.withdrawn:
            return
        try:
            for _ in range(_RECHECKS_MAX):
                self._ur_stand(cand)
                if cand.withdrawn or self._ur_check(cand):
                    return
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("auditor election for %s: %s; retrying in %g s", cand.candidate_id, e, RETRY_S)
        if not cand.retry_pending and not cand.withdrawn:
            cand.retry_pending = True
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_step, cand))

    def _ur_check(self, cand: _Candidate) -> bool:
        """One look at the votes; True when settled (auditor, or watching our predecessor)."""
        vote = cand.vote
        if vote is None:
            return False
        votes = self._ur_votes()
        if vote not in votes:  # gone with a session we had not heard was lost yet
            with cand.lock:
                if cand.vote == vote:
                    cand.vote = None
            self._ur_tell(cand, False)
            return False
        index = votes.index(vote)
        if index == 0:
            self._ur_tell(cand, True)
            return True
        if self._ur_watch(f"{self.paths.auditor_election}/{votes[index - 1]}", cand.wake) is None:
            return False  # the one before us went meanwhile: look again
        self._ur_tell(cand, False)
        return True

    def _ur_lost(self, cand: _Candidate) -> None:
        """Worker thread: the session (and the vote with it) is gone; tell, then stand again."""
        with cand.lock:
            cand.vote = None
        self._ur_tell(cand, False)
        self._ur_step(cand)

    def _ur_tell(self, cand: _Candidate, is_auditor: bool) -> None:
        """Worker thread: tell ``on_change`` about a change of role (never twice the same)."""
        with cand.lock:
            if cand.is_auditor == is_auditor or (is_auditor and cand.withdrawn):
                return
            cand.is_auditor = is_auditor
        try:
            cand.on_change(is_auditor)
        except Exception:
            log.exception("auditor election callback %r failed", cand.on_change)

    def _ur_withdraw(self, cand: _Candidate) -> None:
        """Delete our vote (idempotent); the auditor is told False on the store's thread."""
        with cand.lock:
            if cand.withdrawn:
                return
            cand.withdrawn = True
            vote, cand.vote = cand.vote, None
        with self._ur_mutex:
            self._ur_candidates.discard(cand)
        self._ur_worker.submit(partial(self._ur_tell_withdrawn, cand))
        if vote is not None:
            self._ur_withdraw_vote(vote)

    def _ur_tell_withdrawn(self, cand: _Candidate) -> None:
        self._ur_tell(cand, False)

    def _ur_withdraw_vote(self, vote: str) -> None:
        """Delete a withdrawn candidate's vote, retrying in the background while ZooKeeper is
        unreachable: a vote left behind would keep the auditor's seat until our session ends."""
        try:
            self._ur_delete_vote(vote)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not delete auditor vote %s (%s); retrying in %g s", vote, e, RETRY_S)
            self._ur_worker.submit_later(RETRY_S, partial(self._ur_withdraw_vote, vote))
