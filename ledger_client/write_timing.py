"""Small helpers of the writer's timing (ledger_client.write_handle): when completed entries were
sent, for add timeouts, and whether a bookie that failed the writer answers again."""

from __future__ import annotations

import bisect
import socket

PROBE_TIMEOUT_S = 1.0      # a bookie that failed us is back when its port accepts a connection this fast


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
