"""A namespace's settings: what every stream in it uses for its next segment (DESIGN §4.5).

One frozen dataclass, units in the names, validated when built (IncorrectParameterError naming
the field); stored as JSON in the namespace's znode. Changing them applies to segments started
afterwards: a segment keeps the ledger it was created with.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..errors import IncorrectParameterError
from ..protocol.framing import DigestType

MIB = 1 << 20
GROUP_FIELDS = ("bookie_groups", "bookie_groups_secondary")
GROUP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
BACKLOG_POLICIES = ("refuse_writes", "drop_oldest")   # Pulsar's producer_exception, consumer_backlog_eviction


@dataclass(frozen=True)
class NamespaceSettings:
    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    digest_type: str = "CRC32C"                       # a DigestType name
    password: str = ""                                # the segments' ledger password (UTF-8)
    segment_rolling_bytes: int | None = 256 * MIB     # a new segment once the current one holds this much
    segment_rolling_interval_ms: int | None = 3_600_000   # ... or is this old (None: never by age)
    retention_ms: int | None = None                   # sealed segments older than this are deleted
    retention_bytes: int | None = None                # the oldest sealed segments go above this total
    record_size_bytes_max: int = MIB
    output_buffer_bytes: int = 256 * 1024             # records packed into one entry, up to this much
    tier_after_ms: int | None = None                  # sealed segments older than this are tiered into Delta
    tier_table: str | None = None                     # ... into this table (per stream: <tier_table>/<stream>)
    # Isolation (DESIGN §4.10); None = no constraint.
    bookie_groups: tuple[str, ...] | None = None      # segments' ensembles only from bookies of these groups
    bookie_groups_secondary: tuple[str, ...] | None = None  # ... or of these, when the primary groups lack bookies
    storage_quota_bytes: int | None = None            # bytes of the namespace held on bookies (tiered data not counted)
    write_rate_bytes_per_s: int | None = None         # enforced by the bookies: a faster writer is slowed
    write_rate_records_per_s: int | None = None
    # Subscriptions (DESIGN §4.11).
    retain_until_consumed: bool = False               # retention keeps what some subscription has not passed
    backlog_quota_bytes: int | None = None            # the slowest subscription's backlog per stream, at most
    backlog_quota_policy: str = "refuse_writes"       # past it: "refuse_writes" (QuotaExceededError) or "drop_oldest"

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in GROUP_FIELDS:
                problems.extend(_group_problems(f.name, v))
            elif f.name == "retain_until_consumed":
                if not isinstance(v, bool):
                    problems.append(f"{f.name} must be true or false")
            elif f.name == "backlog_quota_policy":
                if v not in BACKLOG_POLICIES:
                    problems.append(f"{f.name} must be one of {', '.join(BACKLOG_POLICIES)}, not {v!r}")
            elif f.name in ("digest_type", "password", "tier_table"):
                if not isinstance(v, str) and not (f.name == "tier_table" and v is None):
                    problems.append(f"{f.name} must be a string")
            elif not (v is None and "None" in str(f.type)) and (not isinstance(v, int) or isinstance(v, bool)):
                problems.append(f"{f.name} must be an integer{' or None' if 'None' in str(f.type) else ''}")
            elif isinstance(v, int) and v < (0 if f.name.startswith(("retention", "tier")) else 1):
                problems.append(f"{f.name} must be positive")
        if problems:
            raise IncorrectParameterError("bad namespace settings: " + "; ".join(problems))
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise IncorrectParameterError("bad namespace settings: need ensemble_size >= write_quorum_size >= "
                                          f"ack_quorum_size >= 1, got {self.ensemble_size}/{self.write_quorum_size}/"
                                          f"{self.ack_quorum_size}")
        if self.bookie_groups_secondary and not self.bookie_groups:
            raise IncorrectParameterError("bad namespace settings: bookie_groups_secondary is a fallback for "
                                          "bookie_groups, which is not set")
        if self.digest_type not in DigestType.__members__:
            raise IncorrectParameterError(f"bad namespace settings: digest_type {self.digest_type!r} is not one of "
                                          f"{sorted(DigestType.__members__)}")
        if self.record_size_bytes_max > 64 * MIB or self.output_buffer_bytes > 64 * MIB:
            raise IncorrectParameterError("bad namespace settings: records and record sets are at most 64 MiB")

    @property
    def digest(self) -> DigestType:
        return DigestType[self.digest_type]

    @property
    def ledger_password(self) -> bytes:
        return self.password.encode()

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in GROUP_FIELDS:
            if d[name] is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NamespaceSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls.build(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def build(cls, **settings: Any) -> NamespaceSettings:
        unknown = set(settings) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise IncorrectParameterError(f"unknown namespace settings: {sorted(unknown)}")
        if isinstance(settings.get("digest_type"), DigestType):
            settings["digest_type"] = settings["digest_type"].name
        if isinstance(settings.get("password"), bytes | bytearray):
            settings["password"] = bytes(settings["password"]).decode()
        for name in GROUP_FIELDS:   # a list (JSON, the CLI) or a comma-separated string -> a tuple
            v = settings.get(name)
            if isinstance(v, str):
                v = [g.strip() for g in v.split(",")] if v.strip() else None
            if isinstance(v, list):
                settings[name] = tuple(v)
        return cls(**settings)

    def updated(self, **changes: Any) -> NamespaceSettings:
        return NamespaceSettings.build(**{**self.to_json(), **changes})


def _group_problems(name: str, v: object) -> list[str]:
    """A placement group list is None or a non-empty tuple of distinct group names."""
    if v is None:
        return []
    if not isinstance(v, tuple) or not v:
        return [f"{name} must be a non-empty list of group names or None"]
    bad = [g for g in v if not isinstance(g, str) or not GROUP_NAME.fullmatch(g)]
    if bad:
        return [f"{name}: {bad!r} are not group names ([A-Za-z0-9._-], 1-64 characters)"]
    if len(set(v)) != len(v):
        return [f"{name} names a group twice"]
    return []
