"""Record sets: many records in one ledger entry, which is what makes small records cheap.

Layout, version 2 (little-endian, columnar so that decoding is three numpy views and a slice
per payload, and so that an Arrow column can be built from the payloads without a copy each):

    magic 0xD1 | version 2 | flags | 0          4 bytes
    count                                      uint32
    records before                             uint64: records of this segment in earlier entries
    bytes before                               uint64: bytes of this segment's ledger in earlier entries
    txids                                      count x int64
    lengths                                    count x uint32
    payloads                                   concatenated

``records before`` lets the last entry alone tell a segment's record count, which is what a new
writer needs to seal a dead writer's segment; with ``bytes before`` the entry at a live segment's
LAC alone tells its records and bytes so far (stream info while a writer is open). Version 1 is
the same without ``bytes before`` (a 16-byte header); it is still read (``bytes_before`` is None
then), and only version 2 is written, so readers must be upgraded before writers. Anything that
is not exactly one of these is refused with CorruptRecordSetError (it never yields a wrong record).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from ..errors import CorruptRecordSetError

MAGIC = 0xD1
VERSION = 2
FLAG_CONTROL = 0x01          # a record set that carries no user records (reserved)
FLAG_SEGMENT_TXIDS = 0x02    # txids are offsets from the segment's first_txid (a Spark task's ledger, which
                             # cannot know the stream's txids when it writes: metadata/streams/linking.py)
KNOWN_FLAGS = FLAG_CONTROL | FLAG_SEGMENT_TXIDS
HEADER = struct.Struct("<BBBxIQQ")
HEADER_BYTES = HEADER.size    # 24
HEADER_V1 = struct.Struct("<BBBxIQ")   # 16: version 1, no "bytes before"
_BYTES_BEFORE = struct.Struct("<Q")    # version 2's field after version 1's header
RECORD_OVERHEAD_BYTES = 12    # txid + length


def encode(txids: Sequence[int], payloads: Sequence[bytes], records_before: int, flags: int = 0,
           bytes_before: int = 0) -> bytes:
    """One entry's record set; ``bytes_before`` is the length of the segment's ledger before it."""
    n = len(payloads)
    if len(txids) != n:
        raise ValueError("one txid per payload")
    return b"".join((HEADER.pack(MAGIC, VERSION, flags, n, records_before, bytes_before),
                     np.asarray(txids, dtype="<i8").tobytes(),
                     np.fromiter(map(len, payloads), dtype="<u4", count=n).tobytes(), *payloads))


class RecordSet:
    """A decoded record set: ``txids`` (numpy int64), ``payloads`` (bytes each), ``records_before``,
    ``bytes_before`` (None in a version 1 record set).

    ``first_txid`` is the segment's: a record set with FLAG_SEGMENT_TXIDS is refused without it
    (it would yield wrong txids), and its txids are ``first_txid`` + the stored offsets."""

    __slots__ = ("bytes_before", "count", "flags", "payloads", "records_before", "txids")

    def __init__(self, data: bytes, where: str = "record set", first_txid: int | None = None) -> None:
        if len(data) < HEADER_V1.size:
            raise CorruptRecordSetError(f"{where}: {len(data)} bytes, shorter than the header")
        magic, version, flags, n, before = HEADER_V1.unpack_from(data)
        if magic != MAGIC or version not in (1, VERSION) or flags & ~KNOWN_FLAGS:
            raise CorruptRecordSetError(f"{where}: not a record set this code reads "
                                        f"(magic {magic:#x}, version {version}, flags {flags:#x})")
        head = HEADER_V1.size
        self.bytes_before: int | None = None
        if version == VERSION:
            if len(data) < HEADER_BYTES:
                raise CorruptRecordSetError(f"{where}: {len(data)} bytes, shorter than the header")
            head, self.bytes_before = HEADER_BYTES, _BYTES_BEFORE.unpack_from(data, HEADER_V1.size)[0]
        body = head + 12 * n
        if len(data) < body:
            raise CorruptRecordSetError(f"{where}: {n} records do not fit in {len(data)} bytes")
        self.txids = np.frombuffer(data, dtype="<i8", count=n, offset=head)
        lengths = np.frombuffer(data, dtype="<u4", count=n, offset=head + 8 * n)
        ends = np.cumsum(lengths, dtype=np.int64) + body
        if (ends[-1] if n else body) != len(data):
            raise CorruptRecordSetError(f"{where}: payload lengths add up to {int(ends[-1]) - body if n else 0}, "
                                        f"{len(data) - body} bytes present")
        starts = (ends - lengths).tolist()
        self.payloads = [data[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]
        if flags & FLAG_SEGMENT_TXIDS:
            if first_txid is None:
                raise CorruptRecordSetError(f"{where}: txids are relative to the segment's first txid, "
                                            "which the decoder was not given")
            self.txids = self.txids + np.int64(first_txid)
        self.count, self.flags, self.records_before = n, flags, before

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)
