"""A store's session as its users see it: the events a session listener is told, and the one
thread on which a store runs its session chores in order.

Backends report state changes from their own threads (kazoo's connection thread, which must never
block, or the in-memory ensemble's); the chores (re-creating registrations, re-arming watches,
telling listeners) run on a :class:`SessionWorker` instead, in the order the events happened.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class SessionEvent(enum.StrEnum):
    """What a session listener is told; plain strings so callers can compare with "LOST" etc."""

    CONNECTED = "CONNECTED"  # connected (first time, after a suspension, or with a new session)
    SUSPENDED = "SUSPENDED"  # connection lost; the session (and its ephemerals) may still be alive
    LOST = "LOST"  # the session expired: its ephemeral nodes are gone (they will be re-created)


SessionListener = Callable[[str], None]


class SessionWorker:
    """A single background thread that runs session chores in order.

    Backends report state changes from their own threads (kazoo's connection thread, which must
    never block); the chores (telling listeners, re-creating registrations) run here instead, in
    the order the events happened, and may call back into the store.
    """

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._listeners: list[SessionListener] = []
        self._lock = threading.Lock()
        self._timers: set[threading.Timer] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add_listener(self, callback: SessionListener) -> None:
        with self._lock:
            self._listeners.append(callback)

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread (dropped once closed)."""
        with self._lock:
            if not self._closed:
                self._tasks.put(task)

    def submit_later(self, delay_s: float, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread after ``delay_s`` (used for retries)."""

        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
            self.submit(task)

        timer = threading.Timer(delay_s, fire)
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            self._timers.add(timer)
        timer.start()

    def notify(self, event: SessionEvent) -> None:
        """Queue telling every listener about ``event``."""
        self.submit(lambda: self._notify_now(event))

    def _notify_now(self, event: SessionEvent) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback(str(event))
            except Exception:
                log.exception("metadata session listener %r failed on %s", callback, event)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except Exception:
                log.exception("metadata session task failed")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after the queued tasks; safe to call from the worker thread itself."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timers = list(self._timers)
            self._timers.clear()
            self._tasks.put(None)
        for timer in timers:
            timer.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
