"""The switches of the under-replication store, as a mixin of
:class:`~metadata.underreplication.base.UnderReplicationBase`: replication enabled or disabled
(the ``disable`` node, as BookKeeper's), and ``lostBookieRecoveryDelay`` with its watch. Written on
the same backend primitives as the queue and the election; watch reports come on the store's
under-replication thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from metadata.errors import (
    InvalidMetadataError,
    MetadataError,
    MetadataUpdateConflictError,
    NodeExistsError,
    NoNodeError,
    StoreClosedError,
)
from metadata.layout import ZkLayout
from metadata.underreplication.records import check_delay_s, decode_delay_s

if TYPE_CHECKING:
    from metadata.store import SessionWorker

log = logging.getLogger(__name__)

RETRY_S = 1.0  # delay-watch retry after a ZooKeeper error
CAS_TRIES_MAX = 100  # lost races in a row before a change gives up

#: (data, version, ephemeral owner session or None), as the backends' primitives return nodes.
NodeState = tuple[bytes, int, int | None]
Wake = Callable[[object], None]


@dataclass(eq=False)
class _DelayWatch:
    callback: Callable[[int], None]
    active: bool = True
    last: int | None = None
    retry_pending: bool = False
    wake: Wake = field(default=lambda _e: None)


class ReplicationSwitches:
    """Mixin: the switches half of the store. Needs the base's primitives and its ``_ur_worker``,
    ``_ur_mutex``, ``_ur_delay_watches`` and the cached disable state (set up by ``_ur_init``)."""

    paths: ZkLayout
    _ur_worker: SessionWorker
    _ur_mutex: threading.Lock
    _ur_delay_watches: set[_DelayWatch]
    _ur_disabled: bool | None
    _ur_disable_epoch: int

    if TYPE_CHECKING:

        def _ur_get(self, path: str) -> NodeState | None: ...

        def _ur_set(self, path: str, data: bytes, version: int) -> int: ...

        def _ur_create_path(
            self, path: str, data: bytes, *, ephemeral: bool = False, sequential: bool = False
        ) -> str: ...

        def _ur_delete(self, path: str, version: int = -1, *, retry: bool = True) -> None: ...

        def _ur_watch(self, path: str, wake: Wake) -> NodeState | None: ...

        def _ur_disable_changed(self, _event: object = None) -> None: ...

    def set_replication_enabled(self, enabled: bool) -> None:
        path = self.paths.ur_disable
        if enabled:
            try:
                self._ur_delete(path)
            except NoNodeError:
                pass
        else:
            try:
                self._ur_create_path(path, b"")
            except NodeExistsError:
                pass
        self._ur_disable_changed()  # our own change: no need to wait for its watch

    def is_replication_enabled(self) -> bool:
        enabled = self._ur_get(self.paths.ur_disable) is None
        with self._ur_mutex:
            if self._ur_disabled is not None and self._ur_disabled == enabled:
                self._ur_disable_epoch += 1  # we saw it change before its watch said so: look again
                self._ur_disabled = None
        return enabled

    def lost_bookie_recovery_delay_s(self) -> int:
        path = self.paths.ur_lost_bookie_recovery_delay
        got = self._ur_get(path)
        return decode_delay_s(None if got is None else got[0], path)

    def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        data = str(check_delay_s(seconds)).encode()
        path = self.paths.ur_lost_bookie_recovery_delay
        for _ in range(CAS_TRIES_MAX):
            try:
                self._ur_set(path, data, -1)
                return
            except NoNodeError:
                pass
            try:
                self._ur_create_path(path, data)
                return
            except NodeExistsError:
                pass
        raise MetadataUpdateConflictError(f"{path} kept appearing and disappearing")

    def watch_lost_bookie_recovery_delay(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Armed in the caller's thread (ZooKeeper down is the caller's error); every report,
        the first included, comes on the store's under-replication thread, without repeats."""
        watch = _DelayWatch(callback)
        watch.wake = lambda _event: self._ur_worker.submit(partial(self._ur_rearm_delay, watch))
        path = self.paths.ur_lost_bookie_recovery_delay
        got = self._ur_watch(path, watch.wake)
        with self._ur_mutex:
            self._ur_delay_watches.add(watch)
        value = decode_delay_s(None if got is None else got[0], path)
        self._ur_worker.submit(partial(self._ur_deliver_delay, watch, value))

        def cancel() -> None:
            watch.active = False
            with self._ur_mutex:
                self._ur_delay_watches.discard(watch)

        return cancel

    def _ur_rearm_delay(self, watch: _DelayWatch) -> None:
        watch.retry_pending = False
        if not watch.active:
            return
        path = self.paths.ur_lost_bookie_recovery_delay
        try:
            got = self._ur_watch(path, watch.wake)
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
                self._ur_worker.submit_later(RETRY_S, partial(self._ur_rearm_delay, watch))
            return
        self._ur_deliver_delay(watch, value)

    @staticmethod
    def _ur_deliver_delay(watch: _DelayWatch, value: int) -> None:
        if not watch.active or value == watch.last:
            return
        watch.last = value
        try:
            watch.callback(value)
        except Exception:
            log.exception("lost bookie recovery delay callback %r failed", watch.callback)
