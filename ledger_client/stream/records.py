"""Record sets: many records in one ledger entry, which is what makes small records cheap.

Layout, version 1 (little-endian, columnar so that decoding is three numpy views and a slice
per payload, and so that an Arrow column can be built from the payloads without a copy each):

    magic 0xD1 | version 1 | flags | 0          4 bytes
    count                                      uint32
    records before                             uint64: records of this segment in earlier entries
    txids                                      count x int64
    lengths                                    count x uint32
    payloads                                   concatenated

``records before`` lets the last entry alone tell a segment's record count, which is what a new
writer needs to seal a dead writer's segment. Anything that is not exactly this is refused with
CorruptRecordSetError (it never yields a wrong record).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import CorruptRecordSetError

MAGIC = 0xD1
VERSION = 1
FLAG_CONTROL = 0x01          # a record set that carries no user records (reserved)
FLAG_SEGMENT_TXIDS = 0x02    # txids are offsets from the segment's first_txid (a Spark task's ledger, which
                             # cannot know the stream's txids when it writes: metadata/streams/linking.py)
KNOWN_FLAGS = FLAG_CONTROL | FLAG_SEGMENT_TXIDS
HEADER = struct.Struct("<BBBxIQ")
HEADER_BYTES = HEADER.size    # 16
RECORD_OVERHEAD_BYTES = 12    # txid + length


def encode(txids: Sequence[int], payloads: Sequence[bytes], records_before: int, flags: int = 0) -> bytes:
    """One entry's record set."""
    n = len(payloads)
    if len(txids) != n:
        raise ValueError("one txid per payload")
    return b"".join((HEADER.pack(MAGIC, VERSION, flags, n, records_before),
                     np.asarray(txids, dtype="<i8").tobytes(),
                     np.fromiter(map(len, payloads), dtype="<u4", count=n).tobytes(), *payloads))


def encode_columns(txids: np.ndarray, lengths: np.ndarray, payloads: bytes | memoryview, records_before: int,
                   flags: int = 0) -> bytes:
    """One entry's record set from columns: txids, payload lengths and the payloads' bytes end to
    end (an Arrow binary column's values buffer): no Python object per record."""
    n = len(lengths)
    if len(txids) != n or int(lengths.sum(dtype=np.int64)) != len(payloads):
        raise ValueError("one txid per payload, and the lengths add up to the payload bytes")
    return b"".join((HEADER.pack(MAGIC, VERSION, flags, n, records_before), txids.astype("<i8").tobytes(),
                     lengths.astype("<u4").tobytes(), payloads))


class Columns(NamedTuple):
    """A record set's columns as numpy views of its bytes: no Python object per record."""

    n: int
    flags: int
    before: int
    txids: np.ndarray       # int64, absolute (a segment-relative set's offsets plus first_txid)
    lengths: np.ndarray     # uint32
    starts: np.ndarray      # int64: where each payload starts in the entry's bytes


def columns(data: bytes, where: str = "record set", first_txid: int | None = None) -> Columns:
    """Decode and check a record set's framing (anything that is not exactly a record set this
    code reads is CorruptRecordSetError, never a wrong record)."""
    if len(data) < HEADER_BYTES:
        raise CorruptRecordSetError(f"{where}: {len(data)} bytes, shorter than the header")
    magic, version, flags, n, before = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or flags & ~KNOWN_FLAGS:
        raise CorruptRecordSetError(f"{where}: not a record set this code reads "
                                    f"(magic {magic:#x}, version {version}, flags {flags:#x})")
    body = HEADER_BYTES + 12 * n
    if len(data) < body:
        raise CorruptRecordSetError(f"{where}: {n} records do not fit in {len(data)} bytes")
    txids = np.frombuffer(data, dtype="<i8", count=n, offset=HEADER_BYTES)
    lengths = np.frombuffer(data, dtype="<u4", count=n, offset=HEADER_BYTES + 8 * n)
    ends = np.cumsum(lengths, dtype=np.int64) + body
    if (ends[-1] if n else body) != len(data):
        raise CorruptRecordSetError(f"{where}: payload lengths add up to {int(ends[-1]) - body if n else 0}, "
                                    f"{len(data) - body} bytes present")
    if flags & FLAG_SEGMENT_TXIDS:
        if first_txid is None:
            raise CorruptRecordSetError(f"{where}: txids are relative to the segment's first txid, "
                                        "which the decoder was not given")
        txids = txids + np.int64(first_txid)
    return Columns(n, flags, before, txids, lengths, ends - lengths)


class RecordSet:
    """A decoded record set: ``txids`` (numpy int64), ``payloads`` (bytes each), ``records_before``.

    ``first_txid`` is the segment's: a record set with FLAG_SEGMENT_TXIDS is refused without it
    (it would yield wrong txids), and its txids are ``first_txid`` + the stored offsets."""

    __slots__ = ("count", "flags", "payloads", "records_before", "txids")

    def __init__(self, data: bytes, where: str = "record set", first_txid: int | None = None) -> None:
        cols = columns(data, where, first_txid)
        starts = cols.starts.tolist()
        self.payloads = [data[a:b] for a, b in zip(starts, (cols.starts + cols.lengths).tolist(), strict=True)]
        self.txids, self.count, self.flags, self.records_before = cols.txids, cols.n, cols.flags, cols.before

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)
