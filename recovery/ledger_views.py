"""What the auditor keeps of every ledger's metadata between its scans, so that a scan of 100,000
ledgers decodes only those whose metadata changed.

Every scan still lists every ledger and reads every metadata node (pipelined, a batch per round
trip): nothing but the node's version says whether a ledger changed, and the data check must
look at every ledger each time. What a scan no longer repeats for a ledger whose node version is
the one seen last time is the decoding and everything derived from the decoded metadata: the
bookies it names (the audit's index), whether it has finished fragments to probe (the data
check), and the placement verdict (:mod:`recovery.placement_audit`). A node version identifies
the metadata exactly: every write is a compare-and-set that moves it on, and a ledger id is
never handed out twice, so a deleted and re-created node cannot come back at an old version.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ledger_client.placement import PlacementGroups
from ledger_client.protocol.checks import invariant
from metadata import LedgerMetadata, MetadataStore, decode

from .plan import checkable_fragments

#: distinct bookie sets / recorded groups kept for sharing before the table starts over
_INTERN_MAX = 100_000


@dataclass(slots=True, eq=False)
class LedgerView:
    """One ledger at one metadata version, as the auditor's checks see it."""

    ledger_id: int
    version: int
    bookies: frozenset[str]                  # every bookie any fragment names (shared between ledgers)
    namespace: str
    recorded: PlacementGroups                # the groups recorded at its creation
    probe_md: LedgerMetadata | None          # kept only when it has finished fragments to probe
    placement: Any = None                    # recovery.placement_audit's verdict, with what it assumed


#: one scanned ledger: its view, its node's bytes, and its metadata when this scan decoded it
Scanned = tuple[LedgerView, bytes, LedgerMetadata | None]


class LedgerViews:
    """The views of the last scan's ledgers (at most ``capacity`` of them: past that, ledgers are
    decoded on every scan, as before). One auditor thread uses it; not thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._views: dict[int, LedgerView] = {}
        self._interned: dict[object, Any] = {}
        self.decoded = 0          # metadata decoded, over the life of the cache (tests, logs)

    def __len__(self) -> int:
        return len(self._views)

    def scan(self, store: MetadataStore, batch: int) -> Iterator[list[Scanned]]:
        """Every ledger (deleted ones skipped), ``batch`` nodes per round trip, a list per batch.
        The cache then holds exactly the ledgers this scan saw (a scan ended early keeps both)."""
        ids = store.ledgers.list_ledgers()
        old = self._views
        fresh: dict[int, LedgerView] = {}
        step = max(1, batch)
        for i in range(0, len(ids), step):
            chunk = ids[i:i + step]
            out: list[Scanned] = []
            for lid, got in zip(chunk, store.ledgers.read_ledger_nodes(chunk), strict=True):
                if got is None:
                    continue
                data, version = got
                view = old.get(lid)
                md = None
                if view is None or view.version != version:
                    md = decode(data, lid)
                    view = self.view_of(md, version)
                invariant(view.ledger_id == lid, f"ledger {lid}: cached view is of ledger {view.ledger_id}")
                if len(fresh) < self._capacity:
                    fresh[lid] = view
                out.append((view, data, md))
            if out:
                yield out
        self._views = fresh

    def view_of(self, md: LedgerMetadata, version: int) -> LedgerView:
        self.decoded += 1
        if len(self._interned) > _INTERN_MAX:
            self._interned.clear()
        bookies = self._intern(frozenset(md.bookies()))
        recorded = self._intern(PlacementGroups.of_ledger(md))
        return LedgerView(md.ledger_id, version, bookies, md.namespace or "", recorded,
                          md if checkable_fragments(md) else None)

    def _intern(self, value: Any) -> Any:
        return self._interned.setdefault(value, value)


def metadata_of(scanned: Scanned) -> LedgerMetadata:
    """The scanned ledger's metadata: decoded again when this scan reused its view."""
    view, data, md = scanned
    return md if md is not None else decode(data, view.ledger_id)


def index_of(views: list[LedgerView]) -> dict[str, set[int]]:
    """Bookie → ids of the ledgers naming it (:func:`recovery.plan.build_index` over views)."""
    index: dict[str, set[int]] = {}
    for v in views:
        for b in v.bookies:
            index.setdefault(b, set()).add(v.ledger_id)
    return index
