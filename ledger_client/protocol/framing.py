"""Entry framing and digests, byte-compatible with BookKeeper's DigestManager.

An entry body on the wire and on the bookie's disks is
    ledger_id:i64 | entry_id:i64 | last_add_confirmed:i64 | length:i64 | digest | payload
(big-endian), where `length` is the ledger's cumulative length including this entry and the
digest covers the 32-byte header and the payload. An explicit-LAC body is
    ledger_id:i64 | lac:i64 | digest.
Digest sizes follow BookKeeper: CRC32 8 bytes, CRC32C 4, HMAC (HmacSHA1) 20, DUMMY 0.
The bookie only parses the header (ids and LAC); clients verify digests on every read.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from dataclasses import dataclass, field

import google_crc32c

from metadata.model import DigestType, master_key

HEADER = struct.Struct(">qqqq")
LAC_HEADER = struct.Struct(">qq")
HEADER_BYTES = HEADER.size
_U32 = struct.Struct(">I")
_crc_extend = google_crc32c.extend


__all__ = ["DigestError", "Digester", "DigestType", "FramingError", "HEADER_BYTES", "master_key",
           "parse_header", "parse_lac_header"]


class FramingError(ValueError):
    """A body is too short, or its header does not match what was asked for."""


class DigestError(FramingError):
    """The digest stored with an entry does not match its bytes: the replica is corrupt."""


def _mac_key(password: bytes) -> bytes:
    return hashlib.sha1(b"mac" + password).digest()


@dataclass(frozen=True)
class Digester:
    """Computes and checks digests of one ledger (type + password fixed at open)."""

    digest_type: DigestType
    password: bytes = b""
    _crc32c: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_crc32c", self.digest_type is DigestType.CRC32C)

    def compute(self, *parts: bytes) -> bytes:
        t = self.digest_type
        if t is DigestType.CRC32C:
            crc = 0
            for p in parts:
                crc = google_crc32c.extend(crc, p)
            return struct.pack(">I", crc)
        if t is DigestType.CRC32:
            crc = 0
            for p in parts:
                crc = zlib.crc32(p, crc)
            return struct.pack(">q", crc)
        if t is DigestType.HMAC:
            mac = hmac.new(_mac_key(self.password), digestmod=hashlib.sha1)
            for p in parts:
                mac.update(p)
            return mac.digest()
        return b""

    # ---- entries

    def frame(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        header = HEADER.pack(ledger_id, entry_id, lac, length)
        if self._crc32c:  # the default, once per append: no enum lookups, no varargs
            return b"".join((header, _U32.pack(_crc_extend(_crc_extend(0, header), payload)), payload))
        return b"".join((header, self.compute(header, payload), payload))

    def unframe(self, body: bytes, ledger_id: int, entry_id: int) -> tuple[int, int, bytes]:
        """Check ids and digest; return (lac, length, payload)."""
        lid, eid, lac, length = parse_header(body)
        if lid != ledger_id or eid != entry_id:
            raise FramingError(f"body is entry {lid}/{eid}, expected {ledger_id}/{entry_id}")
        n = self.digest_type.digest_bytes
        header, payload = body[:HEADER_BYTES], body[HEADER_BYTES + n:]
        digest = body[HEADER_BYTES:HEADER_BYTES + n]
        if len(digest) != n or not hmac.compare_digest(digest, self.compute(header, payload)):
            raise DigestError(f"digest mismatch on entry {ledger_id}/{entry_id}")
        return lac, length, payload

    # ---- explicit LAC

    def frame_lac(self, ledger_id: int, lac: int) -> bytes:
        header = LAC_HEADER.pack(ledger_id, lac)
        return header + self.compute(header)

    def unframe_lac(self, body: bytes, ledger_id: int) -> int:
        if len(body) < LAC_HEADER.size + self.digest_type.digest_bytes:
            raise FramingError("explicit LAC body too short")
        lid, lac = LAC_HEADER.unpack_from(body)
        header = body[:LAC_HEADER.size]
        if lid != ledger_id:
            raise FramingError(f"explicit LAC is for ledger {lid}, expected {ledger_id}")
        if not hmac.compare_digest(body[LAC_HEADER.size:], self.compute(header)):
            raise DigestError(f"digest mismatch on explicit LAC of ledger {ledger_id}")
        return int(lac)


def parse_header(body: bytes) -> tuple[int, int, int, int]:
    """(ledger_id, entry_id, lac, length) of a framed entry; FramingError if too short."""
    if len(body) < HEADER_BYTES:
        raise FramingError(f"entry body of {len(body)} bytes is shorter than the {HEADER_BYTES}-byte header")
    return HEADER.unpack_from(body)  # type: ignore[return-value]  # four ints, by the format


def parse_lac_header(body: bytes) -> tuple[int, int]:
    if len(body) < LAC_HEADER.size:
        raise FramingError("explicit LAC body too short")
    lid, lac = LAC_HEADER.unpack_from(body)
    return int(lid), int(lac)
