"""What a stream reader's read-ahead thread hands its caller: the entries of one segment as read,
decoded only when taken, either into records (``read_batch``) or into Arrow columns
(``read_arrow_batch``, DESIGN §4.5), so that a catch-up read through Arrow builds no Python
object per record: a record set's txids and payload lengths are numpy views of the entry, and the
payload column is one buffer with int32 offsets (``pa.Array.from_buffers``).

A chunk knows the first position its caller wants (the reader's position, or the truncation point
if later): records before it are left out in both forms. The txid floor of ``start_txid`` is the
reader's (it holds until the first record that passes it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from .dlsn import DLSN, LogRecord
from .records import HEADER, HEADER_BYTES, columns

if TYPE_CHECKING:
    import pyarrow as pa

_NEW_DLSN = partial(tuple.__new__, DLSN)
_NEW_RECORD = partial(tuple.__new__, LogRecord)


AGE_MIN_RECORDS = 20_000   # a build at least this big moves what it made to the oldest generation


@contextmanager
def gc_paused(records: int = 0) -> Iterator[None]:
    """Python's cyclic collector off while a batch of ``records`` records is built. Each record is
    two new tuples the collector tracks, so building 100,000 of them set off collections that
    walked every live object again and again: a catch-up read_batch took 1.30 us of CPU per record
    with the collector on and 0.59-0.66 with it paused (730,000 -> 1,500,000 records/s). Records
    hold no cycles; nothing is left for the collector. A collector that is already off (the
    caller's choice) is left off; one this pause turned off is turned on again, whatever happens.

    Re-enabled, the collector would at once walk every object made during the pause: records and
    DLSNs are tuple subclasses, which it never untracks, and the walk for 100,000 records took
    0.22-0.27 us per record, a third of what building them costs, for objects their reference
    counts free soon after. So a build of AGE_MIN_RECORDS or more first collects the young
    generations (the caller's own recent objects are examined as always), then moves what the
    build made to the oldest generation unexamined: ``gc.freeze()`` and ``gc.unfreeze()``, in
    constant time. Not for small builds (a tailing reader's), so a process reading a record at a
    time keeps its young collections; not when the process froze objects of its own, which
    ``gc.unfreeze()`` would let go."""
    if not gc.isenabled():
        yield
        return
    age = records >= AGE_MIN_RECORDS and gc.get_freeze_count() == 0
    if age:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if age:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


BINARY_BYTES_MAX = (1 << 31) - 1   # int32 offsets of Arrow's `binary`


def arrow_schema() -> pa.Schema:
    """The columns of ``read_arrow_batch`` (pyarrow imported only when asked for)."""
    import pyarrow as pa

    return pa.schema([("segment", pa.int64()), ("entry_id", pa.int64()), ("slot", pa.int32()),
                      ("txid", pa.int64()), ("payload", pa.binary())])


class Chunk:
    """Entries ``(entry_id, bytes)`` of segment ``sequence``, in order; records from ``start`` on."""

    __slots__ = ("entries", "first_txid", "sequence", "start", "where")

    def __init__(self, sequence: int, first_txid: int, entries: list[tuple[int, bytes]], start: DLSN,
                 where: str) -> None:
        self.sequence, self.first_txid, self.entries = sequence, first_txid, entries
        self.start, self.where = start, where

    def _skip(self, entry_id: int) -> int | None:
        """Slots of this entry before ``start`` (None: the whole entry is before it)."""
        s = self.start
        if s.segment < self.sequence or entry_id > s.entry_id:
            return 0
        if s.segment > self.sequence or entry_id < s.entry_id:
            return None
        return s.slot

    def records(self) -> list[LogRecord]:
        with gc_paused(self._records_held()):
            return self._records()

    def _records_held(self) -> int:
        """Records in the chunk's entries by their headers (a guess for gc_paused: columns()
        checks each record set when it is decoded)."""
        return sum(HEADER.unpack_from(data)[3] for _, data in self.entries if len(data) >= HEADER_BYTES)

    def _records(self) -> list[LogRecord]:
        out: list[LogRecord] = []
        seq = self.sequence
        for entry_id, data in self.entries:
            skip = self._skip(entry_id)
            if skip is None:
                continue
            cols = columns(data, f"{self.where} segment {seq} entry {entry_id}", self.first_txid)
            n = cols.n
            if skip >= n:
                continue
            # NamedTuples built by tuple.__new__ through map: no Python code runs per record (their
            # own __new__ is a Python function): 0.33 us per record against 0.7 for LogRecord(...).
            ends = (cols.starts + cols.lengths).tolist()
            payloads = [data[a:b] for a, b in zip(cols.starts.tolist()[skip:], ends[skip:], strict=True)]
            dlsns = map(_NEW_DLSN, zip(repeat(seq, n - skip), repeat(entry_id, n - skip), range(skip, n), strict=True))
            out += map(_NEW_RECORD, zip(dlsns, cols.txids[skip:].tolist(), payloads, strict=True))
        return out

    def arrow(self) -> pa.RecordBatch:
        import pyarrow as pa

        ids, counts, skips, txids, lengths, parts = [], [], [], [], [], []
        for entry_id, data in self.entries:
            skip = self._skip(entry_id)
            if skip is None:
                continue
            cols = columns(data, f"{self.where} segment {self.sequence} entry {entry_id}", self.first_txid)
            if skip >= cols.n:
                continue
            ids.append(entry_id)
            counts.append(cols.n - skip)
            skips.append(skip)
            txids.append(cols.txids[skip:])
            lengths.append(cols.lengths[skip:])
            parts.append(memoryview(data)[int(cols.starts[skip]):])
        if not counts:
            return empty_arrow()
        n = int(sum(counts))
        counts_np = np.asarray(counts, dtype=np.int64)
        firsts = np.cumsum(counts_np) - counts_np
        slots = np.arange(n, dtype=np.int64) - np.repeat(firsts - np.asarray(skips, dtype=np.int64), counts_np)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        if offsets[-1] > BINARY_BYTES_MAX:
            raise ValueError(f"{offsets[-1]} payload bytes in one chunk: over Arrow binary's 2 GiB")
        payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                         pa.py_buffer(b"".join(parts))])
        return pa.RecordBatch.from_arrays(
            [_column(pa.int64(), np.full(n, self.sequence, dtype=np.int64)),
             _column(pa.int64(), np.repeat(np.asarray(ids, np.int64), counts_np)),
             _column(pa.int32(), slots.astype(np.int32)),
             _column(pa.int64(), np.ascontiguousarray(np.concatenate(txids), dtype=np.int64)), payload],
            schema=arrow_schema())


def _column(kind: pa.DataType, values: np.ndarray) -> pa.Array:
    """A numeric column over the numpy array's own memory. Not ``pa.array``: its first call
    imports pandas (0.3 s) to check for pandas types, which a reader never passes."""
    import pyarrow as pa

    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def empty_arrow() -> pa.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([], schema=arrow_schema())


def records_to_arrow(records: list[LogRecord]) -> pa.RecordBatch:
    """Records already decoded (a tiered segment's, or what ``read_batch`` left) as Arrow columns."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([r.dlsn.segment for r in records], pa.int64()), pa.array([r.dlsn.entry_id for r in records],
                                                                           pa.int64()),
         pa.array([r.dlsn.slot for r in records], pa.int32()), pa.array([r.txid for r in records], pa.int64()),
         pa.array([r.payload for r in records], pa.binary())], schema=arrow_schema())


def arrow_to_records(rb: pa.RecordBatch) -> list[LogRecord]:
    """The other way (a tiered segment's rows, or a caller that switches from ``read_arrow_batch``
    to ``read_batch``): records built as ``Chunk.records`` builds them, without a Python call each."""
    segments, entries, slots, txids = (rb.column(i).to_numpy(zero_copy_only=False).tolist() for i in range(4))
    payloads = rb.column(4).to_pylist()
    with gc_paused(rb.num_rows):
        dlsns = map(_NEW_DLSN, zip(segments, entries, slots, strict=True))
        return list(map(_NEW_RECORD, zip(dlsns, txids, payloads, strict=True)))
