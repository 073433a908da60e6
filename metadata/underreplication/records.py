"""The records of the under-replication area (small, versioned JSON, UTF-8), encoded and checked.

See :mod:`metadata.underreplication.store` for what each node is for.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable

from metadata.errors import InvalidMetadataError

FORMAT_VERSION = 1


def encode_underreplicated(missing: Iterable[str], ctime_ms: int) -> bytes:
    body = {"v": FORMAT_VERSION, "missing": sorted(set(missing)), "ctime_ms": int(ctime_ms)}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_underreplicated(data: bytes, where: str) -> tuple[list[str], int]:
    """``(missing, ctime_ms)`` of an under-replicated ledger node; InvalidMetadataError if it is
    not one we can read (a newer format version included: never guess at it)."""
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidMetadataError(f"{where}: not an under-replication record ({e})") from e
    if not isinstance(body, dict) or body.get("v") != FORMAT_VERSION:
        raise InvalidMetadataError(f"{where}: unknown under-replication record format {data[:80]!r}")
    missing, ctime = body.get("missing"), body.get("ctime_ms", 0)
    if not isinstance(missing, list) or not all(isinstance(b, str) for b in missing) or not isinstance(ctime, int):
        raise InvalidMetadataError(f"{where}: malformed under-replication record {data[:80]!r}")
    return sorted(set(missing)), ctime


def encode_lock() -> bytes:
    return json.dumps({"v": FORMAT_VERSION, "host": socket.gethostname(), "pid": os.getpid()}).encode()


def check_delay_s(seconds: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ValueError(f"lost bookie recovery delay must be an int (seconds), got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"lost bookie recovery delay must not be negative, got {seconds}")
    return seconds


def decode_delay_s(data: bytes | None, where: str) -> int:
    if data is None:
        return 0
    try:
        return check_delay_s(int(data.decode().strip()))
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidMetadataError(f"{where}: not a number of seconds: {data[:40]!r}") from e
