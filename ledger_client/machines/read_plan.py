"""Which replica serves which entry of a striped fragment, and where a failed entry goes next.

A striped fragment (E > Qw) has no bookie holding a contiguous range: entry e lives on the Qw
bookies of its write set. Reading it one entry at a time costs a round trip per entry (~70x slower
than a range read of an unstriped fragment); instead every entry is given to one replica of its
write set, each bookie gets one listed read (``ReadRangeRequest.entry_ids``) per chunk of the
entries it serves, all bookies are asked at once, and the answers are put back in order.

This module decides, without I/O (tests/unit/test_read_plan.py):
- the first replica of each entry: ``write_set(e)`` rotated by ``(chunk number + rotation) mod Qw``,
  so one scan spreads evenly over the whole ensemble and repeated scans start on other replicas;
- what an answer means for each entry it was asked for (a listed answer is a prefix of the asked
  ids cut by the bookie's byte limit, minus the entries the bookie does not hold): a returned body
  that passed its check is done; an id below the last returned one and missing is not held there;
  an id past it was cut by the byte limit and is asked again from the same bookie;
- failover: an entry a bookie failed to give (error, absent, bad digest) goes to the next replica
  of its write set; speculation asks the next replica without counting a failure; an entry fails
  once every replica has been asked and none of them is still in flight.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class Miss(enum.Enum):
    """Why a replica did not give an entry (the last word decides the reader's error type)."""

    ABSENT = "absent"        # the bookie does not hold it (ENOENTRY / left out of a listed answer)
    CORRUPT = "corrupt"      # its copy failed the header or digest check
    ERROR = "error"          # the request failed (connection, timeout, refusal)


@dataclass(frozen=True)
class Ask:
    """One listed read to send: ensemble index and the ascending entry ids to ask it for."""

    index: int
    entry_ids: tuple[int, ...]


class StripedRead:
    """The state of reading entries first..last of one fragment (see the module docstring).

    Scans hand it hundreds of thousands of entries, so the per-entry state lives in numpy arrays
    and only the rare misses are handled entry by entry in Python."""

    def __init__(self, first: int, last: int, ensemble_size: int, write_quorum_size: int, *,
                 rotation: int = 0, chunk_entries: int = 2_000) -> None:
        if not (0 <= first <= last) or not (1 <= write_quorum_size <= ensemble_size) or chunk_entries < 1:
            raise ValueError(f"bad striped read [{first}, {last}] E={ensemble_size} Qw={write_quorum_size}")
        self.first, self.last = first, last
        self.chunk = chunk_entries
        self._e, self._qw = ensemble_size, write_quorum_size
        n = last - first + 1
        rel = np.arange(n, dtype=np.int64)
        self._k = (rel // chunk_entries + rotation) % write_quorum_size   # where in its write set e starts
        self._next = np.zeros(n, dtype=np.int64)       # replicas asked so far
        self._in_flight = np.zeros(n, dtype=np.int64)
        self._settled = np.zeros(n, dtype=bool)        # read, or failed for good
        self._misses: dict[int, list[Miss]] = {}
        self.remaining = n
        self.failed: dict[int, list[Miss]] = {}

    def _replica(self, rel: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Ensemble index of the pos-th replica asked for entries first + rel."""
        return (self.first + rel + (self._k[rel] + pos) % self._qw) % self._e

    # ------------------------------------------------------------------ asking

    def initial(self) -> list[Ask]:
        """Every entry asked of its first replica, in chunks, chunk by chunk so early entries come first."""
        return self._ask(np.arange(self.last - self.first + 1, dtype=np.int64))

    def speculate(self, ask: Ask) -> list[Ask]:
        """``ask`` is slow: also ask the next replica of each of its entries still wanted."""
        rel = np.asarray(ask.entry_ids, dtype=np.int64) - self.first
        return self._ask(rel[~self._settled[rel] & (self._next[rel] < self._qw)])

    def _ask(self, rel: np.ndarray, same_index: int | None = None) -> list[Ask]:
        if not len(rel):
            return []
        if same_index is None:
            target = self._replica(rel, self._next[rel])
            self._next[rel] += 1
        else:
            target = np.full(len(rel), same_index, dtype=np.int64)
        self._in_flight[rel] += 1
        out: list[Ask] = []
        for index in np.unique(target).tolist():
            ids = (np.sort(rel[target == index]) + self.first).tolist()
            out += [Ask(index, tuple(ids[i:i + self.chunk])) for i in range(0, len(ids), self.chunk)]
        out.sort(key=lambda a: a.entry_ids[0])
        return out

    # ------------------------------------------------------------------ answers

    def on_answer(self, ask: Ask, returned: Sequence[int] | np.ndarray, good: Sequence[bool] | np.ndarray) -> list[Ask]:
        """A listed read answered with bodies for ``returned`` (ascending), ``good[i]`` saying whether
        body i passed its check. Returns the reads to send next."""
        if not len(returned):
            return self.on_failure(ask, Miss.ABSENT)
        asked = np.asarray(ask.entry_ids, dtype=np.int64) - self.first
        ret = np.asarray(returned, dtype=np.int64) - self.first
        ok = np.asarray(good, dtype=bool)
        self._in_flight[asked] -= 1
        got = ret[ok]
        fresh = got[~self._settled[got]]
        self._settled[fresh] = True
        self.remaining -= len(fresh)
        rest = asked[~np.isin(asked, got)]
        top = ret[-1]
        cut = rest[rest > top]                      # cut by the byte limit: not an answer about them
        corrupt = set((ret[~ok] + self.first).tolist())
        elsewhere: list[int] = []
        for r in rest[rest <= top].tolist():
            self._miss(r, Miss.CORRUPT if r + self.first in corrupt else Miss.ABSENT, elsewhere)
        return self._ask(cut[~self._settled[cut]], ask.index) + self._ask(np.asarray(elsewhere, dtype=np.int64))

    def on_failure(self, ask: Ask, why: Miss) -> list[Ask]:
        """The whole read failed (``why``): its entries go to their next replicas."""
        asked = np.asarray(ask.entry_ids, dtype=np.int64) - self.first
        self._in_flight[asked] -= 1
        elsewhere: list[int] = []
        for r in asked[~self._settled[asked]].tolist():
            self._miss(r, why, elsewhere)
        return self._ask(np.asarray(elsewhere, dtype=np.int64))

    def _miss(self, r: int, why: Miss, elsewhere: list[int]) -> None:
        if self._settled[r]:
            return
        misses = self._misses.setdefault(r, [])
        misses.append(why)
        if self._next[r] < self._qw:
            elsewhere.append(r)
        elif self._in_flight[r] == 0:
            self.failed[r + self.first] = misses
            self._settled[r] = True
            self.remaining -= 1

    @property
    def finished(self) -> bool:
        """Every entry either read or failed for good."""
        return self.remaining == 0

    def replicas_asked(self, e: int) -> list[int]:
        r = np.asarray([e - self.first], dtype=np.int64)
        return [int(self._replica(r, np.asarray([p]))[0]) for p in range(int(self._next[r[0]]))]
