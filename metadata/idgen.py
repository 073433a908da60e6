"""Ledger ids: a counter in ZooKeeper, claimed a block at a time.

BookKeeper's LongZkLedgerIdGenerator takes every id from a sequential znode, created and deleted
again: two ZooKeeper writes and one round trip per ledger, as many as the ledger's own metadata
costs. Here a client claims a block of ids by one compare-and-set of a counter (the data of
``<root>/idgen-long``) and hands them out locally. Its blocks double from 1 up to
:data:`BLOCK_IDS_MAX` while it keeps creating, so a client that makes one ledger claims one id,
and a client that makes thousands writes about once per thousand.

Clusters whose ids came from the sequential nodes (``HOB-<n>/ID-``, the layout BookKeeper and
earlier versions of this project use) keep them: the first claim on a counter that was never
set takes one more number from that sequence and starts above it, so no id is handed out twice.
Clients of both schemes must not run on one cluster at the same time.
"""

from __future__ import annotations

import re

from metadata.errors import BadVersionError, MetadataAccessDeniedError, MetadataError, NodeExistsError, NoNodeError
from metadata.group_commit import GroupCommit
from metadata.layout import ZkLayout
from metadata.nodes import Nodes

#: The largest block one claim takes: a client that stops wastes at most this many ids.
BLOCK_IDS_MAX = 1024
#: ZooKeeper's sequence counter is a signed 32-bit int: the sequential scheme used its low 31
#: bits and moved to the next high-order-bits node (``HOB-<n>``) beyond.
IDGEN_LOW_LIMIT = 2**31 - 1
ID_MAX = 2**63 - 1
_HOB_PREFIX = "HOB-"
_HOB_RE = re.compile(_HOB_PREFIX + r"\d{10}")


def claim(counter: int, size: int) -> tuple[int, int]:
    """The pure transition of one claim: the block ``[start, end)`` and the counter's new value."""
    start = max(counter, 1)   # id 0 is never handed out
    end = start + size
    if end > ID_MAX:
        raise MetadataError("ledger ids are exhausted (the 63-bit counter reached its end)")
    return start, end


class LedgerIdGenerator:
    """Positive ids, never handed out twice in the cluster, increasing within one generator.

    Callers that ask at the same time share one claim (a group commit of id requests): the first
    becomes the batch's leader and claims for everyone waiting, while the next ones queue for the
    following batch."""

    def __init__(self, nodes: Nodes, paths: ZkLayout, *, block_ids_max: int = BLOCK_IDS_MAX) -> None:
        self._nodes = nodes
        self._paths = paths
        self.block_ids_max = block_ids_max
        self._next = self._end = 0          # the claimed block not yet handed out: [next, end)
        self._block = 1                     # the next claim's size (doubles up to block_ids_max)
        self._seen: tuple[int, int] | None = None   # (counter, znode version) after our last claim
        self._batches: GroupCommit[None, int] = GroupCommit(lambda items: self.next_ids(len(items)))

    def next_id(self) -> int:
        return self._batches.submit(None)

    def next_ids(self, count: int) -> list[int]:
        """``count`` new ids, ascending (not thread-safe: :meth:`next_id`'s batches take turns)."""
        ids: list[int] = []
        with self._nodes.deadline():
            while len(ids) < count:
                if self._next >= self._end:
                    self._claim(count - len(ids))
                take = min(count - len(ids), self._end - self._next)
                ids += range(self._next, self._next + take)
                self._next += take
        return ids

    def _claim(self, wanted: int) -> None:
        """One block by CAS on the counter, retried on a lost race until the store's deadline."""
        size = max(wanted, self._block)
        self._block = min(self._block * 2, self.block_ids_max)
        while True:
            counter, version = self._seen if self._seen is not None else self._read_counter()
            start, end = claim(counter, size)
            try:
                new_version = self._nodes.set(self._paths.idgen, b"%d" % end, version, retry=False)
            except BadVersionError:
                self._seen = None   # another client claimed meanwhile: read and try again
                continue
            except MetadataAccessDeniedError as e:
                raise MetadataAccessDeniedError(
                    f"this client may not write the ledger id counter {self._paths.idgen}: a cluster whose "
                    "tenant ACLs predate it needs them given again (`spark-bookie shell secure-metadata "
                    "--tenants`, as the superuser)") from e
            self._seen = (end, new_version)
            self._next, self._end = start, end
            return

    def _read_counter(self) -> tuple[int, int]:
        got = self._nodes.get(self._paths.idgen)
        if got is None:
            self._initialise_idgen()
            got = self._nodes.get(self._paths.idgen)
            if got is None:
                raise NoNodeError(f"the id generator's node {self._paths.idgen} vanished")
        data, version = got[0], got[1]
        if data:
            try:
                return int(data), version
            except ValueError as e:
                raise MetadataError(f"{self._paths.idgen} holds {data[:40]!r}, not a ledger id counter") from e
        return self._sequence_floor(), version

    def _sequence_floor(self) -> int:
        """A counter that was never set: start above every id the sequential scheme gave out."""
        hob = self._current_hob()
        low = self._nodes.take_sequence(f"{self._paths.idgen}/{_HOB_PREFIX}{hob:010d}/ID-")
        return (hob << 32) | low

    def _current_hob(self) -> int:
        idgen = self._paths.idgen
        hobs = [int(n[len(_HOB_PREFIX):]) for n in self._nodes.children(idgen) or [] if _HOB_RE.fullmatch(n)]
        if hobs:
            return max(hobs)
        self._create_if_absent(f"{idgen}/{_HOB_PREFIX}{0:010d}")
        return 0

    def _initialise_idgen(self) -> None:
        """Clusters initialised before the generator's node existed get it now."""
        if self._nodes.get(self._paths.root) is None:
            raise NoNodeError(f"no cluster at {self._paths.root}: run `spark-bookie init` first")
        self._create_if_absent(self._paths.idgen)

    def _create_if_absent(self, path: str) -> None:
        try:
            self._nodes.create(path, makepath=True)
        except NodeExistsError:
            pass
