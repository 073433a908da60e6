"""Choosing bookies for ensembles: random by default, rack/zone-aware when bookies say where they are.

As BookKeeper's RackawareEnsemblePlacementPolicy (simplified): spread an ensemble over as many
network locations as there are, then over as many hosts; never put two replicas on one host when
another host is available. Randomness is injected so tests and the simulator are repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import NotEnoughBookiesError


@dataclass(frozen=True)
class BookieNode:
    bookie_id: str
    network_location: str = ""

    @property
    def host(self) -> str:
        return self.bookie_id.rsplit(":", 1)[0]


class EnsemblePlacement:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(self, size: int, available: Iterable[BookieNode],
                     exclude: Iterable[str] = ()) -> list[str]:
        """`size` distinct bookies spread over locations and hosts; NotEnoughBookiesError if too few."""
        chosen = self._pick(size, available, set(exclude), [])
        return [n.bookie_id for n in chosen]

    def replace(self, ensemble: list[str], indexes: Iterable[int], available: Iterable[BookieNode],
                exclude: Iterable[str] = ()) -> list[str]:
        """A copy of `ensemble` with the bookies at `indexes` replaced by new ones."""
        idx = sorted(set(indexes))
        nodes = {n.bookie_id: n for n in available}
        keep = [nodes.get(b, BookieNode(b)) for i, b in enumerate(ensemble) if i not in idx]
        chosen = self._pick(len(idx), nodes.values(), set(exclude) | set(ensemble), keep)
        out = list(ensemble)
        for i, node in zip(idx, chosen, strict=True):
            out[i] = node.bookie_id
        return out

    def replace_available(self, ensemble: list[str], indexes: Iterable[int], available: Iterable[BookieNode],
                          exclude: Iterable[str] = (), last: Iterable[str] = ()) -> tuple[list[str], list[int]]:
        """`replace` as far as the spare bookies go: (the new ensemble, the indexes left with their
        old bookie for want of a spare). Spares go first to the indexes whose bookie is not in
        `last` (the caller's bookies that may stay, e.g. ones answering again), in index order."""
        idx = sorted(set(indexes))
        staying = set(last)
        nodes = {n.bookie_id: n for n in available}
        skip = set(exclude) | set(ensemble)
        spares = sum(1 for b in nodes if b not in skip)
        order = [i for i in idx if ensemble[i] not in staying] + [i for i in idx if ensemble[i] in staying]
        chosen = sorted(order[:spares])
        new = self.replace(ensemble, chosen, nodes.values(), exclude) if chosen else list(ensemble)
        return new, [i for i in idx if i not in chosen]

    def _pick(self, count: int, available: Iterable[BookieNode], exclude: set[str],
              already: list[BookieNode]) -> list[BookieNode]:
        pool = [n for n in available if n.bookie_id not in exclude]
        if len(pool) < count:
            raise NotEnoughBookiesError(
                f"need {count} more bookies, only {len(pool)} available (excluding {sorted(exclude)})")
        self._rng.shuffle(pool)
        picked: list[BookieNode] = []
        for _ in range(count):
            used = already + picked
            best = min(pool, key=lambda n: _crowding(n, used))
            pool.remove(best)
            picked.append(best)
        return picked


def _crowding(node: BookieNode, used: list[BookieNode]) -> tuple[int, int]:
    """Lower is better: first fewer replicas in the same location, then on the same host."""
    same_loc = sum(1 for u in used if node.network_location and u.network_location == node.network_location)
    same_host = sum(1 for u in used if u.host == node.host)
    return same_loc, same_host


def nodes_from_info(bookies: Iterable[str], info: Mapping[str, Mapping[str, str]]) -> list[BookieNode]:
    return [BookieNode(b, info.get(b, {}).get("network_location", "")) for b in bookies]
