"""What a metadata watch reports, shared by both stores (pure bookkeeping, no I/O).

A backend observes raw node states (ZooKeeper one-shot watches re-armed after every event and
every reconnection, or the in-memory tree's change hook) and feeds them to these objects on the
store's watch thread. They turn them into the callbacks of the public API: decoded metadata,
duplicates suppressed (a re-armed watch re-reads the same state), exactly one end-of-watch
report, nothing after cancel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from metadata.errors import InvalidMetadataError
from metadata.model import LedgerMetadata, decode

log = logging.getLogger(__name__)

LedgerWatchCallback = Callable[[LedgerMetadata | None, int], None]
BookiesWatchCallback = Callable[[list[str], list[str]], None]


class LedgerWatchState:
    """One ``watch_ledger_metadata`` subscription.

    Reports ``(metadata, version)`` for each version newer than the last one reported (a state
    read by a slower re-arm never makes the report go backwards), and ``(None, -1)`` once when the
    ledger is gone, which ends the watch (ledger ids are never reused). Undecodable data is logged
    and skipped rather than ending the watch: a newer writer may fix it.
    """

    def __init__(self, ledger_id: int, callback: LedgerWatchCallback) -> None:
        self.ledger_id = ledger_id
        self._callback = callback
        self._lock = threading.Lock()
        self._last_version = -1
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def cancel(self) -> None:
        self._active = False

    def deliver(self, data: bytes | None, version: int) -> None:
        """Watch thread: report the node's state ``(data, version)`` (``data=None``: deleted)."""
        with self._lock:
            if not self._active:
                return
            if data is None:
                self._active = False
                md: LedgerMetadata | None = None
                version = -1
            else:
                if version <= self._last_version:
                    return
                self._last_version = version
                try:
                    md = decode(data, self.ledger_id)
                except InvalidMetadataError as e:
                    log.error("ledger %d watch: undecodable version %d: %s", self.ledger_id, version, e)
                    return
        try:
            self._callback(md, version)
        except Exception:
            log.exception("ledger %d metadata watch callback %r failed", self.ledger_id, self._callback)


class BookiesWatchState:
    """One ``watch_bookies`` subscription: ``(writable, readonly)`` whenever either list changes.

    The two lists come from two watched parents; nothing is reported until both were seen once,
    so the first report (made right after the watch is set) is complete. Each list comes with its
    parent's child version (ZooKeeper's ``cversion``) so a stale read never replaces a newer one.
    """

    def __init__(self, callback: BookiesWatchCallback) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._lists: dict[bool, tuple[int, list[str]]] = {}
        self._last: tuple[list[str], list[str]] | None = None
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def cancel(self) -> None:
        self._active = False

    def deliver(self, readonly: bool, names: list[str], cversion: int) -> None:
        """Watch thread: the children of ``available`` (readonly=False) or ``available/readonly``
        as of child version ``cversion``."""
        with self._lock:
            if not self._active:
                return
            seen = self._lists.get(readonly)
            if seen is not None and cversion < seen[0]:
                return
            self._lists[readonly] = (cversion, sorted(n for n in names if readonly or n != "readonly"))
            if len(self._lists) < 2:
                return
            now = (list(self._lists[False][1]), list(self._lists[True][1]))
            if now == self._last:
                return
            self._last = now
        try:
            self._callback(list(now[0]), list(now[1]))
        except Exception:
            log.exception("bookies watch callback %r failed", self._callback)
