"""The auditor election of the under-replication store (BookKeeper's AuditorElector): ephemeral
sequential votes under ``underreplication/auditorelection``, the lowest is the auditor, every other
candidate watches the vote just below its own. Written on the node layer, so both backends share
it; it runs on the store's under-replication thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from metadata.errors import MetadataError, MetadataUnavailableError, NoNodeError, StoreClosedError
from metadata.layout import UR_VOTE_PREFIX, ZkLayout, vote_sequence
from metadata.nodes import Nodes, Wake
from metadata.session import SessionEvent, SessionWorker
from metadata.underreplication.paths import create_path

log = logging.getLogger(__name__)

RETRY_S = 1.0  # election retry after a ZooKeeper error
_RECHECKS_MAX = 20  # votes vanishing under us this many times in a row means retry later

#: ``on_change(is_auditor)``: told True when this candidate becomes the auditor and False when it
#: stops being it (session lost, withdrawn). Called on a store thread, one call at a time.
ElectionCallback = Callable[[bool], None]


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
    """The election half of the under-replication store, on the store's thread ``worker``."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, worker: SessionWorker) -> None:
        self._nodes = nodes
        self._paths = paths
        self._worker = worker
        self._mutex = threading.Lock()
        self._candidates: set[_Candidate] = set()

    def on_session(self, event: str) -> None:
        """Session thread. LOST: our votes are gone with the session: tell, then stand again.
        CONNECTED: watches may have been dropped with the connection: look again."""
        with self._mutex:
            candidates = list(self._candidates)
        for cand in candidates:
            if event == SessionEvent.LOST:
                self._worker.submit(partial(self._lost, cand))
            elif event == SessionEvent.CONNECTED:
                self._worker.submit(partial(self._step, cand))

    def close(self, *, tell: bool) -> None:
        """The store is closing (``tell``: tell the auditor it no longer is) or its process died."""
        with self._mutex:
            candidates = list(self._candidates)
            self._candidates.clear()
        for cand in candidates:
            with cand.lock:
                cand.withdrawn = True
            if tell:
                self._worker.submit(partial(self._tell, cand, False))

    def elect_auditor(self, candidate_id: str, on_change: ElectionCallback) -> Callable[[], None]:
        """BookKeeper's AuditorElector: an ephemeral sequential vote; the lowest is the auditor and
        every other candidate watches the vote just below its own (no herd when one goes).

        The first vote is cast in the caller's thread (ZooKeeper down or no cluster is the caller's
        error); everything after, and every ``on_change`` call, runs on the store's thread."""
        if not isinstance(candidate_id, str) or not candidate_id:
            raise ValueError(f"candidate id must be a non-empty string, got {candidate_id!r}")
        cand = _Candidate(candidate_id, on_change)
        cand.wake = lambda _event: self._worker.submit(partial(self._step, cand))
        with self._mutex:
            self._candidates.add(cand)
        try:
            self._stand(cand)
        except BaseException:
            self._withdraw(cand)
            if cand.uncertain:
                self._worker.submit(partial(self._remove_orphans_later, cand))
            raise
        self._worker.submit(partial(self._step, cand))
        return partial(self._withdraw, cand)

    def current_auditor(self) -> str | None:
        election = self._paths.auditor_election
        names = ordered_votes(self._nodes.children(election) or [])
        for name in names:  # the lowest may vanish between the listing and the read
            got = self._nodes.get(f"{election}/{name}")
            if got is not None:
                return got[0].decode(errors="replace")
        return None

    def _votes(self) -> list[str]:
        return ordered_votes(self._nodes.children(self._paths.auditor_election) or [])

    def _stand(self, cand: _Candidate) -> None:
        """Cast a vote for ``cand`` unless it has one (any thread; one creation at a time)."""
        with cand.stand_lock:
            if cand.vote is not None or cand.withdrawn:
                return
            if cand.uncertain:
                self._remove_orphans(cand)
            prefix = f"{self._paths.auditor_election}/{UR_VOTE_PREFIX}"
            try:
                created = create_path(self._nodes, self._paths, prefix, cand.candidate_id.encode(), ephemeral=True,
                                      sequential=True)
            except MetadataUnavailableError:
                cand.uncertain = True  # the vote may exist, unknown to us: clear it before the next
                raise
            name = created.rsplit("/", 1)[1]
            with cand.lock:
                withdrawn = cand.withdrawn
                if not withdrawn:
                    cand.vote = name
        if withdrawn:
            self._delete_vote(name)

    def _remove_orphans(self, cand: _Candidate) -> None:
        """Delete votes of our session holding ``cand``'s id that no candidate of ours knows: left
        by a creation whose answer was lost, they would block the election while we live."""
        election = self._paths.auditor_election
        votes = self._votes()  # waits for a connection: then the session is known
        session = self._nodes.session()
        if session is None:
            raise MetadataUnavailableError("looking for orphan auditor votes: no ZooKeeper session")
        with self._mutex:
            known = {c.vote for c in self._candidates}
        for name in votes:
            if name in known:
                continue
            got = self._nodes.get(f"{election}/{name}")
            if got is not None and got[2] == session and got[0] == cand.candidate_id.encode():
                self._delete_vote(name)
        cand.uncertain = False

    def _remove_orphans_later(self, cand: _Candidate) -> None:
        """Worker thread: :meth:`_remove_orphans` for a candidacy that failed, until it worked."""
        try:
            self._remove_orphans(cand)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not look for orphan auditor votes (%s); retrying in %g s", e, RETRY_S)
            self._worker.submit_later(RETRY_S, partial(self._remove_orphans_later, cand))

    def _delete_vote(self, name: str) -> None:
        try:
            self._nodes.delete(f"{self._paths.auditor_election}/{name}")
        except NoNodeError:
            pass

    def _step(self, cand: _Candidate) -> None:
        """Worker thread: stand if we have no vote, then see whether we lead; retry on errors."""
        cand.retry_pending = False
        if cand.withdrawn:
            return
        try:
            for _ in range(_RECHECKS_MAX):
                self._stand(cand)
                if cand.withdrawn or self._check(cand):
                    return
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("auditor election for %s: %s; retrying in %g s", cand.candidate_id, e, RETRY_S)
        if not cand.retry_pending and not cand.withdrawn:
            cand.retry_pending = True
            self._worker.submit_later(RETRY_S, partial(self._step, cand))

    def _check(self, cand: _Candidate) -> bool:
        """One look at the votes; True when settled (auditor, or watching our predecessor)."""
        vote = cand.vote
        if vote is None:
            return False
        votes = self._votes()
        if vote not in votes:  # gone with a session we had not heard was lost yet
            with cand.lock:
                if cand.vote == vote:
                    cand.vote = None
            self._tell(cand, False)
            return False
        index = votes.index(vote)
        if index == 0:
            self._tell(cand, True)
            return True
        if self._nodes.watch(f"{self._paths.auditor_election}/{votes[index - 1]}", cand.wake) is None:
            return False  # the one before us went meanwhile: look again
        self._tell(cand, False)
        return True

    def _lost(self, cand: _Candidate) -> None:
        """Worker thread: the session (and the vote with it) is gone; tell, then stand again."""
        with cand.lock:
            cand.vote = None
        self._tell(cand, False)
        self._step(cand)

    def _tell(self, cand: _Candidate, is_auditor: bool) -> None:
        """Worker thread: tell ``on_change`` about a change of role (never twice the same)."""
        with cand.lock:
            if cand.is_auditor == is_auditor or (is_auditor and cand.withdrawn):
                return
            cand.is_auditor = is_auditor
        try:
            cand.on_change(is_auditor)
        except Exception:
            log.exception("auditor election callback %r failed", cand.on_change)

    def _withdraw(self, cand: _Candidate) -> None:
        """Delete our vote (idempotent); the auditor is told False on the store's thread."""
        with cand.lock:
            if cand.withdrawn:
                return
            cand.withdrawn = True
            vote, cand.vote = cand.vote, None
        with self._mutex:
            self._candidates.discard(cand)
        self._worker.submit(partial(self._tell_withdrawn, cand))
        if vote is not None:
            self._withdraw_vote(vote)

    def _tell_withdrawn(self, cand: _Candidate) -> None:
        self._tell(cand, False)

    def _withdraw_vote(self, vote: str) -> None:
        """Delete a withdrawn candidate's vote, retrying in the background while ZooKeeper is
        unreachable: a vote left behind would keep the auditor's seat until our session ends."""
        try:
            self._delete_vote(vote)
        except StoreClosedError:
            return
        except MetadataError as e:
            log.warning("could not delete auditor vote %s (%s); retrying in %g s", vote, e, RETRY_S)
            self._worker.submit_later(RETRY_S, partial(self._withdraw_vote, vote))
