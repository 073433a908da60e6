"""Choosing bookies for ensembles: random by default, rack/zone-aware when bookies say where they
are, and within a ledger's placement groups (DESIGN §4.10) when it has them.

As BookKeeper's RackawareEnsemblePlacementPolicy (simplified): spread an ensemble over as many
network locations as there are, then over as many hosts; never put two replicas on one host when
another host is available. Placement groups (Pulsar's IsolatedBookieEnsemblePlacementPolicy) act
before that: only bookies of the primary groups are candidates, those of the secondary groups only
for the places the primary ones cannot fill, and the crowding rules then choose among them.
Randomness is injected so tests and the simulator are repeatable. Everything here is pure.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial

from metadata import LedgerMetadata

from .errors import NotEnoughBookiesError

PRIMARY, SECONDARY = 0, 1


@dataclass(frozen=True)
class BookieNode:
    bookie_id: str
    network_location: str = ""
    group: str = ""            # its placement group ("" = none)

    @cached_property
    def host(self) -> str:
        return self.bookie_id.rsplit(":", 1)[0]


@dataclass(frozen=True)
class PlacementGroups:
    """Which bookies may hold a ledger's copies. Empty ``primary`` = any bookie (no constraint)."""

    primary: tuple[str, ...] = ()
    secondary: tuple[str, ...] = ()

    @classmethod
    def of(cls, primary: Iterable[str] | None, secondary: Iterable[str] | None = None) -> PlacementGroups:
        return cls(tuple(primary or ()), tuple(secondary or ()) if primary else ())

    @classmethod
    def of_ledger(cls, md: LedgerMetadata) -> PlacementGroups:
        """The groups recorded in a ledger's metadata at its creation."""
        return cls(md.bookie_groups, md.bookie_groups_secondary)

    def __bool__(self) -> bool:
        return bool(self.primary)

    def tier(self, group: str) -> int | None:
        """PRIMARY, SECONDARY, or None for a group outside both (always PRIMARY when unconstrained)."""
        if not self.primary or group in self.primary:
            return PRIMARY
        return SECONDARY if group in self.secondary else None

    def better_than(self, tier: int | None) -> PlacementGroups:
        """The groups a bookie at ``tier`` may be moved to so the move improves the placement: a
        bookie outside the groups may go to either tier, a secondary one only to a primary group
        (moving it to another secondary bookie would be churn for nothing)."""
        return PlacementGroups(self.primary) if tier == SECONDARY else self

    def describe(self) -> str:
        if not self.primary:
            return "any group"
        out = f"groups {','.join(self.primary)}"
        return out + (f" (secondary {','.join(self.secondary)})" if self.secondary else "")


NO_GROUPS = PlacementGroups()


class EnsemblePlacement:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    @staticmethod
    def groups_of(md: LedgerMetadata) -> PlacementGroups:
        return PlacementGroups.of_ledger(md)

    def new_ensemble(self, size: int, available: Iterable[BookieNode], exclude: Iterable[str] = (),
                     groups: PlacementGroups = NO_GROUPS) -> list[str]:
        """`size` distinct bookies of ``groups`` spread over locations and hosts;
        NotEnoughBookiesError (naming the groups when they are what is short) if too few."""
        chosen = self._pick(size, list(available), set(exclude), [], groups)
        return [n.bookie_id for n in chosen]

    def replace(self, ensemble: list[str], indexes: Iterable[int], available: Iterable[BookieNode],
                exclude: Iterable[str] = (), groups: PlacementGroups = NO_GROUPS) -> list[str]:
        """A copy of `ensemble` with the bookies at `indexes` replaced by new ones of ``groups``."""
        idx = sorted(set(indexes))
        nodes = {n.bookie_id: n for n in available}
        keep = [nodes.get(b, BookieNode(b)) for i, b in enumerate(ensemble) if i not in idx]
        chosen = self._pick(len(idx), list(nodes.values()), set(exclude) | set(ensemble), keep, groups)
        out = list(ensemble)
        for i, node in zip(idx, chosen, strict=True):
            out[i] = node.bookie_id
        return out

    def replace_available(self, ensemble: list[str], indexes: Iterable[int], available: Iterable[BookieNode],
                          exclude: Iterable[str] = (), last: Iterable[str] = (),
                          groups: PlacementGroups = NO_GROUPS) -> tuple[list[str], list[int]]:
        """`replace` as far as the spare bookies go: (the new ensemble, the indexes left with their
        old bookie for want of a spare). Spares go first to the indexes whose bookie is not in
        `last` (the caller's bookies that may stay, e.g. ones answering again), in index order."""
        idx = sorted(set(indexes))
        staying = set(last)
        nodes = {n.bookie_id: n for n in available}
        skip = set(exclude) | set(ensemble)
        spares = sum(1 for n in nodes.values() if n.bookie_id not in skip and groups.tier(n.group) is not None)
        order = [i for i in idx if ensemble[i] not in staying] + [i for i in idx if ensemble[i] in staying]
        chosen = sorted(order[:spares])
        new = self.replace(ensemble, chosen, nodes.values(), exclude, groups) if chosen else list(ensemble)
        return new, [i for i in idx if i not in chosen]

    def _pick(self, count: int, available: list[BookieNode], exclude: set[str],
              already: list[BookieNode], groups: PlacementGroups) -> list[BookieNode]:
        free = [n for n in available if n.bookie_id not in exclude]
        pool = [n for n in free if groups.tier(n.group) is not None]
        if len(pool) < count:
            raise NotEnoughBookiesError(_shortage(count, len(pool), len(free), exclude, groups))
        self._rng.shuffle(pool)
        picked: list[BookieNode] = []
        for _ in range(count):
            used = already + picked
            best = _first_least(pool, partial(_placement_key, groups, used))
            pool.remove(best)
            picked.append(best)
        return picked


def _placement_key(groups: PlacementGroups, used: list[BookieNode], n: BookieNode) -> tuple[int | None, int, int]:
    return (groups.tier(n.group), *_crowding(n, used))


_FLOOR = (PRIMARY, 0, 0)   # the best key there is: a primary bookie sharing nothing with the others


def _first_least(pool: list[BookieNode], key: Callable[[BookieNode], tuple[int | None, int, int]]) -> BookieNode:
    """``min(pool, key=key)`` (the first of the least), stopping at the first key that nothing can
    beat: with many bookies the first of the shuffled pool usually is one, so a placement costs
    what the ensemble needs, not a scan of every bookie per place (issue 33: 30 bookies)."""
    best, best_key = pool[0], key(pool[0])
    for n in pool[1:]:
        if best_key == _FLOOR:
            break
        k = key(n)
        if k < best_key:  # type: ignore[operator]   # tiers of the pool are never None
            best, best_key = n, k
    return best


def _shortage(count: int, pool: int, free: int, exclude: set[str], groups: PlacementGroups) -> str:
    if groups and free >= count:
        return (f"need {count} more bookies of placement {groups.describe()}, only {pool} available there "
                f"({free - pool} other writable bookies are outside them)")
    where = f" of placement {groups.describe()}" if groups else ""
    return f"need {count} more bookies{where}, only {pool} available (excluding {sorted(exclude)})"


def _crowding(node: BookieNode, used: list[BookieNode]) -> tuple[int, int]:
    """Lower is better: first fewer replicas in the same location, then on the same host."""
    same_loc = sum(1 for u in used if node.network_location and u.network_location == node.network_location)
    same_host = sum(1 for u in used if u.host == node.host)
    return same_loc, same_host


def nodes_from_info(bookies: Iterable[str], info: Mapping[str, Mapping[str, str]]) -> list[BookieNode]:
    """Placement nodes from bookies' registration info (``network_location``, ``bookie_group``)."""
    return [node_of(b, info.get(b, {})) for b in bookies]


def node_of(bookie: str, info: Mapping[str, object]) -> BookieNode:
    return BookieNode(bookie, str(info.get("network_location") or ""), str(info.get("bookie_group") or ""))


# ---------------------------------------------------------------------- checks of a placement


def misplaced(ensembles: Iterable[Sequence[str]], group_of: Mapping[str, str], writable: Collection[str],
              groups: PlacementGroups) -> set[str]:
    """The bookies of these fragments that break ``groups`` and that a move could fix.

    ``group_of`` covers the bookies known now (lost ones are the lost-bookie audit's business, so
    unknown bookies are never misplaced here). A bookie outside the groups is misplaced; one of a
    secondary group (a fallback when the primary groups lacked bookies) only while writable
    primary bookies outside its fragment could take its place, and only as many per fragment as
    there are such spares after the outside ones, so a move never lands on another secondary."""
    if not groups:
        return set()
    primary = {b for b in writable if groups.tier(group_of.get(b, "")) == PRIMARY}
    out: set[str] = set()
    for ensemble in ensembles:
        known = [b for b in ensemble if b in group_of]
        outside = [b for b in known if groups.tier(group_of[b]) is None]
        second = [b for b in known if groups.tier(group_of[b]) == SECONDARY]
        spares = len(primary - set(ensemble)) - len(outside)
        out.update(outside)
        out.update(second[:max(0, spares)])
    return out


def group_problems(groups: PlacementGroups, writable: Iterable[BookieNode], ensemble_size: int) -> list[str]:
    """What keeps ``groups`` from taking a new ensemble of ``ensemble_size``, in words (empty: fine):
    a group without writable bookies, and too few bookies in the primary groups (and the
    secondary ones). What `stream info` and `cluster status` report before a write finds it."""
    if not groups:
        return []
    nodes = list(writable)
    counts = {g: sum(1 for n in nodes if n.group == g) for g in groups.primary + groups.secondary}
    out = [f"bookie group {g!r} has no writable bookies" for g, k in counts.items() if k == 0]
    primary = sum(counts[g] for g in groups.primary)
    both = primary + sum(counts[g] for g in groups.secondary)
    if both < ensemble_size:
        out.append(f"placement {groups.describe()} has {both} writable bookies, an ensemble needs {ensemble_size}")
    elif primary < ensemble_size:
        out.append(f"primary groups {','.join(groups.primary)} have {primary} writable bookies, an ensemble "
                   f"needs {ensemble_size}: new ensembles fall back to the secondary groups")
    return out
