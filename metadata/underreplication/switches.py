"""The switches of the under-replication store: replication enabled or disabled (the ``disable``
node, as BookKeeper's), and ``lostBookieRecoveryDelay`` with its watch. Written on the node layer,
like the queue and the election; watch reports come on the store's under-replication thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from metadata.errors import (
    InvalidMetadataError,
    MetadataError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
    StoreClosedError,
)
from metadata.layout import ZkLayout
from metadata.nodes import Nodes, Wake
from metadata.session import SessionEvent, SessionWorker
from metadata.underreplication.paths import CAS_TRIES_MAX, create_path
from metadata.underreplication.records import check_delay_s, decode_delay_s

log = logging.getLogger(__name__)

RETRY_S = 1.0  # delay-watch retry after a ZooKeeper error


@dataclass(eq=False)
class _DelayWatch:
    callback: Callable[[int], None]
    active: bool = True
    last: int | None = None
    retry_pending: bool = False
    wake: Wake = field(default=lambda _e: None)


class ReplicationSwitches:
    """The switches half of the under-replication store, on the store's thread ``worker``;
    ``poke`` wakes the store's waiting acquires (the disable switch changed)."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, worker: SessionWorker, poke: Callable[[], None]) -> None:
        self._nodes = nodes
        self._paths = paths
        self._worker = worker
        self._poke = poke
        self._mutex = threading.Lock()
        self._delay_watches: set[_DelayWatch] = set()
        self._disabled: bool | None = None  # cached existence of the disable node (None: look)
        self._disable_epoch = 0

    def on_session(self, event: str) -> None:
        """Session thread: the cached disable flag is fetched again; after a reconnection (watches
        may have been dropped with the connection) every delay watch is re-armed."""
        self._disable_changed()
        if event == SessionEvent.CONNECTED:
            with self._mutex:
                watches = list(self._delay_watches)
            for watch in watches:
                self._worker.submit(partial(self._rearm_delay, watch))

    def close(self) -> None:
        with self._mutex:
            for watch in self._delay_watches:
                watch.active = False
            self._delay_watches.clear()

    def disabled(self) -> bool:
        """Whether the ``disable`` node exists: cached until its watch fires."""
        with self._mutex:
            known, epoch = self._disabled, self._disable_epoch
        if known is not None:
            return known
        disabled = self._nodes.watch(self._paths.ur_disable, self._disable_changed) is not None
        with self._mutex:
            if self._disable_epoch == epoch:
                self._disabled = disabled
        return disabled

    def _disable_changed(self, _event: object = None) -> None:
        """The disable node's watch fired: look at it again on the next acquire."""
        with self._mutex:
            self._disabled = None
            self._disable_epoch += 1
        self._poke()

    def set_replication_enabled(self, enabled: bool) -> None:
        path = self._paths.ur_disable
        if enabled:
            try:
                self._nodes.delete(path)
            except NoNodeError:
                pass
        else:
            try:
                create_path(self._nodes, self._paths, path, b"")
            except NodeExistsError:
                pass
        self._disable_changed()  # our own change: no need to wait for its watch

    def is_replication_enabled(self) -> bool:
        enabled = self._nodes.get(self._paths.ur_disable) is None
        with self._mutex:
            if self._disabled is not None and self._disabled == enabled:
                self._disable_epoch += 1  # we saw it change before its watch said so: look again
                self._disabled = None
        return enabled

    def lost_bookie_recovery_delay_s(self) -> int:
        path = self._paths.ur_lost_bookie_recovery_delay
        got = self._nodes.get(path)
        return decode_delay_s(None if got is None else got[0], path)

    def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        data = str(check_delay_s(seconds)).encode()
        path = self._paths.ur_lost_bookie_recovery_delay
        for _ in range(CAS_TRIES_MAX):
            try:
                self._nodes.set(path, data, -1)
                return
            except NoNodeError:
                pass
            try:
                create_path(self._nodes, self._paths, path, data)
                return
            except NodeExistsError:
                pass
        raise MetadataUpdateConflictError(f"{path} kept appearing and disappearing")

    def watch_lost_bookie_recovery_delay(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Armed in the caller's thread (ZooKeeper down is the caller's error); every report,
        the first included, comes on the store's under-replication thread, without repeats."""
        watch = _DelayWatch(callback)
        watch.wake = lambda _event: self._worker.submit(partial(self._rearm_delay, watch))
        path = self._paths.ur_lost_bookie_recovery_delay
        got = self._nodes.watch(path, watch.wake)
        with self._mutex:
            self._delay_watches.add(watch)
        value = decode_delay_s(None if got is None else got[0], path)
        self._worker.submit(partial(self._deliver_delay, watch, value))

        def cancel() -> None:
            watch.active = False
            with self._mutex:
                self._delay_watches.discard(watch)

        return cancel

    def _rearm_delay(self, watch: _DelayWatch) -> None:
        watch.retry_pending = False
        if not watch.active:
            return
        path = self._paths.ur_lost_bookie_recovery_delay
        try:
            got = self._nodes.watch(path, watch.wake)
            value = decode_delay_s(None if got is None else got[0], path)
        except StoreClosedError:
            return
        except InvalidMetadataError as e:
            log.error("%s (ignored until it is fixed)", e)
            return
        except MetadataError as e:
            if not watch.retry_pending:
                watch.retry_pending = True
                log.warning("could not re-arm the lost bookie recovery delay watch (%s); retrying", e)
                self._worker.submit_later(RETRY_S, partial(self._rearm_delay, watch))
            return
        self._deliver_delay(watch, value)

    @staticmethod
    def _deliver_delay(watch: _DelayWatch, value: int) -> None:
        if not watch.active or value == watch.last:
            return
        watch.last = value
        try:
            watch.callback(value)
        except Exception:
            log.exception("lost bookie recovery delay callback %r failed", watch.callback)
