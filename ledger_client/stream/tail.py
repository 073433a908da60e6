"""The segment in progress, polled by the thread that waits for its records.

A StreamReader's read-ahead thread reads sealed segments and whatever is confirmed ahead of the
reader. At the tail (nothing confirmed past its position) it used to long-poll the bookies itself
and queue what came: each record crossed two thread hand-offs in the reader (the connection's
thread to the read-ahead thread, then to the caller), and at 1,000 records/s on this 2-core host
the caller was woken 0.14-0.18 ms (p50) after the read-ahead thread, which then competed with it
for the GIL to send its next poll. Now the read-ahead thread hands the tail over (a ``Tail`` on
the queue, behind everything read before it) and waits; the caller's own ``read_batch`` polls,
so an answer wakes the one thread that returns it. The caller gives the tail back when the
stream's metadata is due to be read again, since the segment may have been sealed, rolled or
truncated (every VIEW_MAX_AGE_S while records come, LONG_POLL_MS while none do), or when a poll
failed; the read-ahead thread goes on from the position the caller reached.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..errors import LedgerError
from .chunks import Chunk
from .dlsn import DLSN

if TYPE_CHECKING:
    from metadata.streams import SegmentMeta

    from ..read_handle import ReadHandle

HAND_BACK_WAIT_S = 0.1   # how often the waiting read-ahead thread looks at the reader's stop event


class Tail:
    """The segment in progress from ``pos`` on, while the caller polls it."""

    __slots__ = ("_back", "_cond", "_error", "entries", "handle", "moved", "pos", "seg", "since", "start_floor",
                 "where")

    def __init__(self, seg: SegmentMeta, pos: DLSN, start_floor: DLSN, handle: ReadHandle, where: str,
                 entries: int) -> None:
        """``entries``: at most this many per poll (the reader's CHUNK_ENTRIES)."""
        self.seg, self.pos, self.handle, self.where, self.entries = seg, pos, handle, where, entries
        self.start_floor = start_floor    # the truncation point when handed over (records before it are left out)
        self.since = time.monotonic()     # when the read-ahead thread last read the stream's metadata
        self.moved = False                # whether a poll brought anything
        self._cond = threading.Condition()
        self._back: DLSN | None = None
        self._error: LedgerError | None = None

    def poll(self, wait_ms: int, cancel: threading.Event) -> Chunk | None:
        """One long poll from ``pos`` (waiting up to ``wait_ms``): the entries confirmed, as a
        chunk, and ``pos`` past them; None when none came. LedgerError as poll_entries raises it."""
        first = self.pos.entry_id
        entries = self.handle.poll_entries(first, first + self.entries - 1, wait_ms, cancel)
        if not entries:
            return None
        chunk = Chunk(self.seg.sequence, self.seg.first_txid, [(e.entry_id, e.data) for e in entries],
                      max(self.pos, self.start_floor), self.where)
        self.pos = DLSN(self.seg.sequence, entries[-1].entry_id + 1, 0)
        self.moved = True
        return chunk

    def give_back(self, error: LedgerError | None = None) -> None:
        """The caller is done with the tail: the read-ahead thread goes on from ``pos``, or meets
        ``error`` (a failed poll) as if its own read had failed (retried, or the reader's end)."""
        with self._cond:
            self._back, self._error = self.pos, error
            self._cond.notify_all()

    def wait_back(self, stop: threading.Event) -> DLSN | None:
        """The read-ahead thread: the position the caller gave the tail back at; None once ``stop``.
        Raises the error of the poll that made the caller give it back."""
        with self._cond:
            while self._back is None:
                if stop.is_set():
                    return None
                self._cond.wait(HAND_BACK_WAIT_S)
            if self._error is not None:
                raise self._error
            return self._back
