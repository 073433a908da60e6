"""Disk usage watch: the read-only state machine and the thread that feeds it.

BookKeeper turns a bookie read-only when its ledger disks pass `diskUsageThreshold` and back to
writable only below the lower `diskUsageLwmThreshold`, so that a disk hovering at the threshold does
not flap between the two registrations. It also keeps room for what a full disk must still allow
(`minUsableSizeForIndexFileCreation`, `minUsableSizeForEntryLogCreation`): here the index reserve is
never written into by entry logs (LedgerStorage refuses such a flush) and an add is refused as soon
as its flush would eat into the reserves (see DiskState and DiskMonitor.has_room).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class DiskState:
    """Pure hysteresis: call `update(fraction_used, headroom_bytes)`; True when read-only-ness changed.

    ``headroom_bytes`` is what the ledger disk would have free once the write cache is flushed;
    below ``reserve_bytes`` (the index's and the entry logs' reserves) the bookie is full whatever
    the fraction says: on a small disk one flush can take it from under the threshold to 100%,
    and a disk with no room left for the index cannot even be opened again after a crash. It
    becomes writable again only with twice the reserve, so that it does not flap at the edge."""

    threshold: float
    lwm: float
    reserve_bytes: int = 0
    read_only: bool = False

    def update(self, used_fraction: float, headroom_bytes: int | None = None) -> bool:
        short = headroom_bytes is not None and headroom_bytes < self.reserve_bytes
        roomy = headroom_bytes is None or headroom_bytes >= 2 * self.reserve_bytes
        if not self.read_only and (used_fraction >= self.threshold or short):
            self.read_only = True
            return True
        if self.read_only and used_fraction < self.lwm and roomy:
            self.read_only = False
            return True
        return False


def used_fraction(dirs: Sequence[str]) -> tuple[float, int, int]:
    """(highest used fraction over `dirs`, free bytes of that disk, total bytes of that disk)."""
    worst = (0.0, 0, 0)
    for d in dirs:
        u = shutil.disk_usage(d)
        frac = (u.total - u.free) / u.total if u.total else 1.0
        if frac >= worst[0]:
            worst = (frac, u.free, u.total)
    return worst


def free_bytes(dirs: Sequence[str]) -> int:
    """The least free space over `dirs` (0 when one cannot be stat'ed)."""
    try:
        return min(shutil.disk_usage(d).free for d in dirs)
    except OSError:
        return 0


@dataclass(frozen=True)
class LedgerDiskRoom:
    """How the monitor tells, between its checks, whether an add still has room on the ledger
    disk: the free space it measured, less what the write cache holds now, less what flushes
    wrote since (``flushed_total``: bytes the entry logs took, a running count)."""

    dirs: tuple[str, ...]
    reserve_bytes: int
    unflushed: Callable[[], int]
    flushed_total: Callable[[], int]


class DiskMonitor:
    """Polls disk usage every `interval_ms` and reports transitions to `on_change(read_only)`.

    With `room`, it also answers `has_room(nbytes)` for every add (cheap: no system call) and can
    be woken early (`check_soon`) when an add finds none, so the bookie turns read-only before a
    flush could fill the disk, not a check interval later."""

    def __init__(self, dirs: Sequence[str], state: DiskState, interval_ms: int,
                 on_change: Callable[[bool], None],
                 measure: Callable[[Sequence[str]], tuple[float, int, int]] = used_fraction,
                 room: LedgerDiskRoom | None = None) -> None:
        self._dirs = list(dirs)
        self._state = state
        self._interval_s = interval_ms / 1000.0
        self._on_change = on_change
        self._measure = measure
        self._room = room
        self._free_at_check = 1 << 62
        self._flushed_at_check = 0
        self._refused_bytes = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def read_only(self) -> bool:
        return self._state.read_only

    def headroom_bytes(self) -> int | None:
        """Free ledger-disk bytes once the write cache is flushed (None without `room`)."""
        r = self._room
        if r is None:
            return None
        return self._free_at_check - (r.flushed_total() - self._flushed_at_check) - r.unflushed()

    def has_room(self, nbytes: int) -> bool:
        """Whether an add of `nbytes` may be taken (not read-only, and its flush would leave the
        reserves free). When not, the monitor checks again at once."""
        if self._state.read_only:
            return False
        head = self.headroom_bytes()
        if head is None or self._room is None or head - nbytes >= self._room.reserve_bytes:
            return True
        self._refused_bytes = max(self._refused_bytes, nbytes)  # the next check counts it as needed
        self.check_soon()
        return False

    def check_soon(self) -> None:
        self._wake.set()

    def check_once(self) -> None:
        with self._lock:
            try:
                frac, _free, _total = self._measure(self._dirs)
            except OSError as e:  # a disk that cannot even be stat'ed is not writable
                log.error("disk check failed on %s: %s", self._dirs, e)
                frac = 1.0
            r = self._room
            if r is not None:
                flushed = r.flushed_total()
                self._free_at_check, self._flushed_at_check = free_bytes(r.dirs), flushed
            head = self.headroom_bytes()
            if head is not None:  # an add refused for want of room: turn read-only, not writable-but-refusing
                head -= self._refused_bytes
            self._refused_bytes = 0
            if self._state.update(frac, head):
                log.warning("disk usage %.1f%% (threshold %.1f%%, lwm %.1f%%), %s after the write cache is "
                            "flushed (reserved %d): bookie is now %s", frac * 100, self._state.threshold * 100,
                            self._state.lwm * 100, "unknown free" if head is None else f"{head} bytes free",
                            self._state.reserve_bytes, "READ-ONLY" if self._state.read_only else "writable")
                self._on_change(self._state.read_only)

    def start(self) -> None:
        self.check_once()
        self._thread = threading.Thread(target=self._run, name="disk-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check_once()
            except Exception:  # the monitor must outlive a failing callback
                log.exception("disk monitor callback failed")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
