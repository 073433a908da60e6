"""The auditor's placement check of one ledger, remembered per ledger metadata version.

A ledger's verdict (fragments breaking the rack policy, copies outside its placement groups) is a
function of its metadata and of what the check assumed about the cluster: each bookie's network
location and group, which bookies are writable, the policy's minimum of locations, and the
groups the ledger must keep to (its namespace's current ones, else those recorded in it). The
verdict is kept on the ledger's view (:mod:`recovery.ledger_views`) with those assumptions; the
next check reuses it while the metadata version and every assumption are the same, so a check
of 100,000 unchanged ledgers decodes and evaluates none of them. When bookies come, go, move or
change group, every ledger is evaluated again (once); when a namespace's groups change, its
ledgers are.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ledger_client.placement import PlacementGroups
from ledger_client.protocol.checks import InvariantViolation

from .ledger_views import Scanned, metadata_of
from .plan import misplaced_copies, placement_violations


@dataclass(frozen=True, slots=True)
class Verdict:
    generation: int                       # the cluster view it was evaluated under
    groups: PlacementGroups               # the groups it was evaluated against
    violations: tuple[tuple[int, str], ...]
    misplaced: frozenset[str]


class PlacementAudit:
    """Evaluates ledgers under one cluster view at a time (:meth:`begin` before each check)."""

    def __init__(self) -> None:
        self._cluster: tuple[dict[str, str], dict[str, str], frozenset[str], int] | None = None
        self._generation = 0
        self._clean: dict[PlacementGroups, Verdict] = {}   # one shared verdict per groups for ledgers without findings
        self.evaluated = 0        # ledgers evaluated (not reused), over the life of the auditor

    def begin(self, location_of: Mapping[str, str], group_of: Mapping[str, str], writable: Collection[str],
              min_locations: int) -> None:
        cluster = (dict(location_of), dict(group_of), frozenset(writable), min_locations)
        if cluster != self._cluster:
            self._cluster = cluster
            self._generation += 1
            self._clean = {}

    def verdict(self, scanned: Scanned, groups: PlacementGroups) -> Verdict:
        """The ledger's verdict under the current cluster view and ``groups``: the remembered one
        when its metadata version, the cluster view and the groups are those it was made under."""
        view = scanned[0]
        cached = view.placement
        if isinstance(cached, Verdict) and cached.generation == self._generation and cached.groups == groups:
            return cached
        if self._cluster is None:
            raise InvariantViolation("PlacementAudit.verdict before begin")
        location_of, group_of, writable, min_locations = self._cluster
        md = metadata_of(scanned)
        found = tuple(placement_violations(md, location_of, min_locations))
        wrong = misplaced_copies(md, groups, group_of, writable)
        self.evaluated += 1
        if found or wrong:
            verdict = Verdict(self._generation, groups, found, frozenset(wrong))
        else:   # most ledgers: share one object (a view per ledger is what the auditor's memory is)
            verdict = self._clean.setdefault(groups, Verdict(self._generation, groups, (), frozenset()))
        view.placement = verdict
        return verdict
