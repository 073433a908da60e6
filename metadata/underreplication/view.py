"""A cached picture of the under-replication queue, kept between child-watch events.

Why: with BookKeeper's layout every queued ledger id below 2**16 has its own leaf bucket, so
walking the hierarchy on every ``acquire`` (as BookKeeper's depth-first search does) re-lists and
re-parses the whole queue for every ledger taken off it; on a queue of a few hundred ledgers that
was most of a replication worker's CPU. Here each directory listing (the buckets, the locks) is
fetched once with a child watch and reused until the watch fires; a listing whose watch fired is
*stale* and may still be used for a short while (``max_stale_s``) as a hint, because nothing is
decided from a listing: the lock's create and the node read after it are the arbiters. Searches
that find nothing in stale listings look again in fresh ones before giving up.

The ledger id of a leaf bucket is spelled by the four bucket names (16 bits each, high bits
first: :func:`metadata.layout.ur_ledger_path_components`), so the leaves need not be listed.

Invalidation is by epochs: every watch event bumps the epoch of its path (a connection-level
event bumps the global one), and a fetched listing is stored as fresh only if no epoch moved
while it was in flight; otherwise it is stored stale. A missed watch (e.g. lost with a
connection) is bounded by ``max_age_s``: older listings are fetched again whatever their state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from metadata.layout import MAX_LEDGER_ID, is_ur_bucket_name, ur_ledger_id

#: Fetches the children of each path (None for an absent node), arming a child watch on each.
Fetch = Callable[[list[str]], list[list[str] | None]]
#: A bucket is pruned by a search only once its listing has shown it empty (and no watch fired)
#: for this long: a bucket a mark has just created is empty for a moment before its child comes.
EMPTY_FOR_S = 1.0


@dataclass
class _Listing:
    names: list[str] | None   # None: the node does not exist
    at: float                 # monotonic time the fetch was issued (conservative age)
    stale: bool               # a watch fired since the fetch (or it raced one)
    ids: list[int] | None = None       # leaf buckets' ledger ids (depth-3 listings), parsed once
    locked: set[int] | None = None     # the locks directory: ids of locked ledgers, parsed once


@dataclass(frozen=True)
class LeafGroup:
    """The ledger ids under one depth-3 bucket, and when their listing was fetched."""

    path: str
    ids: list[int]
    at: float


class QueueView:
    """Thread-safe listing cache for one store. ``fetch`` is the backend's watched listing."""

    def __init__(self, ledgers_root: str, locks_dir: str, fetch: Fetch, *, max_age_s: float) -> None:
        self.root = ledgers_root
        self.locks_dir = locks_dir
        self._fetch = fetch
        self._max_age_s = max_age_s
        self._mutex = threading.Lock()
        self._fetching = threading.Lock()   # one fetch at a time: concurrent searches share it
        self._cache: dict[str, _Listing] = {}
        self._epochs: dict[str, int] = {}
        self._global_epoch = 0

    # -- invalidation (any thread, never blocks for long) ---------------------------------------
    def invalidate(self, path: str | None) -> None:
        """A watch fired for ``path`` (None: for everything, e.g. the connection was lost)."""
        with self._mutex:
            if path is None:
                self._global_epoch += 1
                for entry in self._cache.values():
                    entry.stale = True
                return
            self._epochs[path] = self._epochs.get(path, 0) + 1
            listing = self._cache.get(path)
            if listing is not None:
                listing.stale = True

    # -- reading ----------------------------------------------------------------------------------
    def listings(self, paths: list[str], max_stale_s: float, *, refetch: bool = False) -> list[_Listing]:
        """A listing per path: cached if fresh (or stale for at most ``max_stale_s``), else fetched
        (all missing ones in one batch); ``refetch`` fetches them all (a caller that must see other
        sessions' changes at once, not when their watch events arrive). MetadataError from the
        fetch propagates."""
        out = {} if refetch else self._cached(paths, max_stale_s)
        missing = [p for p in paths if p not in out]
        if missing:
            with self._fetching:
                if not refetch:
                    out.update(self._cached(missing, max_stale_s))   # another search may just have fetched
                missing = [p for p in missing if p not in out]
                if missing:
                    out.update(self._fetch_now(missing))
        return [out[p] for p in paths]

    def _cached(self, paths: list[str], max_stale_s: float) -> dict[str, _Listing]:
        now = time.monotonic()
        got: dict[str, _Listing] = {}
        with self._mutex:
            for p in paths:
                e = self._cache.get(p)
                if e is not None and now - e.at < self._max_age_s and (not e.stale or now - e.at <= max_stale_s):
                    got[p] = e
        return got

    def _fetch_now(self, paths: list[str]) -> dict[str, _Listing]:
        with self._mutex:
            tokens = [(self._epochs.get(p, 0), self._global_epoch) for p in paths]
        at = time.monotonic()
        fetched = self._fetch(paths)
        out: dict[str, _Listing] = {}
        with self._mutex:
            for p, names, token in zip(paths, fetched, tokens, strict=True):
                raced = token != (self._epochs.get(p, 0), self._global_epoch)
                # an absent node arms no child watch: its listing is never trusted past this use
                entry = _Listing(names, at, stale=raced or names is None)
                self._cache[p] = entry
                out[p] = entry
        return out

    def leaf_groups(self, max_stale_s: float, *, refetch: bool = False) -> tuple[list[LeafGroup], list[str]]:
        """Every depth-3 bucket's ledger ids, and the buckets (depth 1-3) that have been empty for
        ``EMPTY_FOR_S`` by a listing no watch outdated (left behind by a prune that was skipped
        or lost; not one a mark is filling right now)."""
        level = [self.root]
        empty: list[str] = []

        def long_empty(entry: _Listing) -> bool:
            return entry.names == [] and not entry.stale and time.monotonic() - entry.at >= EMPTY_FOR_S

        for depth in range(3):
            nxt: list[str] = []
            for parent, entry in zip(level, self.listings(level, max_stale_s, refetch=refetch), strict=True):
                names = [n for n in entry.names or [] if is_ur_bucket_name(n)]
                if depth > 0 and long_empty(entry):
                    empty.append(parent)
                nxt.extend(f"{parent}/{n}" for n in names)
            level = nxt
        groups: list[LeafGroup] = []
        for parent, entry in zip(level, self.listings(level, max_stale_s, refetch=refetch), strict=True):
            if entry.ids is None:
                entry.ids = _leaf_ids(parent[len(self.root) + 1:], entry.names or [])
            if entry.ids:
                groups.append(LeafGroup(parent, entry.ids, entry.at))
            elif long_empty(entry):
                empty.append(parent)
        return groups, empty

    def locked(self, max_stale_s: float) -> set[int]:
        """Ids of the ledgers whose lock node existed when the locks were last listed."""
        entry = self.listings([self.locks_dir], max_stale_s)[0]
        if entry.locked is None:
            entry.locked = {lid for n in entry.names or [] if (lid := ur_ledger_id(n)) is not None}
        return entry.locked

    def note_unlocked(self, ledger_id: int) -> None:
        """We deleted this ledger's lock: the cached locks listing need not wait for its watch."""
        with self._mutex:
            entry = self._cache.get(self.locks_dir)
            if entry is not None and entry.locked is not None:
                entry.locked = entry.locked - {ledger_id}

    def children_hint(self, path: str) -> int | None:
        """How many children ``path`` had when last listed (stale or not); None if unknown."""
        with self._mutex:
            entry = self._cache.get(path)
            return None if entry is None or entry.names is None else len(entry.names)


def _leaf_ids(prefix: str, names: list[str]) -> list[int]:
    """Ledger ids of the leaf buckets ``names`` under the depth-3 bucket ``prefix`` ("b0/b1/b2")."""
    head = prefix.replace("/", "")
    out = []
    for n in names:
        if is_ur_bucket_name(n):
            lid = int(head + n, 16)
            if lid <= MAX_LEDGER_ID:
                out.append(lid)
    return out
