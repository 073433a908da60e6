"""Watches that stay armed: what ``watch_ledger_metadata`` and ``watch_bookies`` are made of.

The node layer's watches are one-shot (ZooKeeper's). A :class:`WatchKeeper` keeps each watch of a
store armed: it re-reads with a new watch after every event and after every reconnection (kazoo
forgets every watch when the connection drops), always on the keeper's thread, which is also
where the reports are delivered. The state objects turn the raw node states it reads into the
callbacks of the public API: decoded metadata, duplicates suppressed (a re-armed watch re-reads the
same state), exactly one end-of-watch report, nothing after cancel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from metadata.errors import InvalidMetadataError, MetadataError, NoNodeError, StoreClosedError
from metadata.model import TOMBSTONE, LedgerMetadata, decode
from metadata.nodes import Nodes
from metadata.session import SessionEvent, SessionWorker

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
            if data is None or data.startswith(TOMBSTONE):   # deleted, or marked deleted (tenants)
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


class WatchKeeper:
    """The kept watches of one store, and the thread (``<store>-watches``) that re-arms them and
    delivers their reports, one at a time, in order."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.worker = SessionWorker(nodes.thread_name("-watches"))
        self._lock = threading.Lock()
        self._watches: set[KeptWatch] = set()

    def session_event(self, event: str) -> None:
        """Session listener: after a reconnection every watch is re-armed, and then reports
        whatever changed meanwhile."""
        if event == SessionEvent.CONNECTED:
            with self._lock:
                watches = list(self._watches)
            for watch in watches:
                self.worker.submit(watch.refresh)

    def start(self, watch: KeptWatch) -> Callable[[], None]:
        """Keep ``watch`` (so a reconnection re-arms it) and arm it now, in the caller's thread
        so that an unreachable ZooKeeper or a missing cluster is the caller's error; returns its
        cancel function."""
        with self._lock:
            if self.nodes.closed:
                raise StoreClosedError("watch: the metadata store is closed")
            self._watches.add(watch)
        try:
            watch.arm(initial=True)
        except BaseException:
            watch.cancel()
            raise
        return watch.cancel

    def forget(self, watch: KeptWatch) -> None:
        """Stop re-arming ``watch`` (it was cancelled, or it ended)."""
        with self._lock:
            self._watches.discard(watch)

    def close(self) -> None:
        with self._lock:
            watches = list(self._watches)
            self._watches.clear()
        for watch in watches:
            watch.state.cancel()
        self.worker.close()


class KeptWatch:
    """A one-shot watch kept armed by a :class:`WatchKeeper`."""

    state: LedgerWatchState | BookiesWatchState

    def __init__(self, keeper: WatchKeeper) -> None:
        self.keeper = keeper

    def arm(self, *, initial: bool = False) -> None:
        """Read the watched state with a watch set, and queue its report."""
        raise NotImplementedError

    def wake(self, event: Any) -> None:
        """The node layer's thread: never block. An event without a path means the connection
        dropped (and every watch with it); the reconnection re-arms every watch, so nothing to do."""
        if getattr(event, "path", None) is not None and self.state.active:
            self.keeper.worker.submit(self.refresh)

    def refresh(self) -> None:
        if not self.state.active:
            return
        try:
            self.arm()
        except StoreClosedError:
            return
        except MetadataError as e:
            retry_s = self.keeper.nodes.retry_s
            log.warning("could not re-arm %r (%s); retrying in %g s", self, e, retry_s)
            self.keeper.worker.submit_later(retry_s, self.refresh)

    def cancel(self) -> None:
        self.state.cancel()
        self.keeper.forget(self)


class LedgerWatch(KeptWatch):
    """The node of one ledger's metadata; ends when the ledger is gone."""

    def __init__(self, keeper: WatchKeeper, state: LedgerWatchState, path: str) -> None:
        super().__init__(keeper)
        self.state: LedgerWatchState = state
        self.path = path

    def __repr__(self) -> str:
        return f"watch of ledger {self.state.ledger_id}"

    def arm(self, *, initial: bool = False) -> None:
        got = self.keeper.nodes.watch(self.path, self.wake, absent=False)
        if got is None:  # the ledger is gone: report it, the watch ends (nothing left armed)
            self.keeper.forget(self)
            self.keeper.worker.submit(partial(self.state.deliver, None, -1))
            return
        self.keeper.worker.submit(partial(self.state.deliver, got[0], got[1]))


class BookiesWatch(KeptWatch):
    """The children of ``available`` and ``available/readonly``."""

    def __init__(self, keeper: WatchKeeper, state: BookiesWatchState, writable: str, readonly: str,
                 root: str) -> None:
        super().__init__(keeper)
        self.state: BookiesWatchState = state
        self.paths = (writable, readonly)
        self.root = root

    def __repr__(self) -> str:
        return "watch of the registered bookies"

    def arm(self, *, initial: bool = False) -> None:
        listings = self.keeper.nodes.children_versioned(list(self.paths), watch=self.wake)
        for readonly, path, got in zip((False, True), self.paths, listings, strict=True):
            if got is None:
                if initial:
                    raise NoNodeError(f"no cluster at {self.root}: run `spark-bookie init` first")
                raise MetadataError(f"{path} disappeared")  # refresh retries until it is back
            names, cversion = got
            self.keeper.worker.submit(partial(self.state.deliver, readonly, names, cversion))
