"""Walking one ledger's entries in ascending id order through the storage's caches and blocks."""

from __future__ import annotations

from collections.abc import Callable

from spark_bookie.storage.entry_log import DecodedBlock


class BlockWalk:
    """Reads ascending entry ids of one ledger (get_range, get_entries): the decoded block of the
    last disk lookup is looked ahead in before the write caches and the index are asked. A block
    holds a ledger's entries in ascending order (a striped ledger's on one bookie are not
    consecutive), and entries are immutable, so any stored copy is the entry."""

    __slots__ = ("_cached", "_disk_lookup", "_lid", "_lids", "_eids", "_bodies", "_nxt")

    def __init__(self, ledger_id: int, cached: Callable[[int, int], bytes | None],
                 disk_lookup: Callable[[int, int], tuple[DecodedBlock, int] | None]) -> None:
        """`cached`: the write caches' copy, if any; `disk_lookup`: index, then the block read."""
        self._cached = cached
        self._disk_lookup = disk_lookup
        self._lid = ledger_id
        self._lids: tuple[int, ...] = ()
        self._eids: tuple[int, ...] = ()
        self._bodies: tuple[bytes, ...] = ()
        self._nxt = 0

    def body(self, entry_id: int) -> bytes | None:
        """The entry's body, or None if this bookie does not hold it."""
        lid, lids, eids, n = self._lid, self._lids, self._eids, self._nxt
        while n < len(eids) and lids[n] == lid and eids[n] < entry_id:
            n += 1
        if n < len(eids) and lids[n] == lid and eids[n] == entry_id:
            self._nxt = n + 1
            return self._bodies[n]
        self._nxt = n
        cached = self._cached(lid, entry_id)
        if cached is not None:
            return cached
        found = self._disk_lookup(lid, entry_id)
        if found is None:
            return None
        block, slot = found
        self._lids, self._eids, self._bodies, self._nxt = block.ledger_ids, block.entry_ids, block.bodies, slot + 1
        return block.bodies[slot]
