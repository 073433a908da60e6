"""Appending to a stream exactly once from many independent tasks (DESIGN §4.6, invariant 10).

The Spark sink (jobs/stream_sink.py) is the user; nothing here imports Spark, so the three steps
are usable and testable on their own:

1. :class:`TaskLedgerWriter` (on an executor): one task's records, in order, as record sets into
   a ledger of its own, created with the namespace's settings and tagged (custom metadata) with
   the stream, the write's key and its creation time; closed; described by a ``TaskLedger``.
2. :func:`link_task_ledgers` (on the driver): take the stream's writer lock (a live Python writer
   makes it wait, then StreamLockedError), seal what a dead writer left in progress, and commit
   ``metadata.streams.linking.link_batch``: every task ledger a sealed segment, and the batch
   recorded, in one multi-op. A replayed batch changes nothing.
3. :func:`collect_orphans`: task ledgers that no segment refers to (failed attempts, aborted or
   replayed batches, a driver that died before its commit), deleted once older than a grace
   period, or at once when they belong to the batch just committed (its attempts are over).

Finding them: each task ledger is marked under its stream (``<stream>/tasks/<id>``,
metadata/streams/store.py) right after it is created, so a sweep lists the markers and reads only
those ledgers' metadata (pipelined), never every ledger of the cluster; it drops the markers of
ledgers linked or gone since. A task that dies between creating its ledger and marking it leaves
an unmarked ledger that only a full scan (``scan_all``: every ledger's metadata, in batches)
finds, as do ledgers written before the markers existed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from metadata import InvalidMetadataError
from metadata.model import decode
from metadata.streams import Change, StreamView, linking
from metadata.streams.model import Position

from .. import errors
from ..metadata_errors import metadata_errors
from .meta import now_ms
from .records import FLAG_SEGMENT_TXIDS, RECORD_OVERHEAD_BYTES, encode, encode_columns
from .segments import commit, recover_segment

if TYPE_CHECKING:
    import pyarrow as pa

    from ..client import LedgerClient
    from ..write_handle import WriteHandle
    from .namespace import Namespace

log = logging.getLogger(__name__)

TAG_STREAM = "spark_sink_stream"      # "ns/stream"
TAG_WRITE = "spark_sink_write"        # the batch key (linking.SparkBatch.key, with the batch id)
TAG_CTIME = "spark_sink_ctime_ms"
IN_FLIGHT_ENTRIES_MAX = 64            # entries appended but not yet acknowledged, per task
READ_BATCH = 256                      # ledgers whose metadata a sweep reads in one round trip


def write_tag(batch: linking.SparkBatch) -> bytes:
    return f"{batch.key}#{batch.batch_id}".encode()


class TaskLedgerWriter:
    """One task's records into one ledger. ``add`` in order, then ``finish`` (the ledger's
    description, or None when no record came and no ledger was made) or ``discard``."""

    def __init__(self, ns: Namespace, stream: str, batch: linking.SparkBatch, partition: int,
                 relative_txids: bool) -> None:
        self.ns, self.stream, self.batch, self.partition = ns, stream, batch, partition
        self.relative = relative_txids
        s = ns.settings
        self._out_max, self._record_max = s.output_buffer_bytes, s.record_size_bytes_max
        self._handle: WriteHandle | None = None
        self._txids: list[int] = []
        self._payloads: list[bytes] = []
        self._size = 0
        self._records = 0
        self._first_txid: int | None = None
        self._last_txid: int | None = None
        self._in_flight: deque[Future[int]] = deque()
        self._last_slot = -1
        self._source: tuple[Position, Position] | None = None   # a replica's: first and last source position
        self._source_ctime: int | None = None                      # a replica's: its source stream's ctime_ms

    def copying(self, first: Position, last: Position, source_ctime_ms: int | None = None) -> None:
        """The records added so far and next copy a source stream's records ``first``..``last``
        (a replicator's task: jobs/stream_fanout.py); linking keeps the range with the segment.
        ``source_ctime_ms``, when known, says which source stream of that name (linking refuses
        copies of one created again)."""
        if self._source is not None and first <= self._source[1]:
            raise errors.IncorrectParameterError(f"source positions {first} follow {self._source[1]}: a replica "
                                                 "copies its source in order")
        if source_ctime_ms is not None and self._source_ctime not in (None, source_ctime_ms):
            raise errors.IncorrectParameterError(f"copies of source streams created at {self._source_ctime} and "
                                                 f"{source_ctime_ms} ms in one task ledger")
        self._source = (self._source[0] if self._source else first, last)
        self._source_ctime = source_ctime_ms if source_ctime_ms is not None else self._source_ctime

    def add(self, payload: bytes, txid: int | None = None) -> None:
        if len(payload) > self._record_max:
            raise errors.RecordTooLargeError(f"a record of {len(payload)} bytes is over record_size_bytes_max "
                                             f"({self._record_max})")
        if self.relative:
            txid = self._records + len(self._payloads)
        else:
            if txid is None:
                raise errors.IncorrectParameterError("a null txid: the txid column must be set on every row")
            if self._last_txid is not None and txid < self._last_txid:
                raise errors.TransactionIdOutOfOrderError(
                    f"partition {self.partition}: txid {txid} follows {self._last_txid}: txids must not decrease")
            if self._first_txid is None:
                self._first_txid = txid
            self._last_txid = txid
        if self._payloads and self._size + len(payload) + RECORD_OVERHEAD_BYTES > self._out_max:
            self._send()
        self._txids.append(txid)
        self._payloads.append(payload)
        self._size += len(payload) + RECORD_OVERHEAD_BYTES

    def add_arrow(self, payloads: pa.Array, txids: np.ndarray | None = None) -> None:
        """``add`` for a whole Arrow column of payloads (binary or string, no nulls) and, unless the
        txids are relative, an int64 array of txids: cut into record sets of up to
        ``output_buffer_bytes`` straight from the column's buffers, no Python object per record."""
        n = len(payloads)
        if n == 0:
            return
        if payloads.null_count:
            raise errors.IncorrectParameterError("a null payload: every row written to a stream needs one")
        offsets, values = _binary_buffers(payloads)
        lengths = np.diff(offsets)
        if int(lengths.max()) > self._record_max:
            raise errors.RecordTooLargeError(f"a record of {int(lengths.max())} bytes is over record_size_bytes_max "
                                             f"({self._record_max})")
        if self._payloads:
            self._send()   # what add() buffered goes first, in order
        tx = self._arrow_txids(n, txids)
        ends = np.cumsum(lengths + RECORD_OVERHEAD_BYTES)
        i = 0
        while i < n:
            base = int(ends[i - 1]) if i else 0
            j = max(i + 1, int(np.searchsorted(ends, base + self._out_max, side="right")))
            body = encode_columns(tx[i:j], lengths[i:j], values[int(offsets[i]):int(offsets[j])], self._records,
                                  FLAG_SEGMENT_TXIDS if self.relative else 0)
            self._append(body, j - i)
            i = j

    def _arrow_txids(self, n: int, txids: np.ndarray | None) -> np.ndarray:
        if self.relative:
            return np.arange(self._records, self._records + n, dtype=np.int64)
        if txids is None or len(txids) != n:
            raise errors.IncorrectParameterError("a txid per payload: the txid column must be set on every row")
        tx = np.asarray(txids, dtype=np.int64)
        if (n > 1 and bool((np.diff(tx) < 0).any())) or (self._last_txid is not None and int(tx[0]) < self._last_txid):
            raise errors.TransactionIdOutOfOrderError(f"partition {self.partition}: txids must not decrease "
                                                      f"(after {self._last_txid}: {tx[:5].tolist()}...)")
        if self._first_txid is None:
            self._first_txid = int(tx[0])
        self._last_txid = int(tx[-1])
        return tx

    def add_many(self, payloads: Iterable[bytes], txids: Iterable[int | None] | None = None) -> None:
        if txids is None:
            for p in payloads:
                self.add(p)
        else:
            for p, t in zip(payloads, txids, strict=True):
                self.add(p, t)

    def _send(self) -> None:
        body = encode(self._txids, self._payloads, self._records, FLAG_SEGMENT_TXIDS if self.relative else 0)
        count = len(self._payloads)
        self._txids, self._payloads, self._size = [], [], 0
        self._append(body, count)

    def _append(self, body: bytes, count: int) -> None:
        h = self._handle or self._create()
        self._records += count
        self._last_slot = count - 1
        self._in_flight.append(h.append_async(body))
        while len(self._in_flight) > IN_FLIGHT_ENTRIES_MAX:
            self._in_flight.popleft().result()

    def _create(self) -> WriteHandle:
        s = self.ns.settings
        tags = {TAG_STREAM: f"{self.ns.name}/{self.stream}".encode(), TAG_WRITE: write_tag(self.batch),
                TAG_CTIME: str(now_ms()).encode()}
        self._handle = self.ns.client.create_ledger(s.ensemble_size, s.write_quorum_size, s.ack_quorum_size,
                                                    s.digest, s.ledger_password, custom_metadata=tags,
                                                    namespace=self.ns.name, bookie_groups=s.bookie_groups,
                                                    bookie_groups_secondary=s.bookie_groups_secondary)
        self._mark(self._handle)
        return self._handle

    def _mark(self, h: WriteHandle) -> None:
        """The ledger's marker under the stream (made first when this is the stream's first
        write), which orphan collection lists; when it cannot be made the ledger goes and the
        error is raised: a live task leaves no unmarked ledger."""
        streams, ns, stream = self.ns.client.store.streams, self.ns.name, self.stream
        what = f"mark Spark task ledger {h.ledger_id} of stream {ns}/{stream}"
        try:
            try:
                with metadata_errors(what):
                    streams.add_task_ledger(ns, stream, h.ledger_id)
            except errors.NoSuchStreamError:
                self.ns.ensure_stream(stream)
                with metadata_errors(what):
                    streams.add_task_ledger(ns, stream, h.ledger_id)
        except BaseException:
            self._handle = None
            _drop(self.ns.client, h)
            raise

    @property
    def ledger_id(self) -> int | None:
        return None if self._handle is None else self._handle.ledger_id

    def finish(self) -> linking.TaskLedger | None:
        """Send the rest, wait for every entry, close the ledger; its description."""
        if self._payloads:
            self._send()
        h = self._handle
        if h is None:
            return None
        for fut in self._in_flight:
            fut.result()
        self._in_flight.clear()
        h.close()
        return linking.TaskLedger(self.partition, h.ledger_id, self._records, h.last_add_confirmed,
                                  self._last_slot, h.length, self._first_txid, self._last_txid, self._source,
                                  self._source_ctime)

    def discard(self) -> None:
        """The task failed: its ledger goes (best effort; orphan collection catches the rest)."""
        h = self._handle
        if h is None:
            return
        if _drop(self.ns.client, h):
            try:
                with metadata_errors(f"unmark task ledger {h.ledger_id}"):
                    self.ns.client.store.streams.remove_task_ledgers(self.ns.name, self.stream, [h.ledger_id])
            except errors.LedgerError as e:
                log.warning("marker of deleted task ledger %d left (orphan collection drops it): %s", h.ledger_id, e)


def _drop(client: LedgerClient, h: WriteHandle) -> bool:
    """Close and delete a task's ledger (best effort); whether it is gone."""
    try:
        h.close()
    except errors.LedgerError:
        pass
    try:
        client.delete_ledger(h.ledger_id)
    except errors.NoSuchLedgerError:
        pass
    except errors.LedgerError as e:
        log.warning("task ledger %d not deleted (orphan collection will): %s", h.ledger_id, e)
        return False
    return True


def link_task_ledgers(ns: Namespace, stream: str, batch: linking.SparkBatch, tasks: list[linking.TaskLedger],
                      lock_timeout_ms: int, owner: str) -> bool:
    """Make ``tasks``' ledgers segments of the stream, once; False when the batch was linked
    before (then the caller deletes these ledgers if they are not segments)."""
    ns.ensure_stream(stream)
    store = ns.client.store
    with metadata_errors(f"lock stream {ns.name}/{stream} for Spark batch {batch.key}#{batch.batch_id}"):
        lock = store.streams.lock_stream(ns.name, stream, owner, lock_timeout_ms / 1000)
    try:
        view = ns.view(stream)
        if linking.already_linked(view.meta, batch):
            return False
        if view.in_progress is not None:
            recover_segment(ns, stream, view.in_progress, lock)

        def decide(v: StreamView) -> Change | None:
            try:
                return linking.link_batch(v, batch, tasks, now_ms())
            except linking.TxidOrderError as e:
                raise errors.TransactionIdOutOfOrderError(f"stream {ns.name}/{stream}: {e}") from e
            except InvalidMetadataError as e:
                if v.meta.end_of_stream:
                    raise errors.EndOfStreamError(f"stream {ns.name}/{stream} has ended") from e
                raise errors.IncorrectParameterError(f"stream {ns.name}/{stream}: cannot link: {e}") from e

        _view, change = commit(ns, stream, decide, lock)
        return change is not None
    finally:
        with metadata_errors(f"unlock {ns.name}/{stream}"):
            store.streams.unlock_stream(lock)


def collect_orphans(client: LedgerClient, ns: Namespace, stream: str, older_than_ms: int,
                    batch: linking.SparkBatch | None = None, dry_run: bool = False, *,
                    scan_all: bool = False) -> list[int]:
    """Delete the stream's task ledgers that no segment refers to and that are older than
    ``older_than_ms`` (or were written for ``batch``, whose commit is over); their ids.

    Reads the stream's markers (one listing) and the metadata of the ledgers they name, READ_BATCH
    per round trip, and drops the markers of ledgers linked or gone: a sweep costs what was
    written since the last one, whatever the size of the cluster. ``scan_all`` reads every
    ledger's metadata instead (in batches, skipping those this client may not read), for task
    ledgers without a marker: written before markers existed, or by a task that died between
    creating its ledger and marking it."""
    what = f"{ns.name}/{stream}"
    with metadata_errors(f"list the Spark task ledgers of {what}"):
        marked = client.store.streams.list_task_ledgers(ns.name, stream)
    ids = sorted(set(client.list_ledgers()) | set(marked)) if scan_all else marked
    if not ids:
        return []
    tags, gone = _read_tags(client, ids, skip_denied=scan_all)
    found = {lid: t for lid, t in tags.items() if t.get(TAG_STREAM) == what.encode()}
    if not found and not gone.intersection(marked):
        return []
    view = ns.view_if_any(stream)   # read after listing: a ledger linked meanwhile is seen as linked
    linked = linking.linked_ledgers(view) if view is not None else set()
    now = now_ms()
    doomed = []
    for lid, t in found.items():
        if lid in linked:
            continue
        try:
            age = now - int(t.get(TAG_CTIME, b"0").decode())
        except ValueError:
            age = now
        if age > older_than_ms or (batch is not None and t.get(TAG_WRITE) == write_tag(batch)):
            doomed.append(lid)
    if doomed:
        log.info("stream %s: %s %d orphaned Spark task ledgers: %s", what, "found" if dry_run else "deleting",
                 len(doomed), doomed[:20])
    if not dry_run:
        for lid in doomed:
            try:
                client.delete_ledger(lid)
            except errors.NoSuchLedgerError:
                pass
        done = linked | gone | set(doomed)
        with metadata_errors(f"drop the task ledger markers of {what}"):
            client.store.streams.remove_task_ledgers(ns.name, stream, [lid for lid in marked if lid in done])
    return doomed


def delete_unlinked(client: LedgerClient, ns: Namespace, stream: str, lids: list[int]) -> None:
    """Delete those of the task ledgers ``lids`` that are not segments of the stream (an aborted
    or a replayed batch's), and drop the markers of all of them (the others are linked)."""
    view = ns.view_if_any(stream)
    keep = linking.linked_ledgers(view) if view is not None else set()
    for lid in lids:
        if lid not in keep:
            try:
                client.delete_ledger(lid)
            except errors.NoSuchLedgerError:
                pass
    with metadata_errors(f"drop the task ledger markers of {ns.name}/{stream}"):
        client.store.streams.remove_task_ledgers(ns.name, stream, lids)


def _read_tags(client: LedgerClient, ids: list[int],
               skip_denied: bool) -> tuple[dict[int, dict[str, bytes]], set[int]]:
    """The custom metadata of each of ``ids`` that exists, and the ids that do not; READ_BATCH
    per round trip. ``skip_denied``: ledgers this client may not read are left out of both."""
    tags: dict[int, dict[str, bytes]] = {}
    gone: set[int] = set()
    for i in range(0, len(ids), READ_BATCH):
        for lid, got in _read_nodes(client, ids[i:i + READ_BATCH], skip_denied):
            if got is None:
                gone.add(lid)
                continue
            try:
                tags[lid] = decode(got[0], lid).custom_metadata
            except InvalidMetadataError as e:
                log.warning("ledger %d skipped: its metadata cannot be read (%s)", lid, e)
    return tags, gone


def _read_nodes(client: LedgerClient, chunk: list[int],
                skip_denied: bool) -> list[tuple[int, tuple[bytes, int] | None]]:
    """The metadata nodes of ``chunk`` in one round trip, as ``client.ledger_metadata`` reads them
    (ZooKeeper's ACLs decide; a refusal is UnauthorizedAccessError). ZooKeeper refuses a batch
    for any one node: with ``skip_denied`` it is halved until the refused ledgers are alone, and
    those are left out."""
    what = f"read ledgers {chunk[0]}..{chunk[-1]}"
    try:
        with metadata_errors(what):
            return list(zip(chunk, client.store.ledgers.read_ledger_nodes(chunk), strict=True))
    except errors.UnauthorizedAccessError as e:
        if not skip_denied:
            caller = client.caller
            who = f"role {caller.subject!r}" if caller is not None else "this client (no token)"
            raise errors.UnauthorizedAccessError(f"{who} may not {what}: not their creator nor granted 'consume' "
                                                 f"or 'produce' on their namespace ({e})") from e
    if len(chunk) == 1:
        return []   # not this client's to read
    half = len(chunk) // 2
    return _read_nodes(client, chunk[:half], True) + _read_nodes(client, chunk[half:], True)


def owner_name(what: str) -> str:
    return f"spark-sink:{socket.gethostname()}:{os.getpid()}:{what}:{int(time.time() * 1000)}"


def _binary_buffers(arr: pa.Array) -> tuple[np.ndarray, memoryview]:
    """An Arrow binary or string column's value offsets (from its first value, int64) and values
    buffer (large_ and view types are cast to binary first)."""
    import pyarrow as pa

    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
        arr = arr.cast(pa.binary())
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset:].astype(np.int64)
    values = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
    return offsets, values
