"""Pure decisions of re-replication: which fragments need work, what to copy from where, the
metadata transition that publishes a copy, and what the auditor's checks look at.

No I/O here, so every rule is unit-tested on its own (tests/unit/test_recovery_plan.py):
- a fragment names a bookie to replace → it is repaired one of three ways: its entries are copied
  (a finished fragment), only its metadata changes (an empty trailing fragment of a closed
  ledger), or it must wait for the ledger to be fenced and closed (the last fragment of a ledger
  that is not closed: its writer may still add entries there, BookKeeper's
  ``isLastSegmentOpenAndMissingBookies``);
- an entry is copied to the replacement of every replaced bookie of its write set, read from a
  bookie of its write set that is not being replaced (reachable ones first);
- the transition refuses to touch the last fragment of an unclosed ledger, so a worker can never
  overwrite a live writer's ensemble (the writer's own changes go through the same CAS loop).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from ledger_client.machines import write_set
from ledger_client.placement import (
    NO_GROUPS,
    PRIMARY,
    SECONDARY,
    BookieNode,
    EnsemblePlacement,
    PlacementGroups,
    misplaced,
)
from metadata import LedgerMetadata, transitions

from .errors import FragmentUnrecoverableError, OpenFragmentError


class RepairKind(enum.Enum):
    COPY = "copy"                    # a finished fragment with entries: copy them, then swap the bookie
    METADATA_ONLY = "metadata_only"  # a finished fragment without entries: swap the bookie only
    OPEN_LAST = "open_last"          # the last fragment of an unclosed ledger: fence and close first


@dataclass(frozen=True)
class FragmentRepair:
    """One fragment that names bookies to replace."""

    first_entry_id: int
    last_entry_id: int              # inclusive; < first_entry_id when empty; -1 while open-ended
    ensemble: tuple[str, ...]
    positions: tuple[int, ...]      # ensemble indexes of the bookies to replace
    kind: RepairKind

    @property
    def replaced(self) -> tuple[str, ...]:
        return tuple(self.ensemble[i] for i in self.positions)


def plan_repair(md: LedgerMetadata, replace: Collection[str]) -> list[FragmentRepair]:
    """Every fragment of ``md`` naming a bookie of ``replace``, with how it is to be repaired."""
    wanted = set(replace)
    out: list[FragmentRepair] = []
    fragments = md.fragments()
    for i, (first, last, bookies) in enumerate(fragments):
        positions = tuple(k for k, b in enumerate(bookies) if b in wanted)
        if not positions:
            continue
        is_last = i == len(fragments) - 1
        if is_last and not md.is_closed:
            kind = RepairKind.OPEN_LAST
        elif last < first:
            kind = RepairKind.METADATA_ONLY
        else:
            kind = RepairKind.COPY
        out.append(FragmentRepair(first, last, tuple(bookies), positions, kind))
    return out


def names_any(md: LedgerMetadata, bookies: Collection[str]) -> bool:
    """Whether any fragment of the ledger names one of ``bookies``."""
    return not md.bookies().isdisjoint(bookies)


def choose_replacements(placement: EnsemblePlacement, repair: FragmentRepair, writable: Iterable[BookieNode],
                        exclude: Collection[str], groups: PlacementGroups = NO_GROUPS) -> dict[int, str]:
    """A new bookie per replaced position, spread by the placement policy within ``groups``, never
    one of ``exclude`` nor one already in the fragment (NotEnoughBookiesError when too few)."""
    new = placement.replace(list(repair.ensemble), repair.positions, writable, exclude, groups)
    return {i: new[i] for i in repair.positions}


def move_groups(groups: PlacementGroups, repair: FragmentRepair, alive: Iterable[BookieNode]) -> PlacementGroups | None:
    """The groups a repair's replacements must come from when it moves live bookies that break
    ``groups`` (the auditor marked them misplaced): better placed than the bookies they replace
    (:meth:`PlacementGroups.better_than`). None when it moves none: a plain repair, which may also
    fill a bookie back in place."""
    tier_of = {n.bookie_id: groups.tier(n.group) for n in alive}
    tiers = [tier_of[b] for b in repair.replaced if b in tier_of and tier_of[b] != PRIMARY]
    if not groups or not tiers:
        return None
    return groups.better_than(SECONDARY if SECONDARY in tiers else None)


def misplaced_copies(md: LedgerMetadata, groups: PlacementGroups, group_of: Mapping[str, str],
                     writable: Collection[str]) -> set[str]:
    """The bookies of a closed ledger that break its placement groups (ledger_client.placement.
    misplaced); an open ledger's ensemble is its writer's business, so nothing for those."""
    if not md.is_closed:
        return set()
    return misplaced(md.ensembles.values(), group_of, writable, groups)


# ---------------------------------------------------------------------- what to copy


@dataclass(frozen=True)
class CopyRun:
    """Entries read from one source (the first of ``sources`` that answers) in one listed read and
    sent to every bookie of ``targets``. Every source holds every entry of the run. The ids ascend
    but need not be consecutive: a striped fragment's entries on one bookie skip the others'."""

    entry_ids: tuple[int, ...]
    sources: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def first(self) -> int:
        return self.entry_ids[0]

    @property
    def last(self) -> int:
        return self.entry_ids[-1]

    @property
    def entries(self) -> int:
        return len(self.entry_ids)


def copy_runs(md: LedgerMetadata, repair: FragmentRepair, new_bookies: Mapping[int, str],
              reachable: Collection[str], max_entries: int,
              only: Mapping[int, Collection[int]] | None = None) -> list[CopyRun]:
    """The reads and writes that copy ``repair``'s fragment to ``new_bookies`` (position → bookie);
    a position in ``only`` gets just the entries listed for it there (a bookie filled in place gets
    what it lacks).

    Entries whose write set has no replaced position need nothing. Sources are the bookies of the
    entry's write set that are not being replaced, reachable ones first, rotated from run to run so
    the read load spreads over the survivors; a replaced bookie that is still reachable (a live one
    being decommissioned) comes last, for entries whose other copies are gone. A run gathers up to
    ``max_entries`` entries with the same sources and targets, consecutive or not: when E == Qw a
    fragment becomes a few ranges; when E > Qw it becomes one listed read per surviving source
    (per-request costs, not bytes, bound a copy on Python gRPC).
    FragmentUnrecoverableError if an entry has no source at all.
    """
    replaced = set(repair.positions)
    runs: list[CopyRun] = []
    open_runs: dict[tuple[tuple[str, ...], tuple[str, ...]], list[int]] = {}

    def lacks(p: int, e: int) -> bool:   # a replaced position lacks all of its share but what `only` says
        return p in replaced and (only is None or p not in only or e in only[p])

    for e in range(repair.first_entry_id, repair.last_entry_id + 1):
        ws = write_set(e, md.ensemble_size, md.write_quorum_size)
        targets = tuple(new_bookies[p] for p in ws if lacks(p, e))
        if not targets:
            continue
        # a bookie being filled that holds this entry is a source like any other
        survivors = [repair.ensemble[p] for p in sorted(ws) if not lacks(p, e)]
        # a bookie being replaced that still answers (decommissioned while alive) is the last resort
        leaving = [repair.ensemble[p] for p in sorted(ws) if lacks(p, e) and repair.ensemble[p] in reachable]
        if not survivors and not leaving:
            raise FragmentUnrecoverableError(
                f"ledger {md.ledger_id} entry {e}: every bookie of its write set "
                f"({[repair.ensemble[p] for p in ws]}) is being replaced; no copy survives to read from")
        sources = tuple(sorted(survivors, key=lambda b: (b not in reachable, survivors.index(b))) + leaving)
        ids = open_runs.setdefault((sources, targets), [])
        ids.append(e)
        if len(ids) >= max_entries:
            runs.append(CopyRun(tuple(ids), sources, targets))
            del open_runs[(sources, targets)]
    runs.extend(CopyRun(tuple(ids), sources, targets) for (sources, targets), ids in open_runs.items())
    runs.sort(key=lambda r: r.first)
    replaced_bookies = set(repair.replaced)
    return [_rotated(run, k, reachable, replaced_bookies) for k, run in enumerate(runs)]


def _rotated(run: CopyRun, k: int, reachable: Collection[str], leaving: Collection[str]) -> CopyRun:
    up = [b for b in run.sources if b in reachable and b not in leaving]
    if len(up) < 2:
        return run
    r = k % len(up)
    rest = [b for b in run.sources if b not in up]
    return CopyRun(run.entry_ids, tuple(up[r:] + up[:r] + rest), run.targets)


def copy_entry_count(md: LedgerMetadata, bookie: str) -> int:
    """How many entry copies re-replicating ``bookie`` out of this ledger writes (finished
    fragments only): what the recovery benchmark divides by the time it took."""
    total = 0
    for repair in plan_repair(md, {bookie}):
        if repair.kind is not RepairKind.COPY:
            continue
        p = repair.positions[0]
        for e in range(repair.first_entry_id, repair.last_entry_id + 1):
            if p in write_set(e, md.ensemble_size, md.write_quorum_size):
                total += 1
    return total


# ---------------------------------------------------------------------- publishing a copy


def replace_in_fragment(md: LedgerMetadata, first_entry_id: int, replacements: Mapping[str, str]) -> LedgerMetadata:
    """Transition: in the fragment starting at ``first_entry_id`` each old bookie gives way to its
    new one. Idempotent (already replaced: unchanged), so the CAS loop may re-apply it to whatever
    it reads; OpenFragmentError for the last fragment of an unclosed ledger, which belongs to its
    writer (or to a recovery) until the ledger is closed."""
    if not md.is_closed and md.ensembles and first_entry_id == max(md.ensembles):
        raise OpenFragmentError(
            f"ledger {md.ledger_id}: fragment {first_entry_id} is the last fragment of a {md.state.value} "
            "ledger; it can only be re-replicated once the ledger is closed")
    for old, new in replacements.items():
        md = transitions.replace_bookie(md, first_entry_id, old, new)
    return md


# ---------------------------------------------------------------------- auditor's views


def build_index(ledgers: Iterable[LedgerMetadata]) -> dict[str, set[int]]:
    """Bookie → ids of the ledgers that name it in any fragment (BookKeeper's BookieLedgerIndexer)."""
    index: dict[str, set[int]] = {}
    for md in ledgers:
        for b in md.bookies():
            index.setdefault(b, set()).add(md.ledger_id)
    return index


def positions_entries(md: LedgerMetadata, first: int, last: int, position: int) -> Iterator[int]:
    """Entry ids in [first, last] whose write set includes ensemble index ``position``."""
    for e in range(first, last + 1):
        if (position - e) % md.ensemble_size < md.write_quorum_size:
            yield e


def sample_entries(md: LedgerMetadata, first: int, last: int, position: int, fraction: float,
                   rng: random.Random) -> list[int]:
    """What the checker reads from the bookie at ``position``: its first and last entry of the
    fragment (BookKeeper's LedgerChecker with verification percentage 0), plus each other entry
    it stores with probability ``fraction``."""
    stored = positions_entries(md, first, last, position)
    head = next(stored, None)
    if head is None:
        return []
    out = [head]
    tail = None
    for e in stored:
        if tail is not None and fraction > 0 and rng.random() < fraction:
            out.append(tail)
        tail = e
    if tail is not None:
        out.append(tail)
    return out


def checkable_fragments(md: LedgerMetadata) -> list[tuple[int, int, list[str]]]:
    """Finished, non-empty fragments: those whose entries must all be on their bookies."""
    frags = md.fragments()
    out = []
    for i, (first, last, bookies) in enumerate(frags):
        if i == len(frags) - 1 and not md.is_closed:
            continue
        if last >= first:
            out.append((first, last, bookies))
    return out


def placement_violations(md: LedgerMetadata, location_of: Mapping[str, str],
                         min_locations: int) -> list[tuple[int, str]]:
    """Fragments whose write sets span fewer network locations than the policy asks:
    ``min(min_locations, Qw, locations known in the cluster)``, as BookKeeper's rack-aware policy's
    minNumRacksPerWriteQuorum. Nothing is checked while the cluster knows fewer than two locations."""
    cluster_locations = {loc for loc in location_of.values() if loc}
    need = min(min_locations, md.write_quorum_size, len(cluster_locations))
    if need < 2:
        return []
    out: list[tuple[int, str]] = []
    for key, ensemble in md.ensembles.items():
        for start in range(md.ensemble_size):
            ws = [ensemble[i] for i in write_set(start, md.ensemble_size, md.write_quorum_size)]
            locs = {location_of.get(b, "") for b in ws} - {""}
            if len(locs) < need:
                out.append((key, f"write set {ws} spans {len(locs)} location(s), policy wants {need}"))
                break
    return out
