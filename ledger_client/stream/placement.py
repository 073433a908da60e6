"""What keeps namespaces' placement groups (DESIGN §4.10) from being honoured right now, in words:
a group without a writable bookie, too few bookies in the groups for an ensemble. `stream info`
and `cluster status` report it, so that an operator learns of an empty group from a status
command, not from the first writer that cannot start a segment."""

from __future__ import annotations

from collections.abc import Iterable

from metadata import MetadataStore
from metadata.streams import decode_settings

from ..placement import BookieNode, PlacementGroups, group_problems, node_of
from .settings import NamespaceSettings


def settings_problems(settings: NamespaceSettings, writable: Iterable[BookieNode]) -> list[str]:
    """The problems of one namespace's groups against these writable bookies ([] when fine)."""
    groups = PlacementGroups.of(settings.bookie_groups, settings.bookie_groups_secondary)
    return group_problems(groups, writable, settings.ensemble_size)


def writable_nodes(store: MetadataStore) -> list[BookieNode]:
    """The writable bookies with their groups, read from their registrations."""
    return [node_of(b, store.cluster.bookie_info(b)) for b in store.cluster.list_bookies()]


def namespaces_problems(store: MetadataStore) -> dict[str, list[str]]:
    """Namespace → its placement problems, for the namespaces that have some."""
    nodes = writable_nodes(store)
    out: dict[str, list[str]] = {}
    for name in store.streams.list_namespaces():
        got = store.streams.read_namespace(name)
        if got is None:
            continue
        problems = settings_problems(NamespaceSettings.from_json(decode_settings(got[0], f"namespace {name}")), nodes)
        if problems:
            out[name] = problems
    return out
