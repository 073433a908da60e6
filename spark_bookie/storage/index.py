"""The RocksDB index of a ledger directory: entry locations, ledger state, per-log accounting.

One raw-mode Rdict under `<ledger_dir>/current/index/`, as BookKeeper's DbLedgerStorage keeps its
location and ledger indexes in RocksDB. Keys (all big endian, so byte order = numeric order):

    b"E" | u64 ledger_id | u64 entry_id  -> u32 log_id | u64 block_offset | u32 slot
    b"L" | u64 ledger_id                 -> ledger state (master key, fenced, explicit LAC)
    b"M" | u32 log_id                    -> (u64 ledger_id | u64 bytes)*  bytes stored per ledger
    b"N"                                 -> u32 highest log id ever allocated

The prefix byte lets a reverse seek from b"E"|ledger|0xff..ff land on the ledger's highest entry.
Every change goes through one WriteBatch whose WAL record is synced before write() returns, so
one flush's locations, ledger states and log accounting become durable together or not at all.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from ledger_client.protocol.checks import invariant
from spark_bookie.errors import CorruptDataError, DiskFullError, StorageIOError
from spark_bookie.storage.entry_log import Location
from spark_bookie.storage.files import fsync_dir

log = logging.getLogger(__name__)

_ENTRY = b"E"
_LEDGER = b"L"
_LOG_META = b"M"
_LAST_LOG = b"N"
_KEY2 = struct.Struct(">QQ")
_ENTRY_KEY = struct.Struct(">cQQ")  # _ENTRY + _KEY2 in one pack
_KEY1 = struct.Struct(">Q")
_LOG_KEY = struct.Struct(">I")
_LOCATION = struct.Struct(">IQI")
_STATE = struct.Struct(">BqI")  # flags, lac, master key length; then key, then LAC body
_META_ITEM = struct.Struct(">QQ")
_FENCED = 0x1
_HAS_LAC = 0x2
_U64_MAX = (1 << 64) - 1


@dataclass(slots=True)
class LedgerState:
    """What the bookie knows about a ledger besides its entries (BookKeeper's LedgerData).

    `last_entry` is memory only: None until first needed, then the highest entry id stored
    (write cache or index), kept up to date by adds so last_entry_id() costs no index seek.
    """

    master_key: bytes = b""
    fenced: bool = False
    lac: int | None = None
    lac_body: bytes = b""
    last_entry: int | None = None

    def encode(self) -> bytes:
        flags = (_FENCED if self.fenced else 0) | (_HAS_LAC if self.lac is not None else 0)
        lac = -1 if self.lac is None else self.lac
        return _STATE.pack(flags, lac, len(self.master_key)) + self.master_key + self.lac_body

    @classmethod
    def decode(cls, data: bytes, ledger_id: int) -> LedgerState:
        if len(data) < _STATE.size:
            raise CorruptDataError(f"ledger {ledger_id}: state record too short ({len(data)} bytes)")
        flags, lac, key_len = _STATE.unpack_from(data, 0)
        if _STATE.size + key_len > len(data):
            raise CorruptDataError(f"ledger {ledger_id}: state record master key overruns the record")
        key = data[_STATE.size : _STATE.size + key_len]
        body = data[_STATE.size + key_len :]
        has_lac = bool(flags & _HAS_LAC)
        return cls(key, bool(flags & _FENCED), lac if has_lac else None, body if has_lac else b"")


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _ENTRY + _KEY2.pack(ledger_id, entry_id)


def ledger_key(ledger_id: int) -> bytes:
    return _LEDGER + _KEY1.pack(ledger_id)


def log_meta_key(log_id: int) -> bytes:
    return _LOG_META + _LOG_KEY.pack(log_id)


def pack_location(loc: Location) -> bytes:
    return _LOCATION.pack(loc.log_id, loc.offset, loc.slot)


def unpack_location(data: bytes) -> Location:
    if len(data) != _LOCATION.size:
        raise CorruptDataError(f"index location value has {len(data)} bytes, expected {_LOCATION.size}")
    return Location(*_LOCATION.unpack(data))


def encode_log_meta(meta: dict[int, int]) -> bytes:
    return b"".join(_META_ITEM.pack(lid, n) for lid, n in sorted(meta.items()))


def decode_log_meta(data: bytes) -> dict[int, int]:
    if len(data) % _META_ITEM.size:
        raise CorruptDataError(f"log metadata record has {len(data)} bytes, not a multiple of 16")
    return {lid: n for lid, n in _META_ITEM.iter_unpack(data)}


class IndexBatch:
    """One atomic group of index changes (a flush, a relocation, a ledger deletion)."""

    def __init__(self) -> None:
        self._wb = WriteBatch(raw_mode=True)

    def __len__(self) -> int:
        return self._wb.len()

    def put_location(self, ledger_id: int, entry_id: int, loc: Location) -> None:
        self._wb.put(_ENTRY + _KEY2.pack(ledger_id, entry_id), _LOCATION.pack(*loc))

    def put_block(self, log_id: int, offset: int, entries: Sequence[tuple[int, int, bytes]]) -> None:
        """put_location for every entry of one block, in slot order (a flush's bulk of puts)."""
        put, key, loc = self._wb.put, _ENTRY_KEY.pack, _LOCATION.pack
        for slot, (lid, eid, _body) in enumerate(entries):
            put(key(_ENTRY, lid, eid), loc(log_id, offset, slot))

    def put_state(self, ledger_id: int, record: bytes) -> None:
        """`record` is LedgerState.encode(), taken under the caller's lock for a consistent snapshot."""
        self._wb.put(ledger_key(ledger_id), record)

    def delete_state(self, ledger_id: int) -> None:
        self._wb.delete(ledger_key(ledger_id))

    def delete_entries(self, ledger_id: int) -> None:
        """Every location of the ledger: [E|ledger|0, E|ledger+1|0)."""
        invariant(0 <= ledger_id < _U64_MAX, f"ledger id {ledger_id} out of range")
        self._wb.delete_range(entry_key(ledger_id, 0), entry_key(ledger_id + 1, 0))

    def put_log_meta(self, log_id: int, meta: dict[int, int]) -> None:
        self._wb.put(log_meta_key(log_id), encode_log_meta(meta))

    def delete_log_meta(self, log_id: int) -> None:
        self._wb.delete(log_meta_key(log_id))

    def put_last_log_id(self, log_id: int) -> None:
        self._wb.put(_LAST_LOG, _LOG_KEY.pack(log_id))


class LedgerIndex:
    """Thin typed wrapper over the Rdict; thread-safe (RocksDB is), no caching of its own."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: Rdict | None = None
        self._retired: list[Rdict] = []
        self.read_only = False
        self._unsynced = WriteOptions()  # see write(): the WAL is synced outside rocksdict
        self._unsynced.sync = False

    def _options(self) -> Options:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_keep_log_file_num(2)
        opts.set_max_total_wal_size(64 << 20)
        return opts

    def open(self) -> None:
        """Open read-write; on a disk with no space left, read-only instead.

        Opening read-write replays the WAL into a new table file, which needs space. A bookie
        keeps the index's reserve free (LedgerStorage.index_reserve_bytes), but someone else may
        have taken it: then the index opens read-only (RocksDB replays the WAL into memory) so
        the bookie can still start and serve reads; `reopen_writable` retries once space is back."""
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(str(self.path), self._options())
            self.read_only = False
            return
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            if "No space left" not in str(exc):
                raise StorageIOError(f"cannot open ledger index {self.path}: {exc}") from exc
            log.warning("ledger index %s: no space to open it read-write (%s); opening it read-only", self.path, exc)
        try:
            self._db = Rdict(str(self.path), self._options(), access_type=AccessType.read_only())
            self.read_only = True
        except Exception as exc:
            raise StorageIOError(f"cannot open ledger index {self.path}, not even read-only: {exc}") from exc

    def reopen_writable(self) -> None:
        """A read-only index (see open) opened read-write; the read-only handle is retired, not
        closed, as readers may still hold it (closed with the index)."""
        try:
            db = Rdict(str(self.path), self._options())
        except Exception as exc:
            raise DiskFullError(f"ledger index {self.path} still cannot be opened read-write: {exc}") from exc
        if self._db is not None:
            self._retired.append(self._db)
        self._db, self.read_only = db, False
        log.info("ledger index %s is writable again", self.path)

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            if not self.read_only:
                db.flush(True)
            db.close()
        for old in self._retired:
            old.close()
        self._retired.clear()

    @property
    def db(self) -> Rdict:
        db = self._db
        if db is None:
            raise StorageIOError(f"ledger index {self.path} is not open")
        return db

    # ---- reads
    def get_location(self, ledger_id: int, entry_id: int) -> Location | None:
        data = self.db.get(_ENTRY + _KEY2.pack(ledger_id, entry_id))
        return None if data is None else unpack_location(data)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of the ledger, -1 if none (one reverse seek)."""
        it = self.db.iter()
        it.seek_for_prev(entry_key(ledger_id, _U64_MAX >> 1))
        if not it.valid():
            return -1
        key = it.key()
        if len(key) != 1 + _KEY2.size or key[:1] != _ENTRY:
            return -1
        lid, eid = _KEY2.unpack_from(key, 1)
        return eid if lid == ledger_id else -1

    def load_ledger_states(self) -> dict[int, LedgerState]:
        return {lid: LedgerState.decode(v, lid) for lid, v in self._scan_prefix(_LEDGER, _KEY1)}

    def load_log_meta(self) -> dict[int, dict[int, int]]:
        return {log_id: decode_log_meta(v) for log_id, v in self._scan_prefix(_LOG_META, _LOG_KEY)}

    def last_log_id(self) -> int:
        data = self.db.get(_LAST_LOG)
        return -1 if data is None else int(_LOG_KEY.unpack(data)[0])

    def _scan_prefix(self, prefix: bytes, key_struct: struct.Struct) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        it = self.db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if key[:1] != prefix:
                break
            invariant(len(key) == 1 + key_struct.size, f"malformed index key {key!r}")
            out.append((key_struct.unpack_from(key, 1)[0], it.value()))
            it.next()
        return out

    # ---- writes
    def write(self, batch: IndexBatch) -> None:
        """Apply the batch atomically and durably (its WAL records synced before returning).

        rocksdict holds the GIL for all of Rdict.write, and with sync=True that included the WAL's
        fsync: 10-25 ms per 2 s checkpoint on this disk, up to 160 ms, during which every thread
        of the bookie (its add connections among them) stood still. So the batch is written
        without sync -- still atomic: RocksDB writes a batch as one WAL record and replays whole
        records only -- and its WAL reaches the page cache before write() returns (WAL buffering
        is off by default); then `_sync_wal` makes it durable with calls that release the GIL.
        """
        if not len(batch):
            return
        if self.read_only:
            raise DiskFullError(f"ledger index {self.path} is open read-only (its disk was full at start)")
        try:
            self.db.write(batch._wb, self._unsynced)
            self._sync_wal()
        except Exception as exc:
            raise StorageIOError(f"write to ledger index {self.path} failed: {exc}") from exc

    def _sync_wal(self) -> None:
        """fdatasync the live WAL files (`<number>.log` in the index directory: RocksDB keeps them
        there when no wal_dir is set) and fsync the directory (a WAL created since the last
        sync must stay reachable). A WAL deleted meanwhile was obsolete: RocksDB deletes one only
        once the memtables it covered are in synced table files. Finding none would mean the
        layout is not what this assumes: then RocksDB syncs, holding the GIL."""
        synced = 0
        with os.scandir(self.path) as it:
            names = [e.name for e in it if e.name.endswith(".log") and e.name[:-4].isdigit()]
        for name in names:
            try:
                fd = os.open(self.path / name, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            synced += 1
        if not synced:
            self.db.flush_wal(True)
        fsync_dir(self.path)

    def size_bytes(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total
