"""Which placement groups a ledger's copies must keep to (DESIGN §4.10), as re-replication and the
auditor see it: the namespace's CURRENT settings when the ledger belongs to a namespace (so a
settings change reaches sealed segments: the auditor marks them and the worker moves them), else
the groups recorded in the ledger's metadata at its creation."""

from __future__ import annotations

from ledger_client.placement import PlacementGroups
from metadata import LedgerMetadata, MetadataStore
from metadata.streams import decode_settings


class LedgerGroups:
    """Per-ledger groups with each namespace read once (one per audit scan or per worker attempt:
    make a new one to see later settings)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._namespaces: dict[str, PlacementGroups | None] = {}

    def of(self, md: LedgerMetadata) -> PlacementGroups:
        return self.for_namespace(md.namespace, PlacementGroups.of_ledger(md))

    def for_namespace(self, namespace: str, recorded: PlacementGroups) -> PlacementGroups:
        """The groups of a ledger of ``namespace`` ("" for none) whose metadata recorded ``recorded``."""
        if namespace:
            if namespace not in self._namespaces:
                self._namespaces[namespace] = self._read(namespace)
            found = self._namespaces[namespace]
            if found is not None:
                return found
        return recorded

    def _read(self, namespace: str) -> PlacementGroups | None:
        """The namespace's groups; None once it is gone (its ledgers then keep their recorded ones)."""
        got = self._store.streams.read_namespace(namespace)
        if got is None:
            return None
        settings = decode_settings(got[0], f"namespace {namespace}")
        return PlacementGroups.of(settings.get("bookie_groups"), settings.get("bookie_groups_secondary"))
