"""A reader's subscription commits, batched (DESIGN §4.11): cheap enough to call per record.

``commit(dlsn)`` only notes the highest position asked for; at most one ZooKeeper write per
``commit_interval_ms`` carries it (a timer armed by the first commit after a write), unless the
caller asks to sync (``commit(dlsn, sync=True)``, ``flush``), and closing writes the last one. A
crash thus loses at most the positions of the last interval, and a reader that resumes reads
those records again: at-least-once. Positions only move forward, here (a lower one is ignored at
once) and in ZooKeeper (the CAS of stream/subscriptions.py), so two readers of one subscription
committing in any order never move it back.

A write that fails for a passing reason (ZooKeeper away) keeps its position pending for the next
interval, and the futures of its commits wait for it; a subscription (or its stream) deleted
under the reader fails them with NoSuchSubscriptionError (NoSuchStreamError), and every later
commit raises it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from metadata.streams.model import Position

from .. import errors
from .subscriptions import check_not_past_end, commit_position

if TYPE_CHECKING:
    from .namespace import Namespace

log = logging.getLogger(__name__)

COMMIT_INTERVAL_MS = 1_000   # a reader's default: one ZooKeeper write a second at most


class Committer:
    """One reader's commits to one subscription. Thread-safe."""

    def __init__(self, ns: Namespace, stream: str, name: str, committed: Position, interval_ms: int) -> None:
        if not isinstance(interval_ms, int) or isinstance(interval_ms, bool) or interval_ms < 0:
            raise errors.IncorrectParameterError(f"commit_interval_ms must be a non-negative int, not {interval_ms!r}")
        self.ns, self.stream, self.name = ns, stream, name
        self._interval_s = interval_ms / 1000
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()   # one write at a time, in position order
        self._committed = committed           # the highest position known written
        self._pending: Position | None = None
        self._waiters: list[Future[None]] = []
        self._timer: threading.Timer | None = None
        self._written_at = time.monotonic()    # of the last write (opening may have created the subscription)
        self._error: errors.LedgerError | None = None   # a commit can never succeed again
        self._closed = False

    @property
    def committed(self) -> Position:
        return self._committed

    def commit(self, pos: Position, read_to: Position, *, sync: bool = False) -> Future[None]:
        """Note ``pos`` (``read_to``: the reader's position, past which a commit is checked against
        the stream's end first); a future done once a write carried it. ``sync``: write now."""
        if pos >= read_to:
            check_not_past_end(self.ns, self.stream, self.ns.view(self.stream), pos)
        fut: Future[None] = Future()
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise errors.StreamClosedError(f"the reader of subscription {self.name} is closed")
            if pos <= self._committed:
                fut.set_result(None)
                if not sync:
                    return fut
            else:
                if self._pending is None or pos > self._pending:
                    self._pending = pos
                self._waiters.append(fut)
                if not sync and self._timer is None:
                    delay = max(0.0, self._written_at + self._interval_s - time.monotonic())
                    self._timer = threading.Timer(delay, self._timed)
                    self._timer.daemon = True
                    self._timer.start()
        if sync:
            self.flush()
            fut.result()
        return fut

    def _timed(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self.flush()
        except errors.LedgerError as e:
            log.warning("stream %s/%s: subscription %s: commit failed: %s", self.ns.name, self.stream, self.name, e)

    def flush(self) -> None:
        """Write the pending position now (and wait for a write running)."""
        with self._write_lock:
            with self._lock:
                pos, waiters = self._pending, self._waiters
                self._pending, self._waiters = None, []
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            if pos is None:
                return
            try:
                commit_position(self.ns, self.stream, self.name, pos, create=False)
            except (errors.NoSuchSubscriptionError, errors.NoSuchStreamError, errors.NoSuchNamespaceError) as e:
                with self._lock:
                    self._error = e
                for f in waiters:
                    f.set_exception(e)
                raise
            except errors.LedgerError:
                with self._lock:   # keep it for the next interval
                    if self._pending is None or pos > self._pending:
                        self._pending = pos
                    self._waiters = waiters + self._waiters
                    self._rearm()
                raise
            finally:
                self._written_at = time.monotonic()
            with self._lock:
                self._committed = max(self._committed, pos)
        for f in waiters:
            f.set_result(None)

    def _rearm(self) -> None:
        """Under the lock: a timer for what is pending (a failed write's retry)."""
        if self._timer is None and not self._closed:
            self._timer = threading.Timer(max(self._interval_s, 0.1), self._timed)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        """Write the last commit; quiet (logged) when it fails."""
        try:
            self.flush()
        except errors.LedgerError as e:
            log.warning("stream %s/%s: subscription %s: last commit not written: %s", self.ns.name, self.stream,
                        self.name, e)
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_exception(errors.StreamClosedError(f"subscription {self.name}: reader closed before the commit "
                                                         "was written"))
