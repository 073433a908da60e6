"""Disk usage watch: the read-only state machine and the thread that feeds it.

BookKeeper turns a bookie read-only when its ledger disks pass `diskUsageThreshold` and back to
writable only below the lower `diskUsageLwmThreshold`, so that a disk hovering at the threshold does
not flap between the two registrations.
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
    """Pure hysteresis: call `update(fraction_used)`; it returns True when read-only-ness changed."""

    threshold: float
    lwm: float
    read_only: bool = False

    def update(self, used_fraction: float) -> bool:
        if not self.read_only and used_fraction >= self.threshold:
            self.read_only = True
            return True
        if self.read_only and used_fraction < self.lwm:
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


class DiskMonitor:
    """Polls disk usage every `interval_ms` and reports transitions to `on_change(read_only)`."""

    def __init__(self, dirs: Sequence[str], state: DiskState, interval_ms: int,
                 on_change: Callable[[bool], None],
                 measure: Callable[[Sequence[str]], tuple[float, int, int]] = used_fraction) -> None:
        self._dirs = list(dirs)
        self._state = state
        self._interval_s = interval_ms / 1000.0
        self._on_change = on_change
        self._measure = measure
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def read_only(self) -> bool:
        return self._state.read_only

    def check_once(self) -> None:
        try:
            frac, _free, _total = self._measure(self._dirs)
        except OSError as e:  # a disk that cannot even be stat'ed is not writable
            log.error("disk check failed on %s: %s", self._dirs, e)
            frac = 1.0
        if self._state.update(frac):
            log.warning("disk usage %.1f%% (threshold %.1f%%, lwm %.1f%%): bookie is now %s",
                        frac * 100, self._state.threshold * 100, self._state.lwm * 100,
                        "READ-ONLY" if self._state.read_only else "writable")
            self._on_change(self._state.read_only)

    def start(self) -> None:
        self.check_once()
        self._thread = threading.Thread(target=self._run, name="disk-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check_once()
            except Exception:  # the monitor must outlive a failing callback
                log.exception("disk monitor callback failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
