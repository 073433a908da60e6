"""The stream-metadata store: namespaces, streams, segments, the writer lock (DESIGN §4.5).

Written once on the node layer (:mod:`metadata.nodes`), like the cluster, ledger and
under-replication stores, so ZooKeeper and the in-memory twin share it; a contract suite runs
against both.

Layout under ``<root>/streams`` (DistributedLog's spirit):

- ``<ns>``: the namespace's settings (versioned JSON, ``model.encode_settings``);
- ``<ns>/<stream>``: the stream's meta (next segment number, max txid, truncation point, end of
  stream, Spark batches committed); every change of the stream is a CAS on its version;
- ``<ns>/<stream>/segments/<20-digit sequence>``: one node per segment (``SegmentMeta``);
- ``<ns>/<stream>/subscriptions/<name>``: one node per subscription (``SubscriptionMeta``, DESIGN
  §4.11); a forward commit is a CAS on its own node only; a creation or a move back also sets the
  ``subscriptions`` directory node (CAS), whose version a retention checks in its multi-op, so that
  one decided on an older view cannot delete what they need. Consumers may write there (tenant
  ACLs: metadata/zk/tenant_acl.py), not on the stream node;
- ``<ns>/<stream>/tasks/<ledger id>``: an empty node per Spark task ledger written for the stream
  and not yet known to be linked or deleted (ledger_client/stream/sink.py): what its orphan
  collection lists instead of every ledger of the cluster. Producers write there;
- ``<ns>/<stream>/lock/lock-<seq>``: ephemeral sequential nodes of writers; the lowest holds the
  stream. Every change a writer makes checks that its own lock node still exists (in the same
  multi-op), so a writer whose session expired cannot change the stream after a new writer took it.

The lock is ZooKeeper's recipe: an ephemeral sequential node per contender under
``<stream>/lock``; the lowest holds the stream; a waiter watches only its predecessor (no herd).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from metadata.layout import ZkLayout
from metadata.nodes import MultiOpFailed, Nodes, Op
from metadata.streams.model import (
    StreamMeta,
    SubscriptionMeta,
    check_name,
    decode_segment,
    decode_stream,
    decode_subscription,
    encode_segment,
    encode_stream,
    encode_subscription,
)
from metadata.streams.transitions import Change, StreamView

STREAMS = "streams"
SEGMENTS = "segments"
LOCK = "lock"
SUBSCRIPTIONS = "subscriptions"
TASKS = "tasks"
_PIPELINE_MAX = 256    # requests sent together
_READ_TRIES_MAX = 20   # a stream changing under read_stream this many times in a row is an error


class StreamLockTimeoutError(MetadataError):
    """Another live writer held the stream's lock for the whole wait."""


class StreamGoneError(MetadataError):
    """The stream (or its namespace) does not exist."""


class NamespaceGoneError(StreamGoneError):
    """The namespace does not exist."""


class SubscriptionGoneError(MetadataError):
    """The subscription does not exist (never created, or deleted)."""


@dataclass(frozen=True)
class StreamLockInfo:
    """A held writer lock: the lock node (checked by every change the holder commits)."""

    path: str
    owner: str


class StreamStore:
    """Stream metadata operations (``store.streams``); every call has a deadline
    (MetadataUnavailableError)."""

    def __init__(self, nodes: Nodes, paths: ZkLayout) -> None:
        self._nodes = nodes
        self._paths = paths

    def _multi(self, ops: list[Op]) -> None:
        """All or nothing; MultiOpFailed naming the first op that failed."""
        failed = self._nodes.multi([ops], retry=False)[0]
        if failed is not None:
            if failed.index < 0:
                raise MetadataError(f"stream metadata change refused: {failed.cause}") from failed
            raise failed

    # -- paths ------------------------------------------------------------------------------
    def _root(self) -> str:
        return f"{self._paths.root}/{STREAMS}"

    def _ns_path(self, ns: str) -> str:
        return f"{self._root()}/{check_name(ns, 'namespace')}"

    def _stream_path(self, ns: str, name: str) -> str:
        return f"{self._ns_path(ns)}/{check_name(name, 'stream')}"

    def _segment_path(self, ns: str, name: str, sequence: int) -> str:
        return f"{self._stream_path(ns, name)}/{SEGMENTS}/{sequence:020d}"

    def _sub_path(self, ns: str, name: str, sub: str) -> str:
        return f"{self._stream_path(ns, name)}/{SUBSCRIPTIONS}/{check_name(sub, 'subscription')}"

    # -- namespaces -------------------------------------------------------------------------
    def create_namespace(self, name: str, settings: bytes) -> None:
        """NodeExistsError if it exists."""
        path = self._ns_path(name)
        try:
            self._nodes.create(self._root())
        except NodeExistsError:
            pass
        self._nodes.create(path, settings)

    def read_namespace(self, name: str) -> tuple[bytes, int] | None:
        """(settings, version), or None."""
        got = self._nodes.get_many([self._ns_path(name)])[0]
        return None if got is None else (got[0], got[1])

    def write_namespace(self, name: str, settings: bytes, version: int) -> int:
        """CAS; BadVersionError if changed, NamespaceGoneError if absent."""
        try:
            return self._nodes.set(self._ns_path(name), settings, version)
        except NoNodeError as e:
            raise NamespaceGoneError(f"namespace {name!r} does not exist") from e

    def list_namespaces(self) -> list[str]:
        """Sorted names."""
        return sorted(self._nodes.children(self._root()) or [])

    def delete_namespace(self, name: str) -> None:
        """Only an empty one (MetadataError otherwise); NamespaceGoneError if absent."""
        path = self._ns_path(name)
        kids = self._nodes.children(path)
        if kids is None:
            raise NamespaceGoneError(f"namespace {name!r} does not exist")
        if kids:
            raise MetadataError(f"namespace {name!r} still has streams: {sorted(kids)[:5]}")
        try:
            self._nodes.delete(path, retry=False)
        except NoNodeError as e:
            raise NamespaceGoneError(f"namespace {name!r} does not exist") from e

    # -- streams ----------------------------------------------------------------------------
    def create_stream(self, ns: str, name: str, meta: StreamMeta) -> None:
        """NodeExistsError if it exists, NamespaceGoneError if the namespace does not."""
        path = self._stream_path(ns, name)
        ops = [Op("create", path, encode_stream(meta)), Op("create", f"{path}/{SEGMENTS}"),
               Op("create", f"{path}/{LOCK}"), Op("create", f"{path}/{SUBSCRIPTIONS}"), Op("create", f"{path}/{TASKS}")]
        try:
            self._multi(ops)
        except MultiOpFailed as e:
            if isinstance(e.cause, NoNodeError):
                raise NamespaceGoneError(f"namespace {ns!r} does not exist") from e
            raise e.cause from e

    def list_streams(self, ns: str) -> list[str]:
        """Sorted names; NamespaceGoneError if the namespace does not exist."""
        kids = self._nodes.children(self._ns_path(ns))
        if kids is None:
            raise NamespaceGoneError(f"namespace {ns!r} does not exist")
        return sorted(kids)

    def read_stream(self, ns: str, name: str) -> StreamView | None:
        """The stream, all its segments and its subscriptions with their versions (consistent: the
        stream node is re-read until it did not change while they were listed; a subscription's
        forward commit may land meanwhile, which only makes its position older than it is), or None.
        Two round trips, as without subscriptions: one listing of both, one read of every node."""
        path = self._stream_path(ns, name)
        for _ in range(_READ_TRIES_MAX):
            head = self._nodes.get_many([path])[0]
            if head is None:
                return None
            listed = self._nodes.children_many([f"{path}/{SEGMENTS}", f"{path}/{SUBSCRIPTIONS}"])
            names = sorted(listed[0] or [])
            subs = sorted(listed[1] or [])
            got = self._nodes.get_many([f"{path}/{SEGMENTS}/{n}" for n in names]
                                       + [f"{path}/{SUBSCRIPTIONS}/{n}" for n in subs]
                                       + [f"{path}/{SUBSCRIPTIONS}", path])
            tail = got[-1]
            if tail is None:
                return None
            seg_got, sub_got, sub_dir = got[:len(names)], got[len(names):-2], got[-2]
            if tail[1] != head[1] or any(g is None for g in seg_got):
                continue  # changed while listed: read again
            segments = {}
            for n, g in zip(names, [g for g in seg_got if g is not None], strict=True):
                seg = decode_segment(g[0], f"segment {path}/{n}")
                segments[seg.sequence] = (seg, g[1])
            subscriptions = {n: (decode_subscription(g[0], f"subscription {path}/{n}"), g[1])
                             for n, g in zip(subs, sub_got, strict=True) if g is not None}
            return StreamView(decode_stream(head[0], f"stream {path}"), head[1], segments, subscriptions,
                              None if sub_dir is None else sub_dir[1])
        raise MetadataError(f"stream {ns}/{name} kept changing while it was read")

    def read_stream_meta(self, ns: str, name: str) -> tuple[StreamMeta, int] | None:
        """Only the stream node (one round trip): a reader checks it before each batch, and
        reads the segments again only when its version moved."""
        path = self._stream_path(ns, name)
        got = self._nodes.get_many([path])[0]
        return None if got is None else (decode_stream(got[0], f"stream {path}"), got[1])

    def read_stream_heads(self, ns: str) -> tuple[bytes, dict[str, tuple[StreamMeta, int]]]:
        """The namespace's settings and every stream node in it (not their segments): two round
        trips (a listing, then one pipelined read), what a namespace's storage usage is summed
        from. A stream deleted between the two is left out; NamespaceGoneError if the namespace
        does not exist."""
        names = self.list_streams(ns)
        ns_path = self._ns_path(ns)
        got = self._nodes.get_many([ns_path] + [f"{ns_path}/{check_name(n, 'stream')}" for n in names])
        if got[0] is None:
            raise NamespaceGoneError(f"namespace {ns!r} does not exist")
        heads = {n: (decode_stream(g[0], f"stream {ns_path}/{n}"), g[1])
                 for n, g in zip(names, got[1:], strict=True) if g is not None}
        return got[0][0], heads

    def commit_stream(self, ns: str, name: str, base_version: int, change: Change,
                      lock: StreamLockInfo | None = None) -> int:
        path = self._stream_path(ns, name)
        ops = [Op("check", lock.path)] if lock is not None else []
        ops.append(Op("set", path, encode_stream(change.meta), base_version))
        ops += [Op("create", self._segment_path(ns, name, s.sequence), encode_segment(s)) for s in change.create]
        ops += [Op("set", self._segment_path(ns, name, s.sequence), encode_segment(s), v) for s, v in change.update]
        ops += [Op("delete", self._segment_path(ns, name, seq), version=v) for seq, v in change.delete]
        ops += [Op("set", self._sub_path(ns, name, sub), encode_subscription(m), v) for sub, m, v in change.moved]
        if change.guard is not None:
            ops.append(Op("check", f"{path}/{SUBSCRIPTIONS}", version=change.guard))
        try:
            self._multi(ops)
        except MultiOpFailed as e:
            op = ops[e.index]
            if op.path.startswith(f"{path}/{SUBSCRIPTIONS}"):   # subscriptions changed meanwhile: decide again
                raise BadVersionError(f"a subscription of {ns}/{name} changed since it was read") from e
            if op.kind == "check":
                raise NoNodeError(f"the writer lock of {ns}/{name} is gone ({lock.path if lock else ''}): "
                                  "its ZooKeeper session expired") from e
            if op.path == path and isinstance(e.cause, NoNodeError):
                raise StreamGoneError(f"stream {ns}/{name} does not exist") from e
            if isinstance(e.cause, BadVersionError):
                raise BadVersionError(f"stream {ns}/{name} changed since version {base_version}") from e
            raise e.cause from e
        return base_version + 1

    def delete_stream(self, ns: str, name: str) -> None:
        """The stream's nodes, all of them (its ledgers are the caller's); StreamGoneError if absent."""
        path = self._stream_path(ns, name)
        if self._nodes.get_many([path])[0] is None:
            raise StreamGoneError(f"stream {ns}/{name} does not exist")
        for sub in (SEGMENTS, LOCK, SUBSCRIPTIONS, TASKS):
            for child in self._nodes.children(f"{path}/{sub}") or []:
                self._delete_quietly(f"{path}/{sub}/{child}")
            self._delete_quietly(f"{path}/{sub}")
        self._delete_quietly(path)

    def _delete_quietly(self, path: str) -> None:
        try:
            self._nodes.delete(path, retry=False)
        except NoNodeError:
            pass

    # -- subscriptions (DESIGN §4.11) -----------------------------------------------------------
    def read_subscription(self, ns: str, name: str, sub: str) -> tuple[SubscriptionMeta, int] | None:
        """(meta, version), or None."""
        path = self._sub_path(ns, name, sub)
        got = self._nodes.get_many([path])[0]
        return None if got is None else (decode_subscription(got[0], f"subscription {path}"), got[1])

    def write_subscription(self, ns: str, name: str, sub: str, meta: SubscriptionMeta, version: int | None,
                           *, guard: bool = False) -> int:
        """Create (``version`` None) or CAS-update a subscription; its new version. ``guard``: also
        set the subscriptions' directory node at the version read now (a creation always does): a
        creation or a move back then makes a retention decided on an older view lose its CAS.
        BadVersionError when either moved (read again, decide again), NodeExistsError when created
        meanwhile, SubscriptionGoneError when deleted, StreamGoneError without the stream."""
        path = self._sub_path(ns, name, sub)
        stream = self._stream_path(ns, name)
        ops: list[Op] = []
        if version is None or guard:
            self._ensure_child_dir(stream, SUBSCRIPTIONS, f"{ns}/{name}")
            head = self._nodes.get_many([f"{stream}/{SUBSCRIPTIONS}"])[0]
            if head is None:
                raise StreamGoneError(f"stream {ns}/{name} does not exist")
            ops.append(Op("set", f"{stream}/{SUBSCRIPTIONS}", head[0], head[1]))
        if version is None:
            ops.append(Op("create", path, encode_subscription(meta)))
        else:
            ops.append(Op("set", path, encode_subscription(meta), version))
        try:
            self._multi(ops)
        except MultiOpFailed as e:
            if isinstance(e.cause, BadVersionError | NodeExistsError):
                raise e.cause from e
            if ops[e.index].path == f"{stream}/{SUBSCRIPTIONS}":
                raise StreamGoneError(f"stream {ns}/{name} does not exist") from e
            raise SubscriptionGoneError(f"subscription {sub!r} of {ns}/{name} does not exist") from e
        return 0 if version is None else version + 1

    def _ensure_child_dir(self, stream: str, child: str, what: str) -> None:
        """``<stream>/<child>`` exists (streams created before it was part of a stream lack it)."""
        try:
            self._nodes.create(f"{stream}/{child}")
        except NodeExistsError:
            pass
        except NoNodeError as e:
            raise StreamGoneError(f"stream {what} does not exist") from e

    def delete_subscription(self, ns: str, name: str, sub: str, version: int = -1) -> None:
        """SubscriptionGoneError if absent; BadVersionError if it moved since ``version``."""
        try:
            self._nodes.delete(self._sub_path(ns, name, sub), version, retry=False)
        except NoNodeError as e:
            raise SubscriptionGoneError(f"subscription {sub!r} of {ns}/{name} does not exist") from e

    # -- Spark task ledgers (ledger_client/stream/sink.py) ----------------------------------------
    def add_task_ledger(self, ns: str, name: str, ledger_id: int) -> None:
        """Mark ``ledger_id`` as a task ledger of the stream (``<stream>/tasks/<id>``; idempotent;
        the directory is made for a stream created before it was part of one). StreamGoneError
        without the stream."""
        stream = self._stream_path(ns, name)
        path = f"{stream}/{TASKS}/{int(ledger_id)}"
        for attempt in range(2):
            try:
                self._nodes.create(path)
                return
            except NodeExistsError:
                return
            except NoNodeError:
                if attempt:
                    raise
                self._ensure_child_dir(stream, TASKS, f"{ns}/{name}")

    def list_task_ledgers(self, ns: str, name: str) -> list[int]:
        """The ids marked under the stream, ascending (one listing); [] without the stream."""
        kids = self._nodes.children(f"{self._stream_path(ns, name)}/{TASKS}") or []
        return sorted(int(k) for k in kids if k.isdigit())

    def remove_task_ledgers(self, ns: str, name: str, ledger_ids: list[int]) -> None:
        """Drop the markers of ``ledger_ids`` (pipelined; absent ones are no error)."""
        base = f"{self._stream_path(ns, name)}/{TASKS}"
        ops = [Op("delete", f"{base}/{int(lid)}") for lid in ledger_ids]
        for i in range(0, len(ops), _PIPELINE_MAX):
            for outcome in self._nodes.pipeline(ops[i:i + _PIPELINE_MAX], retry=True):
                if isinstance(outcome, MetadataError) and not isinstance(outcome, NoNodeError):
                    raise outcome

    # -- the writer lock --------------------------------------------------------------------
    def lock_stream(self, ns: str, name: str, owner: str, timeout_s: float) -> StreamLockInfo:
        """Take the stream's writer lock, waiting up to ``timeout_s`` for a live holder to go
        (StreamLockTimeoutError). The lock is ephemeral: it goes with this store's session."""
        lock_dir = f"{self._stream_path(ns, name)}/{LOCK}"
        try:
            mine = self._nodes.create(f"{lock_dir}/lock-", owner.encode(), ephemeral=True, sequential=True,
                                      retry=False)
        except NoNodeError as e:
            raise StreamGoneError(f"stream {ns}/{name} does not exist") from e
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                kids = sorted(self._nodes.children(lock_dir) or [])
                ours = mine.rsplit("/", 1)[1]
                if ours not in kids:
                    raise NoNodeError(f"lock node {mine} vanished: the ZooKeeper session expired")
                k = kids.index(ours)
                if k == 0:
                    return StreamLockInfo(mine, owner)
                self._await_gone(f"{lock_dir}/{kids[k - 1]}", deadline, ns, name)
        except BaseException:
            self._delete_quietly(mine)
            raise

    def _await_gone(self, path: str, deadline: float, ns: str, name: str) -> None:
        gone = threading.Event()
        state = self._nodes.watch(path, lambda _event: gone.set())
        if state is None:
            return
        left = deadline - time.monotonic()
        if left <= 0 or not gone.wait(left):
            holder = self.stream_lock_holder(ns, name)
            raise StreamLockTimeoutError(f"stream {ns}/{name} is held by another writer ({holder})")

    def unlock_stream(self, lock: StreamLockInfo) -> None:
        """Release (idempotent)."""
        self._delete_quietly(lock.path)

    def stream_lock_holder(self, ns: str, name: str) -> str | None:
        """The owner string of the current holder, or None."""
        lock_dir = f"{self._stream_path(ns, name)}/{LOCK}"
        for kid in sorted(self._nodes.children(lock_dir) or []):
            got = self._nodes.get_many([f"{lock_dir}/{kid}"])[0]
            if got is not None:
                return got[0].decode(errors="replace")
        return None
