"""The write cache (entries since the last flush) and the read cache (decoded blocks, LRU).

Like DbLedgerStorage's WriteCache/ReadCache, but in Python terms: the write cache is a dict of
dicts (ledger -> entry -> body) so an add is two dict operations, a flush can sort each ledger's
entries cheaply (they arrive nearly in order) and deleting a ledger drops one inner dict.
Readers never lock the write cache: once a cache is swapped out for flushing it is never
mutated again, and the active one is only mutated under the storage's state lock (dict reads
concurrent with those writes are safe under the GIL).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from spark_bookie.storage.entry_log import DecodedBlock, entry_record_bytes

_BLOCK_OVERHEAD = 200  # fixed cost of a cached block (objects, tuples)
_ENTRY_OVERHEAD = 60  # per cached entry (bytes object header, tuple slots)


class WriteCache:
    """Entries added since the last flush, with the bytes they will take in an entry log."""

    __slots__ = ("entries", "size_bytes", "count")

    def __init__(self) -> None:
        self.entries: dict[int, dict[int, bytes]] = {}
        self.size_bytes = 0
        self.count = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        per = self.entries.get(ledger_id)
        return None if per is None else per.get(entry_id)

    def put(self, ledger_id: int, entry_id: int, body: bytes) -> None:
        """Idempotent: a replayed add of an entry already cached keeps the first copy."""
        per = self.entries.get(ledger_id)
        if per is None:
            per = self.entries[ledger_id] = {}
        elif entry_id in per:
            return
        per[entry_id] = body
        self.size_bytes += entry_record_bytes(len(body))
        self.count += 1

    def drop_ledger(self, ledger_id: int) -> None:
        per = self.entries.pop(ledger_id, None)
        if per:
            self.size_bytes -= sum(entry_record_bytes(len(b)) for b in per.values())
            self.count -= len(per)

    def max_entry(self, ledger_id: int) -> int:
        per = self.entries.get(ledger_id)
        return max(per) if per else -1

    def sorted_entries(self) -> list[tuple[int, int, bytes]]:
        """All entries ordered by (ledger_id, entry_id): the order blocks are written in."""
        out: list[tuple[int, int, bytes]] = []
        for lid in sorted(self.entries):
            per = self.entries[lid]
            out.extend((lid, eid, per[eid]) for eid in sorted(per))
        return out

    def __bool__(self) -> bool:
        return self.count > 0


class ReadCache:
    """Bounded LRU of decoded blocks keyed by (log_id, offset); budget in approximate bytes.

    Stale blocks (of a log deleted by compaction) are harmless — entries are immutable — but
    `drop_log` frees their memory early.
    """

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = max(0, bytes_max)
        self._blocks: OrderedDict[tuple[int, int], DecodedBlock] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def cost(block: DecodedBlock) -> int:
        return block.raw_len + _BLOCK_OVERHEAD + _ENTRY_OVERHEAD * len(block)

    def get(self, log_id: int, offset: int) -> DecodedBlock | None:
        key = (log_id, offset)
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                self.misses += 1
                return None
            self._blocks.move_to_end(key)
            self.hits += 1
            return block

    def put(self, log_id: int, offset: int, block: DecodedBlock) -> None:
        cost = self.cost(block)
        if cost > self.bytes_max:
            return
        key = (log_id, offset)
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._size -= self.cost(old)
            self._blocks[key] = block
            self._size += cost
            while self._size > self.bytes_max and self._blocks:
                _k, evicted = self._blocks.popitem(last=False)
                self._size -= self.cost(evicted)

    def drop_log(self, log_id: int) -> None:
        with self._lock:
            for key in [k for k in self._blocks if k[0] == log_id]:
                self._size -= self.cost(self._blocks.pop(key))

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._blocks)
