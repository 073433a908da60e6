"""Entry-log block format and EntryLogger: round trips, rolling, scanning, corruption detection."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from ledger_client.protocol.checks import InvariantViolation
from spark_bookie.errors import CorruptDataError
from spark_bookie.storage.entry_log import (
    BLOCK_HEADER,
    FILE_HEADER,
    FLAG_LZ4,
    EntryLogger,
    LogMissingError,
    decode_block,
    encode_block,
    entry_record_bytes,
    log_file_name,
)

pytestmark = pytest.mark.unit


def _logger(path: Path, **kw: object) -> EntryLogger:
    ids = iter(range(1000))
    args: dict[str, object] = {"log_size_bytes_max": 1 << 20, "block_bytes": 4096, "compression": "none"}
    args.update(kw)
    return EntryLogger(path, allocate_log_id=lambda: next(ids), **args)  # type: ignore[arg-type]


def _entries(ledger: int, n: int, size: int = 100, start: int = 0) -> list[tuple[int, int, bytes]]:
    return [(ledger, e, (f"L{ledger}E{e}:".encode() * size)[:size]) for e in range(start, start + n)]


def _encode(entries: list[tuple[int, int, bytes]], compress: bool) -> bytes:
    parts: list[bytes] = []
    for lid, eid, body in entries:
        parts += [struct.pack(">qqI", lid, eid, len(body)), body]
    raw_len = sum(entry_record_bytes(len(b)) for _, _, b in entries)
    return encode_block(parts, len(entries), raw_len, compress)


@pytest.mark.parametrize("compress", [False, True])
def test_block_round_trip(compress: bool) -> None:
    entries = _entries(7, 20) + [(8, 0, b""), (8, 1, b"x")]
    data = _encode(entries, compress)
    head, stored = data[: BLOCK_HEADER.size], data[BLOCK_HEADER.size :]
    block = decode_block(head, stored, "test")
    assert list(zip(block.ledger_ids, block.entry_ids, block.bodies, strict=True)) == entries
    flags = BLOCK_HEADER.unpack_from(head)[1]
    assert bool(flags & FLAG_LZ4) == compress  # this text compresses, so lz4 is used when asked


def test_incompressible_block_is_stored_raw() -> None:
    entries = [(1, 0, os.urandom(2000))]
    data = _encode(entries, True)
    assert BLOCK_HEADER.unpack_from(data)[1] & FLAG_LZ4 == 0
    block = decode_block(data[: BLOCK_HEADER.size], data[BLOCK_HEADER.size :], "t")
    assert block.bodies[0] == entries[0][2]


@pytest.mark.parametrize("compress", [False, True])
def test_every_single_byte_flip_in_a_block_is_detected(compress: bool) -> None:
    data = _encode(_entries(3, 5, 50), compress)
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptDataError):
            decode_block(bytes(bad[: BLOCK_HEADER.size]), bytes(bad[BLOCK_HEADER.size :]), f"pos {pos}")


def test_append_read_and_locations(tmp_path: Path) -> None:
    log = _logger(tmp_path)
    entries = _entries(1, 100) + _entries(2, 50)
    locs, written = log.append(entries)
    assert written > 0 and len(locs) == len(entries)
    log.sync()
    for (lid, eid, body), loc in zip(entries, locs, strict=True):
        block = log.read_block(loc.log_id, loc.offset)
        assert (block.ledger_ids[loc.slot], block.entry_ids[loc.slot], block.bodies[loc.slot]) == (
            lid,
            eid,
            body,
        )
    # blocks hold at most block_bytes of raw entries: 4096 // 120 = 34 entries per block
    assert max(loc.slot for loc in locs) == 4096 // entry_record_bytes(100) - 1
    assert log.log_ids() == [0]
    assert (tmp_path / log_file_name(0)).read_bytes()[:8] == b"SBKLOG\x00\x01"
    log.close()


def test_oversized_entry_gets_its_own_block(tmp_path: Path) -> None:
    log = _logger(tmp_path, block_bytes=256)
    entries = [(1, 0, b"a" * 10), (1, 1, b"b" * 5000), (1, 2, b"c" * 10)]
    locs, _ = log.append(entries)
    assert len({loc.offset for loc in locs}) == 3
    assert log.read_block(locs[1].log_id, locs[1].offset).bodies == (b"b" * 5000,)
    log.close()


def test_roll_by_size_and_scan(tmp_path: Path) -> None:
    log = _logger(tmp_path, log_size_bytes_max=20_000, block_bytes=2048)
    entries = _entries(5, 1000, 60)
    locs, _ = log.append(entries)
    log.sync()
    ids = log.log_ids()
    assert len(ids) > 3 and ids == sorted({loc.log_id for loc in locs})
    for log_id in ids[:-1]:
        assert log.log_size(log_id) <= 20_000
    scanned = []
    for log_id in ids:
        for _offset, block in log.scan(log_id):
            scanned.extend(zip(block.ledger_ids, block.entry_ids, block.bodies, strict=True))
    assert scanned == entries
    log.close()


def test_scan_stops_at_torn_tail(tmp_path: Path) -> None:
    log = _logger(tmp_path)
    entries = _entries(1, 200)
    log.append(entries)
    log.close()
    path = tmp_path / log_file_name(0)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 10)  # the last block loses its end, as after a crash mid-write
    log2 = _logger(tmp_path)
    got = [e for _o, b in log2.scan(0) for e in b.entry_ids]
    assert got == list(range(len(got))) and 0 < len(got) < 200


def test_random_byte_flip_in_log_file_raises(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"corruption seed {seed}")
    rng = random.Random(seed)
    log = _logger(tmp_path)
    entries = _entries(1, 300)
    locs, _ = log.append(entries)
    log.close()
    path = tmp_path / log_file_name(0)
    data = bytearray(path.read_bytes())
    pos = rng.randrange(FILE_HEADER.size, len(data))
    data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    log2 = _logger(tmp_path)
    errors = 0
    for (_lid, _eid, body), loc in zip(entries, locs, strict=True):
        try:
            block = log2.read_block(loc.log_id, loc.offset)
        except CorruptDataError as exc:
            assert log_file_name(0) in str(exc) and "offset" in str(exc)
            errors += 1
            continue
        assert block.bodies[loc.slot] == body, f"seed {seed}: wrong bytes returned"
    assert errors > 0, f"seed {seed}: flip at {pos} went unnoticed"


def test_delete_log_and_missing_log(tmp_path: Path) -> None:
    log = _logger(tmp_path, log_size_bytes_max=5000, block_bytes=1024)
    locs, _ = log.append(_entries(1, 200))
    log.sync()
    first = locs[0]
    log.read_block(first.log_id, first.offset)  # opens a read handle
    assert log.delete_log(first.log_id) > 0
    assert first.log_id not in log.log_ids()
    with pytest.raises(LogMissingError):
        log.read_block(first.log_id, first.offset)
    current = log.current_log_id
    assert current is not None
    with pytest.raises(InvariantViolation):
        log.delete_log(current)
    log.close()


def test_bad_compression_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        _logger(tmp_path, compression="zstd")
