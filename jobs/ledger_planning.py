"""Reads of ledgers, their pure parts: filter pushdown, partition planning, streaming offsets.

Everything here is deterministic and free of I/O, so the planning rules (which ledgers, which
entry ranges, how many tasks) are unit-tested without Spark or bookies (tests/unit/
test_source_planning.py). The readers (jobs/ledger_read.py, jobs/ledger_stream.py) only gather
ledger metadata and hand it to these functions; options are parsed in jobs/options.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from ledger_client.errors import IncorrectParameterError

ID_MAX = (1 << 63) - 1


# ---------------------------------------------------------------- pushdown


@dataclass(frozen=True)
class IdRange:
    """Which values of one id column a query wants: lo..hi (inclusive) and, if set, only `values`."""

    lo: int = 0
    hi: int = ID_MAX
    values: frozenset[int] | None = None

    def narrowed(self, f: Filter) -> IdRange | None:
        """This range AND the filter; None when the filter is not an integer comparison we apply."""
        if isinstance(f, In):
            vals = f.value
            if not all(_is_int(v) for v in vals):
                return None
            s = frozenset(int(v) for v in vals)
            return replace(self, values=s if self.values is None else self.values & s)
        v = getattr(f, "value", None)
        if not _is_int(v):
            return None
        v = int(v)  # type: ignore[arg-type]
        if isinstance(f, EqualTo):
            return replace(self, values=frozenset({v}) if self.values is None else self.values & {v})
        if isinstance(f, GreaterThan):
            return replace(self, lo=max(self.lo, v + 1))
        if isinstance(f, GreaterThanOrEqual):
            return replace(self, lo=max(self.lo, v))
        if isinstance(f, LessThan):
            return replace(self, hi=min(self.hi, v - 1))
        if isinstance(f, LessThanOrEqual):
            return replace(self, hi=min(self.hi, v))
        return None

    def admits(self, x: int) -> bool:
        return self.lo <= x <= self.hi and (self.values is None or x in self.values)

    def intervals(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The wanted values within lo..hi as maximal inclusive intervals, ascending."""
        a, b = max(lo, self.lo), min(hi, self.hi)
        if a > b:
            return []
        if self.values is None:
            return [(a, b)]
        out: list[tuple[int, int]] = []
        for v in sorted(x for x in self.values if a <= x <= b):
            if out and out[-1][1] == v - 1:
                out[-1] = (out[-1][0], v)
            else:
                out.append((v, v))
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Pushdown:
    """The AND of the filters the source applies itself on ledger_id and entry_id."""

    ledger: IdRange = field(default_factory=IdRange)
    entry: IdRange = field(default_factory=IdRange)


def filter_column(f: Filter) -> str | None:
    """The lower-cased top-level column a pushed filter tests, None for a nested one."""
    col = getattr(f, "attribute", None)
    return col[0].lower() if isinstance(col, tuple) and len(col) == 1 else None


def push_filters(filters: Iterable[Filter]) -> tuple[Pushdown, list[Filter]]:
    """(what the source applies, the filters left for Spark). Applied filters are exact: the
    planned entry ranges hold precisely the rows that pass them, so Spark need not re-check."""
    pd = Pushdown()
    rest: list[Filter] = []
    for f in filters:
        name = filter_column(f)
        if name == "ledger_id":
            narrowed = pd.ledger.narrowed(f)
            if narrowed is not None:
                pd = replace(pd, ledger=narrowed)
                continue
        elif name == "entry_id":
            narrowed = pd.entry.narrowed(f)
            if narrowed is not None:
                pd = replace(pd, entry=narrowed)
                continue
        rest.append(f)
    return pd, rest


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class Span:
    """Entries first..last (inclusive) of one ledger; `closed` says whether the ledger was closed
    when planned (an open ledger is read without recovery, up to what was confirmed)."""

    ledger_id: int
    first: int
    last: int
    closed: bool = True

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class LedgerExtent:
    """What planning needs of one ledger's metadata: its readable end and fragment starts."""

    ledger_id: int
    last_entry_id: int              # closed: last entry; open: the LAC when planned; -1: nothing
    fragment_starts: tuple[int, ...] = (0,)
    closed: bool = True


def _split(span: Span, fragment_starts: Sequence[int], size: int) -> list[Span]:
    """Cut at fragment boundaries (each piece reads one ensemble) and into pieces of <= size."""
    cuts = sorted(s for s in fragment_starts if span.first < s <= span.last)
    out: list[Span] = []
    lo = span.first
    for hi_excl in [*cuts, span.last + 1]:
        for a in range(lo, hi_excl, size):
            out.append(replace(span, first=a, last=min(hi_excl - 1, a + size - 1)))
        lo = hi_excl
    return out


def plan_spans(extents: Iterable[LedgerExtent], pushdown: Pushdown, entries_per_partition: int,
               min_partitions: int = 1) -> list[tuple[Span, ...]]:
    """Partitions (each a tuple of spans, at most entries_per_partition entries in all).

    Spans follow fragments and the pushed-down id ranges; small spans of many ledgers are packed
    together so a thousand tiny ledgers do not become a thousand tasks. When there are fewer
    entries than min_partitions full partitions, the size shrinks so every task gets a share.
    """
    wanted: list[tuple[Span, tuple[int, ...]]] = []
    for x in sorted(extents, key=lambda x: x.ledger_id):
        if not pushdown.ledger.admits(x.ledger_id) or x.last_entry_id < 0:
            continue
        for a, b in pushdown.entry.intervals(0, x.last_entry_id):
            wanted.append((Span(x.ledger_id, a, b, x.closed), x.fragment_starts))
    total = sum(s.entries for s, _ in wanted)
    size = max(1, min(entries_per_partition, -(-total // max(1, min_partitions))))
    parts: list[tuple[Span, ...]] = []
    current: list[Span] = []
    filled = 0
    for span, starts in wanted:
        for piece in _split(span, starts, size):
            if filled + piece.entries > size and current:
                parts.append(tuple(current))
                current, filled = [], 0
            current.append(piece)
            filled += piece.entries
    if current:
        parts.append(tuple(current))
    return parts


# ---------------------------------------------------------------- streaming offsets


def offsets_to_json(next_ids: Mapping[int, int]) -> dict[str, int]:
    """Offsets as Spark stores them: {"<ledger id>": next entry id to read}."""
    return {str(k): int(v) for k, v in sorted(next_ids.items())}


def offsets_from_json(offset: Mapping[str, object] | None) -> dict[int, int]:
    out: dict[int, int] = {}
    for k, v in (offset or {}).items():
        if not (str(k).isdigit() and _is_int(v) and int(v) >= 0):  # type: ignore[call-overload]
            raise IncorrectParameterError(f"bad ledger stream offset {k!r}: {v!r}")
        out[int(k)] = int(v)  # type: ignore[call-overload]
    return out


def advance_offsets(start: Mapping[int, int], ends: Mapping[int, int], limit_entries: int = 0) -> dict[int, int]:
    """The next end offset: each known ledger's readable end (`ends`: next id after its LAC or
    last entry), never going back, capped to `limit_entries` new entries in all (0: no cap; the
    ledgers with the lowest ids go first, so an old ledger drains before a new one starts)."""
    out = dict(start)
    budget = limit_entries if limit_entries > 0 else None
    for lid in sorted(set(start) | set(ends)):
        have = start.get(lid, 0)
        end = max(have, ends.get(lid, have))
        if budget is not None:
            end = min(end, have + budget)
            budget -= end - have
        out[lid] = end
    return out


def stream_spans(start: Mapping[int, int], end: Mapping[int, int], entries_per_partition: int,
                 closed: Mapping[int, bool] | None = None) -> list[tuple[Span, ...]]:
    """Partitions of one microbatch: entries start[l]..end[l]-1 of every ledger l, one ledger per
    partition piece (no packing: a microbatch is small and its ranges must stay exact)."""
    parts: list[tuple[Span, ...]] = []
    for lid in sorted(end):
        a, b = start.get(lid, 0), end[lid] - 1
        if b < a:
            continue
        span = Span(lid, a, b, (closed or {}).get(lid, False))
        parts += [(p,) for p in _split(span, (), entries_per_partition)]
    return parts
