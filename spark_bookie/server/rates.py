"""Write rates per namespace, as the bookie enforces them (DESIGN §4.10): pure, the clock injected.

A rate is a bucket that may go into debt: every add batch is charged in full when it arrives and
is then held until the debt it leaves is paid off (``debt / rate`` seconds). Charging first and
waiting after keeps the long-run rate exact however large a batch is (a stream's entry may hold
thousands of records, more than any bucket), and several connections of one namespace queue up
behind each other's debt in arrival order, which is what a fair rate limiter owes them. The bucket
holds at most ``BURST_S`` of the rate, so that a writer trying twice the rate for 10 s gets within
1% of it, not 10% (Pulsar's publish rate limiter lets a whole second through).

A held batch is answered late, not refused: the client's window of unanswered adds fills and its
writes wait (never fail). One hold is at most ``HOLD_S_MAX``, below every add timeout; the debt
is kept, so the next batch waits for the rest.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

BURST_S = 0.1        # a bucket holds this much of its rate: the burst a quiet writer may send at once
HOLD_S_MAX = 5.0     # one batch waits at most this long (the debt past it is paid by the next batches)


class RateLimits(NamedTuple):
    """A namespace's write rates (None = unlimited), from its settings."""

    bytes_per_s: int | None
    records_per_s: int | None

    @property
    def unlimited(self) -> bool:
        return self.bytes_per_s is None and self.records_per_s is None


NO_LIMITS = RateLimits(None, None)


class DebtBucket:
    __slots__ = ("at", "level", "rate", "size")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = float(rate)
        self.size = self.rate * BURST_S
        self.level = self.size
        self.at = now

    def charge(self, amount: float, now: float) -> float:
        """Take ``amount``; seconds until the bucket is out of debt again (0: not in debt)."""
        if now > self.at:
            self.level = min(self.size, self.level + (now - self.at) * self.rate)
            self.at = now
        self.level -= amount
        return 0.0 if self.level >= 0 else -self.level / self.rate


class NamespaceRates:
    """Each limited namespace's buckets; thread-safe (every connection's thread charges here)."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[RateLimits, DebtBucket | None, DebtBucket | None]] = {}
        self._lock = threading.Lock()

    def charge(self, namespace: str, limits: RateLimits, nbytes: float, records: float, now: float) -> float:
        """Charge a batch of the namespace; how long to hold it (seconds, at most HOLD_S_MAX).
        Changed limits start fresh buckets (full)."""
        if limits.unlimited:
            return 0.0
        with self._lock:
            got = self._buckets.get(namespace)
            if got is None or got[0] != limits:
                got = (limits, None if limits.bytes_per_s is None else DebtBucket(limits.bytes_per_s, now),
                       None if limits.records_per_s is None else DebtBucket(limits.records_per_s, now))
                self._buckets[namespace] = got
            _, by_bytes, by_records = got
            hold = 0.0
            if by_bytes is not None:
                hold = by_bytes.charge(nbytes, now)
            if by_records is not None:
                hold = max(hold, by_records.charge(records, now))
        return min(hold, HOLD_S_MAX)

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._buckets.pop(namespace, None)
