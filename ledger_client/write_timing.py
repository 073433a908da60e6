"""Small helpers of the writer's timing (ledger_client.write_handle): when completed entries were
sent, for add timeouts, and whether a bookie that failed the writer answers again."""

from __future__ import annotations

import bisect
import socket
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .machines import AddState

PROBE_TIMEOUT_S = 1.0      # a bookie that failed us is back when its port accepts a connection this fast
PROBE_RETRY_S = 1.0        # a probe that found the port closed is not repeated sooner
REJOIN_BACKOFF_MAX_S = 60.0  # a bookie taken back and failing again waits 1, 2, 4 ... up to this before the next


class SendClock:
    """When entries were sent, to a ticker period: marks (next entry id, time), one per tick that
    saw appends. A completed entry keeps no send time (per-entry state costs every append), but
    its age is known from the marks: it was sent before the first mark whose id is above it."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._times: list[float] = []

    def tick(self, next_id: int, now: float, keep_s: float) -> None:
        if self._ids and self._ids[-1] == next_id:
            return
        self._ids.append(next_id)
        self._times.append(now)
        cut = bisect.bisect_left(self._times, now - keep_s) - 1   # keep the newest mark older than keep_s
        if cut > 0:
            del self._ids[:cut], self._times[:cut]

    def sent_before(self, entry_id: int) -> float | None:
        """A time `entry_id` was sent before (None: sent after the last mark)."""
        i = bisect.bisect_right(self._ids, entry_id)
        return self._times[i] if i < len(self._ids) else None


def late_bookies(sm: AddState, sent_at: dict[int, float], clock: SendClock, now: float, limit: float) -> set[str]:
    """Bookies owing an ack for an entry sent ``limit`` seconds ago or more: of a pending entry
    (``sent_at``, oldest first) or of a completed one (``sm.owed``)."""
    live = set(sm.ensemble) - sm.failed - sm.delayed
    late: set[str] = set()
    for eid, t in sent_at.items():
        if now - t < limit or late >= live:
            break
        late.update(sm.unacked(eid))
    for b, (eid, _newest) in sm.owed.items():
        sent = clock.sent_before(eid)
        if b in live and sent is not None and now - sent >= limit:
            late.add(b)
    return late


class StallClock:
    """How long appends have waited for lack of bookies (a write set with fewer than Qa live
    ones, no spare): the clock runs while that lasts."""

    def __init__(self) -> None:
        self._since: float | None = None

    def reset(self) -> None:
        self._since = None

    def due(self, sm: AddState, now: float, timeout_s: float) -> bool:
        """True once the stall has lasted ``timeout_s`` (then the clock starts over: the handle
        is failing)."""
        if not (sm.pending and sm.quorum_lost):
            self._since = None
            return False
        if self._since is None:
            self._since = now
        if sm.changing or now - self._since < timeout_s:
            return False
        self._since = None
        return True


class BookieProbes:
    """The bookies that failed a writer: suspect (not a spare) until a probe finds their port open,
    and when each may be probed next. A delayed bookie that was taken back and failed again waits
    1, 2, 4 ... up to REJOIN_BACKOFF_MAX_S before its next probe, so a bookie that keeps failing
    cannot make a new fragment every add timeout. Thread-safe (a lock of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._suspect: set[str] = set()
        self._probe_at: dict[str, float] = {}   # delayed or suspect bookie -> when it may be probed next
        self._rejoins: dict[str, int] = {}      # bookie -> times taken back (its probe backoff)

    def failed(self, bookie: str) -> None:
        with self._lock:
            self._suspect.add(bookie)

    def suspects(self) -> set[str]:
        with self._lock:
            return set(self._suspect)

    def is_suspect(self, bookie: str) -> bool:
        with self._lock:
            return bookie in self._suspect

    def rejoined(self, bookies: Collection[str]) -> None:
        """``bookies`` were taken back into the ensemble (a later failure backs off longer)."""
        with self._lock:
            for b in bookies:
                self._rejoins[b] = self._rejoins.get(b, 0) + 1

    def schedule(self, delayed: Collection[str], still_delayed: Collection[str], now: float) -> None:
        """When each newly ``delayed`` bookie may be probed; forget those neither still delayed nor
        suspect."""
        with self._lock:
            for b in delayed:
                if b not in self._probe_at:
                    self._probe_at[b] = now + min(REJOIN_BACKOFF_MAX_S, 2.0 ** self._rejoins.get(b, 0))
            for b in list(self._probe_at):
                if b not in still_delayed and b not in self._suspect:
                    del self._probe_at[b]

    def answers(self, bookie: str) -> bool:
        """Probe a bookie that failed us, when its time has come: does its port accept a
        connection? It stops being suspect if so."""
        with self._lock:
            if time.monotonic() < self._probe_at.get(bookie, 0.0):
                return False
        if not port_answers(bookie, PROBE_TIMEOUT_S):
            with self._lock:
                self._probe_at[bookie] = time.monotonic() + PROBE_RETRY_S
            return False
        with self._lock:
            self._suspect.discard(bookie)
        return True


def port_answers(bookie_id: str, timeout_s: float) -> bool:
    """Does the bookie's address ("host:port") accept a connection within `timeout_s`? Cheaper and
    quicker to tell than a gRPC call, whose channel backs off reconnecting to a bookie that was
    down (its next try can be tens of seconds after the bookie is back)."""
    host, _, port = bookie_id.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
