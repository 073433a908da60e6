"""Entry logs: append-only files of checksummed, optionally LZ4-compressed blocks of entries.

Modelled on BookKeeper's EntryLogger, but entries are grouped into blocks: the write cache is
flushed sorted by (ledger_id, entry_id), so a block usually holds consecutive entries of one
ledger and a sequential read decodes each block once (the read cache keeps decoded blocks).

File layout (`<log_id as 8 hex>.log`)::

    file header: magic b"SBKLOG\\0\\1" | u32 version | u32 reserved            (16 bytes)
    block*:      header | stored bytes
    header:      u32 magic | u16 flags | u16 reserved | u32 count | u32 raw_len |
                 u32 stored_len | u32 crc32c                                (24 bytes, little endian)
    raw bytes:   (i64 ledger_id | i64 entry_id | u32 len | body) * count     (big endian)

flags bit0 = the stored bytes are the LZ4 block compression of the raw bytes. The crc32c covers
the header fields before it and the stored bytes, so a flipped bit anywhere in a block (length
fields included) is detected before anything is decoded. A location is (log_id, block_offset,
slot); every read from disk verifies the checksum and the caller verifies the ids at the slot.

Logs are never appended to after a restart (a new log is started), so a torn tail left by a
crash is never followed by good data; nothing indexed points past the last synced block.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import google_crc32c
import lz4.block

from ledger_client.protocol.checks import InvariantViolation, invariant
from spark_bookie.errors import CorruptDataError, StorageIOError
from spark_bookie.storage.files import fsync_dir, start_writeback

FILE_MAGIC = b"SBKLOG\x00\x01"
FILE_VERSION = 1
FILE_HEADER = struct.Struct("<8sII")
BLOCK_MAGIC = 0x4B4C4253  # b"SBLK" little endian
BLOCK_HEADER = struct.Struct("<IHHIIII")
BLOCK_HEADER_NO_CRC = BLOCK_HEADER.size - 4
ENTRY_HEADER = struct.Struct(">qqI")
FLAG_LZ4 = 0x1
COMPRESSIONS = ("none", "lz4")
_LOG_NAME = re.compile(r"^([0-9a-f]{8})\.log$")
_SCAN_CHUNK = 4 << 20  # compaction reads logs in chunks of this size
_BLOCK_STORED_MAX = 1 << 31  # sanity bound on a header's length fields
# A flush is background work that holds the GIL while it runs Python (~5 us per entry: 10-30 ms
# per 2 s checkpoint at 1,000 adds/s), so the bookie's add connections, woken by a client's add,
# waited for the GIL for up to the 5 ms switch interval at a time. Releasing it (a system call,
# os.sched_yield) does not hand it over: the flushing thread takes it back before a waiter wakes.
# A short sleep every BACKGROUND_SLICE_BYTES does: beside 2,000-entry flushes, a thread sleeping
# 1 ms at a time woke twice as often while the log was written, late by p50 0.2 ms and p90
# 2.7-4.6 ms instead of 0.2-2.0 and 4.8-10.8 (three paired runs; the maximum, 9-35 ms, follows
# the host and the page cache).
BACKGROUND_SLICE_BYTES = 256 << 10
BACKGROUND_PAUSE_S = 0.0002
# An append hands the log its bytes a slice at a time, starts their writeback at once and pauses
# WRITEBACK_PAUSE_S after each slice, so the disk the journals share never has a flush's
# megabytes queued at once (see files.start_writeback). Beside a journal-like writer (1 KiB +
# fdatasync at 1,000/s) and a 2 MiB flush + fsync every 0.67 s (three bookies' checkpoints), the
# writer's fdatasyncs over 3 ms fell from 11-30 to 1-3 per 10 s (p999 4.0-6.0 -> 1.2-1.4 ms);
# 0.2 ms pauses gave 2-7, 0.5 ms 7-9, writeback without pauses 6-9. The pause caps one log's
# appends near 125 MB/s, so work that must keep up with adds (a flush the write cache's size
# forced) passes paced=False: it still starts each slice's writeback, which alone took a
# saturated bookie from ~100,000 to ~150,000 durable 1 KiB adds/s (`bench bookie`).
WRITEBACK_PAUSE_S = 0.001


class GiveWay:
    """Counts the bytes a background pass has done and pauses every BACKGROUND_SLICE_BYTES, so a
    thread waiting for the GIL (an add, a read) runs before the pass goes on."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since = 0

    def done(self, nbytes: int) -> None:
        self._since += nbytes
        if self._since >= BACKGROUND_SLICE_BYTES:
            self.pause(BACKGROUND_PAUSE_S)

    def pause(self, seconds: float) -> None:
        """A pause for another reason (the disk) counts as this one too."""
        self._since = 0
        time.sleep(seconds)


class Location(NamedTuple):
    """Where an entry lives: the block at `offset` in log `log_id`, at position `slot`."""

    log_id: int
    offset: int
    slot: int


class LogMissingError(StorageIOError):
    """The entry log file is gone (deleted by GC after compaction); the caller re-looks-up the index."""


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """A verified block: parallel tuples of ids and bodies, plus its raw size for cache accounting."""

    ledger_ids: tuple[int, ...]
    entry_ids: tuple[int, ...]
    bodies: tuple[bytes, ...]
    raw_len: int
    stored_len: int

    def __len__(self) -> int:
        return len(self.bodies)


def log_file_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def entry_record_bytes(body_len: int) -> int:
    """Bytes an entry takes in a block's raw form; the unit of the per-log live-byte accounting."""
    return ENTRY_HEADER.size + body_len


def encode_block(parts: list[bytes], count: int, raw_len: int, compress: bool) -> bytes:
    """Header + stored bytes for one block. Compressed only when that actually saves space."""
    raw = b"".join(parts)
    invariant(len(raw) == raw_len, "block raw length accounting is off")
    flags = 0
    stored = raw
    if compress:
        packed = lz4.block.compress(raw, mode="default", store_size=False)
        if len(packed) < len(raw):
            stored, flags = packed, FLAG_LZ4
    head = BLOCK_HEADER.pack(BLOCK_MAGIC, flags, 0, count, raw_len, len(stored), 0)[:BLOCK_HEADER_NO_CRC]
    crc = google_crc32c.extend(google_crc32c.value(head), stored)
    return head + struct.pack("<I", crc) + stored


def parse_block_header(head: bytes, where: str) -> tuple[int, int, int, int, int]:
    """(flags, count, raw_len, stored_len, crc) after the checks that need no payload."""
    if len(head) < BLOCK_HEADER.size:
        raise CorruptDataError(f"{where}: truncated block header ({len(head)} bytes)")
    magic, flags, _res, count, raw_len, stored_len, crc = BLOCK_HEADER.unpack_from(head, 0)
    if magic != BLOCK_MAGIC:
        raise CorruptDataError(f"{where}: bad block magic {magic:#x}")
    if stored_len > _BLOCK_STORED_MAX or raw_len > _BLOCK_STORED_MAX or flags & ~FLAG_LZ4:
        raise CorruptDataError(f"{where}: implausible block header")
    return flags, count, raw_len, stored_len, crc


def decode_block(head: bytes, stored: bytes, where: str) -> DecodedBlock:
    """Verify the checksum, decompress, split into entries. Raises CorruptDataError naming `where`."""
    flags, count, raw_len, stored_len, crc = parse_block_header(head, where)
    if len(stored) != stored_len:
        raise CorruptDataError(f"{where}: block truncated ({len(stored)} of {stored_len} bytes)")
    actual = google_crc32c.extend(google_crc32c.value(head[:BLOCK_HEADER_NO_CRC]), stored)
    if actual != crc:
        raise CorruptDataError(f"{where}: block checksum mismatch (stored {crc:#010x}, got {actual:#010x})")
    if flags & FLAG_LZ4:
        try:
            raw = lz4.block.decompress(stored, uncompressed_size=raw_len)
        except lz4.block.LZ4BlockError as exc:
            raise CorruptDataError(f"{where}: LZ4 decompression failed: {exc}") from exc
    else:
        raw = stored
    if len(raw) != raw_len:
        raise CorruptDataError(f"{where}: raw length {len(raw)} != header {raw_len}")
    return _split_entries(raw, count, stored_len, where)


def _split_entries(raw: bytes, count: int, stored_len: int, where: str) -> DecodedBlock:
    """Hot on the read path: one unpack and one slice per entry; bounds are checked once at the
    end (an overrun leaves `pos` past `end` or makes unpack_from fail)."""
    ledgers: list[int] = []
    entries: list[int] = []
    bodies: list[bytes] = []
    add_l, add_e, add_b = ledgers.append, entries.append, bodies.append
    unpack = ENTRY_HEADER.unpack_from
    hsize = ENTRY_HEADER.size
    pos = 0
    try:
        for _ in range(count):
            lid, eid, n = unpack(raw, pos)
            start = pos + hsize
            pos = start + n
            add_l(lid)
            add_e(eid)
            add_b(raw[start:pos])
    except struct.error as exc:
        raise CorruptDataError(f"{where}: entry header past the end of the block") from exc
    if pos != len(raw):
        raise CorruptDataError(f"{where}: entries end at {pos}, block raw length is {len(raw)}")
    return DecodedBlock(tuple(ledgers), tuple(entries), tuple(bodies), len(raw), stored_len)


@dataclass
class _WriteLog:
    log_id: int
    fd: int
    size: int


@dataclass
class _ReadHandle:
    """A read fd shared by readers; closed when the log is deleted and the last reader is done."""

    fd: int
    refs: int = 0
    doomed: bool = False


@dataclass
class _Pending:
    """Blocks encoded for the current log but not yet handed to the OS (one write per few MiB)."""

    buf: list[bytes] = field(default_factory=list)
    size: int = 0


class EntryLogger:
    """Writes blocks to the current log (rolling by size), reads verified blocks back, deletes logs.

    Appends are serialized by `_write_lock` (flush and compaction both append); `sync()` fsyncs
    every log written since the last sync, serialized by `_sync_lock` so that a caller returning
    from sync() knows all of its own appends are durable even if another thread synced first.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        log_size_bytes_max: int,
        block_bytes: int,
        compression: str,
        allocate_log_id: Callable[[], int],
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        if block_bytes <= 0 or log_size_bytes_max <= 0:
            raise ValueError("block_bytes and log_size_bytes_max must be positive")
        self.directory = Path(directory)
        self.log_size_bytes_max = log_size_bytes_max
        self.block_bytes = block_bytes
        self.compress = compression == "lz4"
        self._allocate_log_id = allocate_log_id
        self._lock = threading.Lock()  # read handles, unsynced list
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._current: _WriteLog | None = None
        self._unsynced: list[_WriteLog] = []  # rolled logs whose fd waits for the next sync
        self._dir_dirty = False
        self._failed: str | None = None
        self._readers: dict[int, _ReadHandle] = {}
        self.bytes_written = 0

    # ---- files
    def log_path(self, log_id: int) -> Path:
        return self.directory / log_file_name(log_id)

    def log_ids(self) -> list[int]:
        """Ids of the log files present on disk, ascending."""
        ids = []
        for name in os.listdir(self.directory):
            m = _LOG_NAME.match(name)
            if m:
                ids.append(int(m.group(1), 16))
        return sorted(ids)

    def log_size(self, log_id: int) -> int:
        try:
            return self.log_path(log_id).stat().st_size
        except FileNotFoundError:
            return 0

    def total_bytes(self) -> int:
        return sum(self.log_size(i) for i in self.log_ids())

    @property
    def current_log_id(self) -> int | None:
        cur = self._current
        return None if cur is None else cur.log_id

    # ---- writing
    def append(self, entries: Sequence[tuple[int, int, bytes]]) -> tuple[list[Location], int]:
        """Write `entries` (sorted by (ledger, entry) for good blocks): (their locations, bytes written).

        The bytes reach the OS before this returns (readable by pread) but are durable only
        after `sync()`.
        """
        spans, written = self.append_spans(entries)
        return [Location(log_id, offset, slot) for log_id, offset, count in spans for slot in range(count)], written

    def append_spans(self, entries: Sequence[tuple[int, int, bytes]],
                     paced: bool = True) -> tuple[list[tuple[int, int, int]], int]:
        """`append`, with the locations as one (log id, block offset, entry count) per block, in
        the order of `entries`: a flush writes every add once more here, and a Location object
        per entry was a tenth of its CPU. `paced`: pause WRITEBACK_PAUSE_S after each slice
        written (False for work that must keep up with adds)."""
        spans: list[tuple[int, int, int]] = []
        written = 0
        if not entries:
            return spans, written
        self._check_failed()
        with self._write_lock:
            pending = _Pending()
            give_way = GiveWay()
            for parts, count, raw_len in self._blocks(entries):
                block = encode_block(parts, count, raw_len, self.compress)
                cur = self._room_for(len(block), pending)
                offset = cur.size + pending.size
                pending.buf.append(block)
                pending.size += len(block)
                written += len(block)
                spans.append((cur.log_id, offset, count))
                if pending.size >= BACKGROUND_SLICE_BYTES:
                    self._write_pending(pending)
                    if paced:
                        give_way.pause(WRITEBACK_PAUSE_S)  # also hands the GIL over
                give_way.done(raw_len)
            self._write_pending(pending)
        return spans, written

    def _blocks(self, entries: Sequence[tuple[int, int, bytes]]) -> Iterator[tuple[list[bytes], int, int]]:
        """Group entries into blocks of at most block_bytes raw (an oversized entry gets its own)."""
        pack = ENTRY_HEADER.pack
        hsize = ENTRY_HEADER.size
        limit = self.block_bytes
        parts: list[bytes] = []
        raw_len = 0
        count = 0
        for lid, eid, body in entries:
            n = hsize + len(body)
            if count and raw_len + n > limit:
                yield parts, count, raw_len
                parts, raw_len, count = [], 0, 0
            parts.append(pack(lid, eid, len(body)))
            parts.append(body)
            raw_len += n
            count += 1
        if count:
            yield parts, count, raw_len

    def _room_for(self, block_len: int, pending: _Pending) -> _WriteLog:
        """The log to write the next block to, rolling when this block would pass the size limit."""
        cur = self._current
        if cur is not None:
            size = cur.size + pending.size
            if size <= FILE_HEADER.size or size + block_len <= self.log_size_bytes_max:
                return cur
            self._write_pending(pending)
            with self._lock:
                self._unsynced.append(cur)
        self._current = cur = self._create_log()
        return cur

    def _create_log(self) -> _WriteLog:
        log_id = self._allocate_log_id()
        path = self.log_path(log_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageIOError(f"cannot create entry log {path}: {exc}") from exc
        try:
            _pwrite_all(fd, FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0), 0)
        except OSError as exc:
            _close_quietly(fd)
            raise StorageIOError(f"cannot write the header of entry log {path}: {exc}") from exc
        self._dir_dirty = True
        return _WriteLog(log_id, fd, FILE_HEADER.size)

    def _write_pending(self, pending: _Pending) -> None:
        """Hand the pending blocks to the OS at the log's logical end (pwrite: a failed partial
        write cannot shift later blocks away from the offsets their locations name)."""
        if not pending.size:
            return
        cur = self._current
        if cur is None:
            raise InvariantViolation("pending entry-log bytes without a current log")
        try:
            _pwrite_all(cur.fd, b"".join(pending.buf), cur.size)
        except OSError as exc:
            # Abandon this log for new writes; it stays in the sync list for appends already made.
            with self._lock:
                self._unsynced.append(cur)
            self._current = None
            raise StorageIOError(f"write to entry log {self.log_path(cur.log_id)} failed: {exc}") from exc
        start_writeback(cur.fd, cur.size, pending.size)
        cur.size += pending.size
        self.bytes_written += pending.size
        pending.buf.clear()
        pending.size = 0

    def sync(self) -> None:
        """fsync every log written since the last sync (and the directory if a log was created).

        A failed fsync poisons the logger: the kernel may have dropped dirty pages, so no later
        fsync can vouch for them. Appends and syncs raise from then on (the bookie should go
        read-only); reads keep working.
        """
        with self._sync_lock:
            self._check_failed()
            with self._write_lock:
                rolled, self._unsynced = self._unsynced, []
                cur = self._current
                dir_dirty, self._dir_dirty = self._dir_dirty, False
            try:
                for wl in rolled:
                    os.fsync(wl.fd)
                if cur is not None:
                    os.fsync(cur.fd)
                if dir_dirty:
                    fsync_dir(self.directory)
            except OSError as exc:
                self._failed = f"fsync of entry logs in {self.directory} failed: {exc}"
                raise StorageIOError(self._failed) from exc
            finally:
                for wl in rolled:
                    _close_quietly(wl.fd)

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise StorageIOError(f"entry logger is failed: {self._failed}")

    # ---- reading
    def read_block(self, log_id: int, offset: int, size_hint: int = 0) -> DecodedBlock:
        """Read and verify the block at `offset` (one pread in the common case)."""
        handle = self._acquire(log_id)
        where = f"{self.log_path(log_id)} offset {offset}"
        try:
            want = BLOCK_HEADER.size + (size_hint or self.block_bytes + 64)
            data = os.pread(handle.fd, want, offset)
            _f, _c, _r, stored_len, _crc = parse_block_header(data[: BLOCK_HEADER.size], where)
            end = BLOCK_HEADER.size + stored_len
            if len(data) < end:
                data += os.pread(handle.fd, end - len(data), offset + len(data))
        except OSError as exc:
            raise StorageIOError(f"read of {where} failed: {exc}") from exc
        finally:
            self._release(log_id, handle)
        return decode_block(data[: BLOCK_HEADER.size], data[BLOCK_HEADER.size : end], where)

    def scan(self, log_id: int) -> Iterator[tuple[int, DecodedBlock]]:
        """Every (offset, block) of a log, in order; stops quietly at a torn tail.

        Reads in chunks of a few MiB (few syscalls: each one is a GIL hand-off under a busy read
        pool). A checksum failure in a complete block raises CorruptDataError (compaction must
        not guess).
        """
        size = self.log_size(log_id)
        hsize = BLOCK_HEADER.size
        path = str(self.log_path(log_id))
        handle = self._acquire(log_id)
        try:
            buf, buf_at = b"", 0
            offset = FILE_HEADER.size
            while offset + hsize <= size:
                if offset + hsize > buf_at + len(buf):
                    buf, buf_at = self._pread(handle, log_id, max(_SCAN_CHUNK, hsize), offset), offset
                where = f"{path} offset {offset}"
                rel = offset - buf_at
                head = buf[rel : rel + hsize]
                stored_len = parse_block_header(head, where)[3]
                end = offset + hsize + stored_len
                if end > size:
                    return  # torn tail of a log that was being written at a crash
                if end > buf_at + len(buf):
                    buf, buf_at = self._pread(handle, log_id, max(_SCAN_CHUNK, end - offset), offset), offset
                    rel = 0
                yield offset, decode_block(head, buf[rel + hsize : rel + hsize + stored_len], where)
                offset = end
        finally:
            self._release(log_id, handle)

    def _pread(self, handle: _ReadHandle, log_id: int, n: int, offset: int) -> bytes:
        try:
            return os.pread(handle.fd, n, offset)
        except OSError as exc:
            raise StorageIOError(f"read of {self.log_path(log_id)} at {offset} failed: {exc}") from exc

    def _acquire(self, log_id: int) -> _ReadHandle:
        with self._lock:
            handle = self._readers.get(log_id)
            if handle is None:
                try:
                    fd = os.open(self.log_path(log_id), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError as exc:
                    raise LogMissingError(f"entry log {self.log_path(log_id)} does not exist") from exc
                except OSError as exc:
                    raise StorageIOError(f"cannot open entry log {self.log_path(log_id)}: {exc}") from exc
                handle = self._readers[log_id] = _ReadHandle(fd)
            handle.refs += 1
            return handle

    def _release(self, log_id: int, handle: _ReadHandle) -> None:
        with self._lock:
            handle.refs -= 1
            if handle.doomed and handle.refs == 0:
                _close_quietly(handle.fd)

    # ---- deleting / closing
    def delete_log(self, log_id: int) -> int:
        """Unlink a log that is not being written; returns the bytes freed. Readers in flight finish."""
        invariant(log_id != self.current_log_id, f"refusing to delete the current entry log {log_id}")
        size = self.log_size(log_id)
        with self._lock:
            handle = self._readers.pop(log_id, None)
            if handle is not None:
                handle.doomed = True
                if handle.refs == 0:
                    _close_quietly(handle.fd)
        try:
            os.unlink(self.log_path(log_id))
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StorageIOError(f"cannot delete entry log {self.log_path(log_id)}: {exc}") from exc
        return size

    def close(self) -> None:
        """Sync and close everything; the next open starts a new log."""
        try:
            self.sync()
        finally:
            with self._write_lock:
                cur, self._current = self._current, None
                rolled, self._unsynced = self._unsynced, []
            for wl in ([cur] if cur is not None else []) + rolled:
                _close_quietly(wl.fd)
            with self._lock:
                for handle in self._readers.values():
                    handle.doomed = True
                    if handle.refs == 0:
                        _close_quietly(handle.fd)
                self._readers.clear()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass

