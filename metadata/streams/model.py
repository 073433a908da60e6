"""The metadata of streams (DistributedLog's model, DESIGN §4.5): what a stream's znode and its
segments' znodes hold, as frozen values with a versioned JSON encoding.

JSON, not protobuf like ledger metadata: a stream's records are few and small, read by operators
with zkCli as often as by code, and they grow fields as features land (tiering adds the Delta
table and version of a segment); a ``"v"`` field carries the format, and a reader refuses a
format newer than it knows (InvalidMetadataError) rather than drop fields it cannot see.

A position in a stream is a DLSN ``(segment sequence, entry id, slot)``: a plain tuple here
(``metadata`` imports nothing of the client); ``ledger_client.DLSN`` is the public type.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from metadata.errors import InvalidMetadataError

FORMAT = 1
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
NAME_BYTES_MAX = 255

Position = tuple[int, int, int]  # (segment sequence, entry id, slot): a DLSN
FIRST_SEQUENCE = 1


def check_name(name: object, what: str) -> str:
    """A namespace or stream name: ``[A-Za-z0-9._-]+`` (DESIGN §4.5), not ``.`` or ``..`` (not
    valid znode names), at most 255 bytes."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", "..") \
            or len(name) > NAME_BYTES_MAX:
        raise InvalidMetadataError(f"bad {what} name {name!r}: want [A-Za-z0-9._-]+ (not '.' or '..'), "
                                   f"at most {NAME_BYTES_MAX} characters")
    return name


class SegmentState(enum.StrEnum):
    IN_PROGRESS = "in_progress"   # its writer may still add entries (its ledger is open)
    SEALED = "sealed"             # its ledger is closed; last_* are final
    TIERED = "tiered"             # its records live in a Delta table; its ledger is deleted


@dataclass(frozen=True)
class TierInfo:
    """Where a tiered segment's records live (set by tiering into Delta)."""

    table: str
    delta_version: int


@dataclass(frozen=True)
class SegmentMeta:
    """One segment: a ledger of record sets. ``last_*`` are known once sealed (-1 before)."""

    sequence: int
    ledger_id: int | None
    state: SegmentState
    first_txid: int
    last_txid: int = -1
    last_entry_id: int = -1
    last_slot: int = -1
    record_count: int = 0
    bytes: int = 0
    ctime_ms: int = 0
    sealed_ms: int | None = None
    tier: TierInfo | None = None
    # A replica's segment (DESIGN §4.12): the source stream's positions of its first and last
    # record, so that a truncation of the source maps onto the replica without reading it all.
    source: tuple[Position, Position] | None = None

    @property
    def first_dlsn(self) -> Position:
        return (self.sequence, 0, 0)

    @property
    def last_dlsn(self) -> Position | None:
        """The last record's position (None while in progress or when the segment is empty)."""
        if self.state is SegmentState.IN_PROGRESS or self.record_count == 0:
            return None
        return (self.sequence, self.last_entry_id, self.last_slot)

    @property
    def is_sealed(self) -> bool:
        return self.state is not SegmentState.IN_PROGRESS


@dataclass(frozen=True)
class StreamMeta:
    """The stream's own znode: what every change is a CAS on (its version orders the changes of
    segments, as DistributedLog's ledger-list version does)."""

    ctime_ms: int = 0
    next_sequence: int = FIRST_SEQUENCE
    max_txid: int = -1                      # the last txid of the sealed segments
    truncated_before: Position | None = None  # no reader returns a record before it
    end_of_stream: bool = False
    spark_batches: dict[str, int] = field(default_factory=dict)  # query or job id -> last batch committed
    # Bytes of the stream held on bookies (DESIGN §4.10: what a namespace's storage quota counts),
    # kept by every change (transitions.accounted) so that a namespace's usage is one read of its
    # stream nodes: the sealed segments' (tiered ones are not on bookies) and the segment in
    # progress's as its writer last published it. None: last written before this was kept.
    sealed_bytes: int | None = None
    open_bytes: int = 0
    # A replica's (§4.12): the ctime_ms of the source stream its copies come from. A source stream
    # deleted and created again under its name is another stream; linking refuses its copies here.
    source_ctime_ms: int | None = None


# ---------------------------------------------------------------------- encoding

def _dumps(d: dict[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT, **d}, sort_keys=True, separators=(",", ":")).encode()


def _loads(data: bytes, what: str) -> dict[str, Any]:
    try:
        d = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidMetadataError(f"{what}: not valid JSON ({e})") from e
    if not isinstance(d, dict) or not isinstance(d.get("v"), int):
        raise InvalidMetadataError(f"{what}: no format version")
    if d["v"] > FORMAT:
        raise InvalidMetadataError(f"{what}: format {d['v']} is newer than this code knows ({FORMAT})")
    d.pop("v")
    return d


def encode_segment(s: SegmentMeta) -> bytes:
    d = asdict(s)
    d["state"] = s.state.value
    if s.source is None:
        del d["source"]   # not written unless set: clients that predate replication read the rest
    else:
        d["source"] = [list(s.source[0]), list(s.source[1])]
    return _dumps(d)


def decode_segment(data: bytes, what: str = "segment") -> SegmentMeta:
    d = _loads(data, what)
    try:
        tier = d.pop("tier", None)
        source = d.pop("source", None)
        return SegmentMeta(**{**d, "state": SegmentState(d["state"]),
                              "tier": TierInfo(**tier) if tier else None,
                              "source": _source_range(source) if source else None})
    except (TypeError, ValueError, KeyError) as e:
        raise InvalidMetadataError(f"{what}: {e}") from e


def _source_range(raw: Any) -> tuple[Position, Position]:
    first, last = (tuple(int(x) for x in p) for p in raw)
    if len(first) != 3 or len(last) != 3 or last < first:
        raise ValueError(f"bad source range {raw!r}")
    return (first[0], first[1], first[2]), (last[0], last[1], last[2])


def encode_stream(m: StreamMeta) -> bytes:
    d = asdict(m)
    d["truncated_before"] = list(m.truncated_before) if m.truncated_before else None
    if m.source_ctime_ms is None:
        del d["source_ctime_ms"]   # not written unless set: clients that predate it read the rest
    return _dumps(d)


def decode_stream(data: bytes, what: str = "stream") -> StreamMeta:
    d = _loads(data, what)
    try:
        tb = d.get("truncated_before")
        return StreamMeta(**{**d, "truncated_before": tuple(tb) if tb else None})
    except (TypeError, ValueError) as e:
        raise InvalidMetadataError(f"{what}: {e}") from e


def encode_settings(settings: dict[str, Any], access: dict[str, Any] | None = None) -> bytes:
    """A namespace's znode: its settings and (from tenants on) its access record, the tenant and
    the grants (metadata.tenancy.NamespaceAccess.to_json)."""
    doc: dict[str, Any] = {"settings": settings}
    if access is not None:
        doc["access"] = access
    return _dumps(doc)


def decode_access(data: bytes, what: str = "namespace") -> dict[str, Any] | None:
    """The access record of a namespace's znode (None: it predates tenants)."""
    access = _loads(data, what).get("access")
    if access is not None and not isinstance(access, dict):
        raise InvalidMetadataError(f"{what}: bad access record")
    return access


def decode_settings(data: bytes, what: str = "namespace") -> dict[str, Any]:
    d = _loads(data, what)
    settings = d.get("settings")
    if not isinstance(settings, dict):
        raise InvalidMetadataError(f"{what}: no settings")
    return settings


def sealed(seg: SegmentMeta, *, last_entry_id: int, last_slot: int, record_count: int, nbytes: int,
           last_txid: int, now_ms: int) -> SegmentMeta:
    """The segment sealed at the given end (its ledger closed there)."""
    if seg.state is not SegmentState.IN_PROGRESS:
        raise InvalidMetadataError(f"segment {seg.sequence} is {seg.state.value}, not in progress")
    if record_count < 0 or (record_count == 0) != (last_entry_id < 0):
        raise InvalidMetadataError(f"segment {seg.sequence}: {record_count} records up to entry {last_entry_id}")
    return replace(seg, state=SegmentState.SEALED, last_entry_id=last_entry_id, last_slot=last_slot,
                   record_count=record_count, bytes=nbytes, last_txid=last_txid if record_count else -1,
                   sealed_ms=now_ms)


# ---------------------------------------------------------------------- subscriptions (DESIGN §4.11)

def check_position(pos: object, what: str = "position") -> Position:
    """A subscription's position: (segment >= 1, entry >= 0, slot >= -1). Slot -1 is "nothing of
    this entry consumed yet": a subscription that starts at a record, or that retention moved to a
    segment's start, sits just before it, so a reader resumes at slot 0."""
    if not isinstance(pos, tuple | list) or len(pos) != 3 or any(
            not isinstance(x, int) or isinstance(x, bool) for x in pos):
        raise InvalidMetadataError(f"bad {what} {pos!r}: want (segment, entry, slot)")
    seg, entry, slot = pos
    if seg < 1 or entry < 0 or slot < -1:
        raise InvalidMetadataError(f"bad {what} {seg}/{entry}/{slot}")
    return (seg, entry, slot)


@dataclass(frozen=True)
class SubscriptionMeta:
    """One subscription's znode (``<stream>/subscriptions/<name>``): the last record it consumed,
    and ``mark``, how many records and bytes of that record's segment are at or before it (read
    from the record's entry once, when the position is written), so that its backlog is counted
    from segment metadata alone, never by reading records."""

    position: Position
    mark: tuple[int, int] = (0, 0)     # (records, bytes) of position's segment up to and including it
    ctime_ms: int = 0
    updated_ms: int = 0

    @property
    def resume(self) -> Position:
        """Where a reader of this subscription goes on: the record after ``position``."""
        return (self.position[0], self.position[1], self.position[2] + 1)


def encode_subscription(s: SubscriptionMeta) -> bytes:
    return _dumps({"position": list(s.position), "mark": list(s.mark), "ctime_ms": s.ctime_ms,
                   "updated_ms": s.updated_ms})


def decode_subscription(data: bytes, what: str = "subscription") -> SubscriptionMeta:
    d = _loads(data, what)
    try:
        mark = d.get("mark") or [0, 0]
        return SubscriptionMeta(check_position(tuple(d["position"]), what), (int(mark[0]), int(mark[1])),
                                int(d.get("ctime_ms", 0)), int(d.get("updated_ms", 0)))
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise InvalidMetadataError(f"{what}: {e}") from e
