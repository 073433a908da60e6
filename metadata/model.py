"""The ledger metadata model and its stored form (pure: no I/O).

A :class:`LedgerMetadata` is immutable and validated on construction, so no component can hold, or
write, metadata that breaks the rules every other component relies on (quorum sizes, one ensemble
of E distinct bookies per fragment, fragment keys strictly increasing: invariant 5). Changes are
made by the pure functions of :mod:`metadata.transitions`, applied through the one CAS loop of
:mod:`metadata.update`.

Stored form (the ledger znode's data): ``b"SBLM"`` + big-endian u16 format version + protobuf
``LedgerMetadataFormat`` (see ``ledger_metadata.proto``). The header lets a future format be
refused with a clear message instead of being misread, and lets tools tell our znodes apart from
BookKeeper's (which start with ``BookieMetadataFormatVersion``).
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import hmac
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from metadata import ledger_metadata_pb2 as pb
from metadata.errors import InvalidMetadataError
from metadata.layout import MAX_LEDGER_ID

MAGIC = b"SBLM"
#: What a ledger's node holds once a role without DELETE on its parent deleted it (tenants: see
#: metadata.zk.tenant_acl); read as absent, removed by a bookie.
TOMBSTONE = b"SBLD"
CURRENT_FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sH")
PASSWORD_HASH_BYTES = 20  # SHA-1


class DigestType(enum.Enum):
    """How entries are checksummed (BookKeeper's digest types; the client re-exports this)."""

    CRC32 = "CRC32"
    CRC32C = "CRC32C"
    HMAC = "HMAC"
    DUMMY = "DUMMY"

    @property
    def digest_bytes(self) -> int:
        """Size of the digest in an entry's framing (as in BookKeeper's DigestManager)."""
        return _DIGEST_BYTES[self]


_DIGEST_BYTES = {DigestType.CRC32: 8, DigestType.CRC32C: 4, DigestType.HMAC: 20, DigestType.DUMMY: 0}


class LedgerState(enum.Enum):
    """OPEN (a writer may add), IN_RECOVERY (a reader is recovering it), CLOSED (its end is fixed)."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


def master_key(password: bytes) -> bytes:
    """BookKeeper's ledger master key, SHA-1(b"ledger" + password): what the metadata stores."""
    return hashlib.sha1(b"ledger" + password).digest()


@dataclass(frozen=True)
class LedgerMetadata:
    """One ledger's metadata (BookKeeper's LedgerMetadata). Immutable; validated on construction.

    ``ensembles`` maps the first entry id of each fragment to its bookie ids (keys ascending);
    ``last_entry_id`` is -1 unless the ledger is closed (or closed empty). The dict fields are
    copied on construction so a caller's later mutation of its own dicts cannot leak in.
    """

    ledger_id: int
    state: LedgerState
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    last_entry_id: int
    length: int
    ensembles: dict[int, list[str]]
    digest_type: DigestType
    password_hash: bytes
    ctime: int
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    format_version: int = CURRENT_FORMAT_VERSION
    namespace: str = ""      # whose grants decide access ("" outside namespaces); never changed
    owner_role: str = ""     # the creator's role (token subject; "" with no authentication); never changed
    bookie_groups: tuple[str, ...] = ()            # placement groups of its copies (DESIGN §4.10); () = any
    bookie_groups_secondary: tuple[str, ...] = ()  # ... and where they fall back to

    def __post_init__(self) -> None:
        if any(isinstance(v, str | bytes) for v in dict(self.ensembles).values()):
            raise InvalidMetadataError(f"ledger {self.ledger_id}: each ensemble is a list of bookie ids")
        object.__setattr__(self, "ensembles", {k: list(v) for k, v in dict(self.ensembles).items()})
        object.__setattr__(self, "custom_metadata", dict(self.custom_metadata))
        object.__setattr__(self, "password_hash", bytes(self.password_hash))
        object.__setattr__(self, "bookie_groups", tuple(self.bookie_groups))
        object.__setattr__(self, "bookie_groups_secondary", tuple(self.bookie_groups_secondary))
        _validate(self)

    @classmethod
    def new_open(
        cls,
        ledger_id: int,
        ensemble: Sequence[str],
        *,
        write_quorum_size: int,
        ack_quorum_size: int,
        digest_type: DigestType,
        password: bytes,
        custom_metadata: Mapping[str, bytes] | None = None,
        ctime: int | None = None,
    ) -> LedgerMetadata:
        """The metadata of a ledger about to be created: OPEN, one fragment from entry 0."""
        return cls(
            ledger_id=ledger_id,
            state=LedgerState.OPEN,
            ensemble_size=len(ensemble),
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            last_entry_id=-1,
            length=0,
            ensembles={0: list(ensemble)},
            digest_type=digest_type,
            password_hash=master_key(password),
            ctime=int(time.time() * 1000) if ctime is None else ctime,
            custom_metadata=dict(custom_metadata or {}),
        )

    # -- queries ----------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def password_matches(self, password: bytes) -> bool:
        """Whether ``password`` is this ledger's (constant-time, so open() can refuse clearly)."""
        return hmac.compare_digest(master_key(password), self.password_hash)

    def ensemble_at(self, entry_id: int) -> list[str]:
        """The bookies of the fragment that covers ``entry_id`` (the last key ≤ it)."""
        if entry_id < 0:
            raise ValueError(f"entry id must be >= 0, got {entry_id}")
        keys = list(self.ensembles)
        if not keys:
            raise InvalidMetadataError(f"ledger {self.ledger_id} has no ensemble")
        return list(self.ensembles[keys[bisect.bisect_right(keys, entry_id) - 1]])

    def fragments(self) -> list[tuple[int, int, list[str]]]:
        """``(first, last, bookies)`` per fragment, ``last`` inclusive.

        The last fragment of an unclosed ledger has ``last = -1`` (open-ended). In a closed ledger
        the last fragment ends at ``last_entry_id``; a trailing fragment that starts after it (an
        ensemble change for entries that were never acknowledged) has ``last < first``: empty.
        """
        keys = list(self.ensembles)
        out: list[tuple[int, int, list[str]]] = []
        for i, first in enumerate(keys):
            if i + 1 < len(keys):
                last = keys[i + 1] - 1
                if self.is_closed:
                    last = min(last, self.last_entry_id)
            else:
                last = self.last_entry_id if self.is_closed else -1
            out.append((first, last, list(self.ensembles[first])))
        return out

    def write_set(self, entry_id: int) -> list[int]:
        """Ensemble indexes that store ``entry_id`` (BookKeeper's round-robin striping)."""
        if entry_id < 0:
            raise ValueError(f"entry id must be >= 0, got {entry_id}")
        return [(entry_id + i) % self.ensemble_size for i in range(self.write_quorum_size)]

    def bookies(self) -> set[str]:
        """Every bookie that appears in any fragment (the ledgers a lost bookie affects)."""
        return {b for ensemble in self.ensembles.values() for b in ensemble}


def _validate(md: LedgerMetadata) -> None:
    """Raise InvalidMetadataError unless ``md`` obeys every rule of the model."""
    lid = md.ledger_id

    def bad(why: str) -> InvalidMetadataError:
        return InvalidMetadataError(f"invalid metadata for ledger {lid}: {why}")

    if isinstance(lid, bool) or not isinstance(lid, int) or not 0 <= lid <= MAX_LEDGER_ID:
        raise bad("the ledger id must be an int in 0..2**63-1")
    if not isinstance(md.state, LedgerState):
        raise bad(f"state must be a LedgerState, got {md.state!r}")
    if not isinstance(md.digest_type, DigestType):
        raise bad(f"digest_type must be a DigestType, got {md.digest_type!r}")
    e, qw, qa = md.ensemble_size, md.write_quorum_size, md.ack_quorum_size
    if not e >= qw >= qa >= 1:
        raise bad(f"need ensemble >= write quorum >= ack quorum >= 1, got E={e} Qw={qw} Qa={qa}")
    if len(md.password_hash) != PASSWORD_HASH_BYTES:
        raise bad(f"password_hash must be {PASSWORD_HASH_BYTES} bytes, got {len(md.password_hash)}")
    if md.length < 0:
        raise bad(f"length must be >= 0, got {md.length}")
    if md.is_closed:
        if md.last_entry_id < -1:
            raise bad(f"a closed ledger's last entry id must be >= -1, got {md.last_entry_id}")
    elif md.last_entry_id != -1:
        raise bad(f"an {md.state.value} ledger has last entry id -1, got {md.last_entry_id}")
    previous = -1
    for first, bookies in md.ensembles.items():
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise bad(f"fragment keys must be ints >= 0, got {first!r}")
        if first <= previous:
            raise bad(f"fragment keys must be strictly increasing, got {list(md.ensembles)}")
        if previous == -1 and first != 0:
            raise bad(f"the first fragment must start at entry 0, got {first}")
        if len(bookies) != e or len(set(bookies)) != e:
            raise bad(f"fragment {first} must have exactly {e} distinct bookies, got {bookies}")
        if not all(isinstance(b, str) and b for b in bookies):
            raise bad(f"fragment {first} has an empty or non-string bookie id: {bookies}")
        previous = first
    for key, value in md.custom_metadata.items():
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise bad(f"custom metadata maps str to bytes, got {key!r}: {type(value).__name__}")


# -- stored form ------------------------------------------------------------------------------
_STATE_TO_PB = {
    LedgerState.OPEN: pb.LedgerMetadataFormat.OPEN,
    LedgerState.IN_RECOVERY: pb.LedgerMetadataFormat.IN_RECOVERY,
    LedgerState.CLOSED: pb.LedgerMetadataFormat.CLOSED,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
_DIGEST_TO_PB = {
    DigestType.CRC32: pb.LedgerMetadataFormat.CRC32,
    DigestType.CRC32C: pb.LedgerMetadataFormat.CRC32C,
    DigestType.HMAC: pb.LedgerMetadataFormat.HMAC,
    DigestType.DUMMY: pb.LedgerMetadataFormat.DUMMY,
}
_DIGEST_FROM_PB = {v: k for k, v in _DIGEST_TO_PB.items()}


def encode(md: LedgerMetadata) -> bytes:
    """The znode payload of ``md``: header + deterministic protobuf bytes."""
    if md.format_version != CURRENT_FORMAT_VERSION:
        raise InvalidMetadataError(
            f"cannot write ledger {md.ledger_id} in format version {md.format_version}; "
            f"this software writes version {CURRENT_FORMAT_VERSION}"
        )
    msg = pb.LedgerMetadataFormat(
        ledger_id=md.ledger_id,
        state=_STATE_TO_PB[md.state],
        ensemble_size=md.ensemble_size,
        write_quorum_size=md.write_quorum_size,
        ack_quorum_size=md.ack_quorum_size,
        last_entry_id=md.last_entry_id,
        length=md.length,
        segments=[
            pb.LedgerMetadataFormat.Segment(first_entry_id=first, bookies=bookies)
            for first, bookies in md.ensembles.items()
        ],
        digest_type=_DIGEST_TO_PB[md.digest_type],
        password_hash=md.password_hash,
        ctime=md.ctime,
        custom_metadata=md.custom_metadata,
        namespace=md.namespace,
        owner_role=md.owner_role,
        bookie_groups=md.bookie_groups,
        bookie_groups_secondary=md.bookie_groups_secondary,
    )
    return _HEADER.pack(MAGIC, CURRENT_FORMAT_VERSION) + msg.SerializeToString(deterministic=True)


def decode(data: bytes, ledger_id: int) -> LedgerMetadata:
    """Parse a znode payload written by :func:`encode`; InvalidMetadataError says what is wrong.

    ``ledger_id`` is the id the znode's path names; the payload must agree with it, so a node
    copied to the wrong place is refused instead of being served as another ledger.
    """
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: metadata does not start with {MAGIC!r} (got {bytes(data[:8])!r}); "
            "not spark-bookie ledger metadata"
        )
    _, version = _HEADER.unpack_from(data)
    if version > CURRENT_FORMAT_VERSION:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: metadata format version {version} is newer than this software "
            f"understands (up to {CURRENT_FORMAT_VERSION}); upgrade spark-bookie to read it"
        )
    if version < 1:
        raise InvalidMetadataError(f"ledger {ledger_id}: invalid metadata format version {version}")
    msg = pb.LedgerMetadataFormat()
    try:
        msg.ParseFromString(bytes(data[_HEADER.size :]))
    except DecodeError as e:
        raise InvalidMetadataError(f"ledger {ledger_id}: corrupt metadata protobuf ({e})") from e
    if msg.ledger_id != ledger_id:
        raise InvalidMetadataError(f"ledger {ledger_id}: the stored metadata is ledger {msg.ledger_id}'s")
    if msg.state not in _STATE_FROM_PB or msg.digest_type not in _DIGEST_FROM_PB:
        raise InvalidMetadataError(
            f"ledger {ledger_id}: unknown state {msg.state} or digest type {msg.digest_type}"
        )
    ensembles = {s.first_entry_id: list(s.bookies) for s in msg.segments}
    if len(ensembles) != len(msg.segments):
        raise InvalidMetadataError(f"ledger {ledger_id}: two fragments start at the same entry")
    return LedgerMetadata(
        ledger_id=ledger_id,
        state=_STATE_FROM_PB[msg.state],
        ensemble_size=msg.ensemble_size,
        write_quorum_size=msg.write_quorum_size,
        ack_quorum_size=msg.ack_quorum_size,
        last_entry_id=msg.last_entry_id,
        length=msg.length,
        ensembles=ensembles,
        digest_type=_DIGEST_FROM_PB[msg.digest_type],
        password_hash=msg.password_hash,
        ctime=msg.ctime,
        custom_metadata=dict(msg.custom_metadata),
        format_version=version,
        namespace=msg.namespace,
        owner_role=msg.owner_role,
        bookie_groups=tuple(msg.bookie_groups),
        bookie_groups_secondary=tuple(msg.bookie_groups_secondary),
    )
