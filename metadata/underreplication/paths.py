"""Creating a node below ``underreplication`` together with whichever of its parents are missing
(clusters initialised before the queue existed, buckets pruned by a concurrent mark_replicated)."""

from __future__ import annotations

from metadata.errors import MetadataUpdateConflictError, NodeExistsError, NoNodeError
from metadata.layout import ZkLayout
from metadata.nodes import Nodes

CAS_TRIES_MAX = 100  # lost races in a row before a change gives up


def create_path(nodes: Nodes, paths: ZkLayout, path: str, data: bytes, *, ephemeral: bool = False,
                sequential: bool = False) -> str:
    """Create ``path``, making its missing parents below ``underreplication``; returns the path
    created. NoNodeError if ``underreplication`` itself is missing: the cluster is not initialised.
    A non-sequential create is retried on a lost answer (so "exists" may be our own); a
    sequential one raises MetadataUnavailableError when its outcome is unknown."""
    for _ in range(CAS_TRIES_MAX):
        try:
            return nodes.create(path, data, ephemeral=ephemeral, sequential=sequential, retry=not sequential)
        except NoNodeError:
            make_parents(nodes, paths, path)
    raise MetadataUpdateConflictError(f"create {path}: its parents kept disappearing")


def make_parents(nodes: Nodes, paths: ZkLayout, path: str) -> None:
    """Create the missing ancestors of ``path`` below ``underreplication``, looking bottom up
    (usually only the last bucket or two are missing: two or three round trips, not five)."""
    base = paths.underreplication
    missing: list[str] = []
    parent = path.rsplit("/", 1)[0]
    while True:
        if parent == base:
            raise NoNodeError(f"no cluster at {base}: run `spark-bookie init` first")
        try:
            nodes.create(parent)
            break
        except NodeExistsError:
            break
        except NoNodeError:
            missing.append(parent)
            parent = parent.rsplit("/", 1)[0]
    for parent in reversed(missing):
        try:
            nodes.create(parent)
        except NodeExistsError:
            pass
        except NoNodeError:
            return  # pruned by a concurrent mark_replicated: the caller tries again
