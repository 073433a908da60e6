"""Ledger entries as Arrow record batches (DESIGN §4.1 ``ReadHandle.read_arrow``).

Scans (Spark, compaction into Delta, benchmarks) read millions of entries; one ``LedgerEntry`` per
entry and a Python-level digest object per entry would cap them far below what the bookies serve.
So this reader keeps entries as raw framed bodies from batched range reads, checks them in bulk
(``body_check``), and builds the ``payload`` column from one concatenated buffer plus an offsets array
(``pa.Array.from_buffers``): no per-entry objects survive into the result. Chunks of one fragment
are read from different replicas in parallel, so the bookies' disk and network work overlap with
the client's checking.

Failure handling is the same as ``ReadHandle.read``: a replica that answers with an error, a gap or
a copy that fails its header or digest check is skipped from that entry on and the next replica is
asked; whatever no range read could supply falls back to the per-entry reads with speculative
failover. Striped fragments (E > Qw: no bookie holds a contiguous range) are read with listed
reads to every bookie at once (``listed_read``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from . import errors
from .body_check import BodyChecker
from .listed_read import read_striped
from .protocol import bookkeeper_pb2 as pb
from .protocol.checks import invariant

if TYPE_CHECKING:
    from .read_handle import ReadHandle

SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary())])
"""The columns of every batch: exactly these Arrow types (Spark checks them: binary, not binary_view)."""

_BINARY_BYTES_MAX = (1 << 31) - 1   # int32 offsets of Arrow's `binary`
_PARALLEL_READS_MAX = 4             # range reads in flight per fragment (one per replica, at most this many)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], pa.int64()), pa.array([], pa.int64()), pa.array([], pa.binary())], schema=SCHEMA)


def batch_of(ledger_id: int, first_entry_id: int, payload: pa.Array) -> pa.RecordBatch:
    """A batch of consecutive entries first_entry_id.. of one ledger (ids built with numpy)."""
    n = len(payload)
    ids = pa.array(np.arange(first_entry_id, first_entry_id + n, dtype=np.int64))
    lids = pa.array(np.full(n, ledger_id, dtype=np.int64))
    return pa.RecordBatch.from_arrays([lids, ids, payload], schema=SCHEMA)


def payload_array(payloads: Sequence[bytes]) -> pa.Array:
    """A `binary` array over one concatenated buffer + int32 offsets (no per-value Arrow scalars)."""
    m = len(payloads)
    lens = np.fromiter(map(len, payloads), dtype=np.int64, count=m)
    total = int(lens.sum())
    if total > _BINARY_BYTES_MAX:
        raise errors.IncorrectParameterError(
            f"{total} payload bytes do not fit one Arrow binary column (2 GiB); read a smaller range")
    offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(payloads))])


def _concat(parts: list[pa.Array]) -> pa.Array:
    if not parts:
        return pa.array([], pa.binary())
    if len(parts) == 1:
        return parts[0]
    total = sum(p.nbytes for p in parts)
    if total > _BINARY_BYTES_MAX:
        raise errors.IncorrectParameterError(
            f"about {total} payload bytes do not fit one Arrow binary column (2 GiB); read a smaller range")
    return pa.concat_arrays(parts)


class ArrowScan:
    """One read_arrow call on a handle: fragments → chunks → verified payload arrays."""

    def __init__(self, handle: ReadHandle) -> None:
        self.h = handle
        md = handle.metadata
        self.checker = BodyChecker(handle.ledger_id, md.digest_type, handle.digester.password)

    def payloads(self, first: int, last: int) -> pa.Array:
        try:
            return _concat(self._fragments(first, last))
        except errors.NoSuchEntryError:
            if self.h.is_closed:
                raise
            self.h.refresh_metadata()  # an ensemble change may have moved newer entries
            return _concat(self._fragments(first, last))

    def _fragments(self, first: int, last: int) -> list[pa.Array]:
        md = self.h.metadata
        keys = sorted(md.ensembles)
        out: list[pa.Array] = []
        e = first
        while e <= last:
            k = max(key for key in keys if key <= e)
            nxt = [key for key in keys if key > k]
            end = min(last, nxt[0] - 1) if nxt else last
            bookies = list(md.ensembles[k])
            if md.ensemble_size == md.write_quorum_size:
                out += self._range_reads(e, end, bookies)
            else:
                out.append(payload_array(read_striped(self.h, e, end, bookies)))
            e = end + 1
        return out

    def _range_reads(self, first: int, last: int, bookies: list[str]) -> list[pa.Array]:
        """Chunks of the fragment read in parallel, chunk i first from replica (start + i) mod n."""
        step = max(1, self.h.client_config.read_batch_entries_max)
        chunks = [(s, min(last, s + step - 1)) for s in range(first, last + 1, step)]
        start = self.h.next_rotation()
        if len(chunks) == 1:
            return self._chunk(chunks[0][0], chunks[0][1], bookies, start)
        depth = min(_PARALLEL_READS_MAX, len(bookies), len(chunks))
        out: list[pa.Array] = []
        with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="read-arrow") as pool:
            window: deque[Future[list[pa.Array]]] = deque()
            for i, (a, b) in enumerate(chunks):
                window.append(pool.submit(self._chunk, a, b, bookies, start + i))
                if len(window) >= 2 * depth:
                    out += window.popleft().result()
            while window:
                out += window.popleft().result()
        return out

    def _chunk(self, first: int, last: int, bookies: list[str], start: int) -> list[pa.Array]:
        """first..last from replicas in turn (skipping errors, gaps and bad copies), then per entry."""
        h, n = self.h, len(bookies)
        out: list[pa.Array] = []
        e = first
        for i in range(n):
            bookie = bookies[(start + i) % n]
            while e <= last:
                try:
                    resp = h.bookie(bookie).read_range(h.ledger_id, e, last, h.client_config.read_batch_bytes_max)
                except errors.LedgerError:
                    break
                if resp.status != pb.EOK or not resp.bodies:
                    break
                bodies = list(resp.bodies)[: last - e + 1]
                payloads, k = self.checker.valid_prefix(e, bodies)
                if k:
                    out.append(payload_array(payloads))
                    e += k
                if k < len(bodies):
                    break  # this replica's copy is corrupt here: ask the next one from e
            if e > last:
                return out
        out.append(payload_array([x.data for x in h.entry_reads(e, last, bookies)]))
        return out


def read_arrow(handle: ReadHandle, first: int, last: int) -> pa.RecordBatch:
    """Entries first..last of the handle's ledger as one batch (see ReadHandle.read_arrow)."""
    if last == first - 1 and isinstance(first, int) and first >= 0:
        return empty_batch()
    payload = ArrowScan(handle).payloads(first, last)
    invariant(len(payload) == last - first + 1,
              f"read_arrow {handle.ledger_id}/{first}..{last} built {len(payload)} rows")
    return batch_of(handle.ledger_id, first, payload)
