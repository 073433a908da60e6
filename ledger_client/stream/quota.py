"""A namespace's storage quota (DESIGN §4.10): what it counts, where the count lives, how a writer
checks it, and how far concurrent writers can pass it.

**What is counted.** ``storage_quota_bytes`` bounds the bytes of a namespace's segments held on
bookies: sealed segments and segments in progress, not tiered ones (their records live in Delta,
even while tiering has yet to delete their ledgers) and not deleted ones. The unit is a segment's
ledger bytes, one copy: the records with their record-set framing (12 bytes a record, 16 an
entry), not multiplied by the write quorum. It is Pulsar's logical storage size, and what
``SegmentInfo.bytes`` and ``retention_bytes`` count, so the figures agree with each other.

**Where the count lives.** In ZooKeeper, without a write per entry: every stream node carries its
sealed segments' bytes and its segment in progress's bytes as the writer last published them
(``StreamMeta.sealed_bytes``, ``open_bytes``), recomputed from the segments by every change the
commit loop makes (``transitions.accounted``): a seal records the exact ledger length, retention,
truncation and tiering take segments out. A namespace's usage is the sum over its stream nodes:
a listing and one pipelined read (``read_usage``), whatever the number of segments. A writer
publishes its segment's bytes (``transitions.publish_open_bytes``, one CAS) when a slice of the
quota (1/32) is unpublished, at most every ``PUBLISH_MIN_S``, otherwise every ``PUBLISH_S`` while
it writes, and about ``PUBLISH_MIN_S`` to twice that after its last append; nothing when idle.

**How a writer checks it** (``QuotaGate``, under the writer's lock, no I/O): a record is refused
(``QuotaExceededError``, nothing of it written, the writer still usable) when the namespace's
usage plus the record (its payload and 12 bytes) would pass the quota. The usage is the other
streams' bytes as last read, plus this stream's sealed bytes (as last read or as the writer's own
changes left them), plus its own segment's bytes counted locally: every entry appended and every
record buffered, so a writer alone never passes its quota (save the 16-byte headers of entries not
yet sent). The usage is read again every ``REFRESH_S`` while writing, right after each
publication, and, when a write would be refused on a read older than ``REFUSED_REFRESH_S``, at
once, before refusing. So a refused writer resumes by itself: the first write after retention,
truncation or tiering freed space (or after the quota was raised) is accepted, without reopening.

**How far concurrent writers can pass it.** A writer does not see other writers' bytes until they
publish them and it reads them: each other writer's unpublished bytes (at most a slice, plus what
it writes in ``PUBLISH_MIN_S``) and what it published since this writer's last read. With N
writers writing at once the namespace can so end up over its quota by about (N - 1) x (a slice +
what one writer writes in ``PUBLISH_MIN_S``) when they write at similar speed, and never by more
than what the other writers write in ``REFRESH_S`` plus their unpublished bytes. Once over, every
writer is refused until space is freed. A Spark sink (jobs) writes ledgers of its own and links
them: it is not checked here.

**The backlog quota** (DESIGN §4.11, ``backlog_quota_bytes`` with ``refuse_writes``) is the same
gate's second bound, per stream: the bytes its slowest subscription has not consumed, with the
writer's own segment counted locally as above, must stay within it. What the slowest subscription
has not consumed of the other segments is read with the usage (one read of the stream's segments
and subscriptions per sync), so a writer refused for it resumes within ``REFUSED_REFRESH_S`` of
its writes once a subscription's commit lands. A stream without subscriptions has no backlog.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from metadata.streams import decode_settings
from metadata.streams import subscriptions as subs
from metadata.streams import transitions as tr

from .. import errors
from ..metadata_errors import metadata_errors
from .segments import commit
from .settings import NamespaceSettings

if TYPE_CHECKING:
    from metadata import MetadataStore
    from metadata.streams import StreamLockInfo

    from .namespace import Namespace

log = logging.getLogger(__name__)

REFRESH_S = 5.0            # the namespace's usage is read again at least this often while writing
REFUSED_REFRESH_S = 0.5    # a refusal rests on a read at most this old (else it reads first)
PUBLISH_S = 5.0            # a growing segment's bytes are published at least this often
PUBLISH_MIN_S = 0.5        # ... at most this often
SLICE_FRACTION = 32        # ... and as soon as 1/32 of the quota is unpublished


@dataclass(frozen=True)
class StreamUsage:
    """One stream's bytes on bookies, from its stream node at ``version``."""

    sealed_bytes: int
    open_bytes: int    # its segment in progress, as its writer last published it
    version: int

    @property
    def total(self) -> int:
        return self.sealed_bytes + self.open_bytes


@dataclass(frozen=True)
class NamespaceUsage:
    """A namespace's bytes on bookies against its quota (``quota_bytes`` None: no quota)."""

    namespace: str
    used_bytes: int
    quota_bytes: int | None
    streams: dict[str, StreamUsage] = field(default_factory=dict)
    # The namespace's per-stream backlog quota when it refuses writes (DESIGN §4.11; None: none, or
    # drop_oldest), read with the usage so that a writer applies a change within REFRESH_S.
    backlog_quota_bytes: int | None = None

    @property
    def free_bytes(self) -> int | None:
        """What may still be written (0 once at or over the quota); None without a quota."""
        return None if self.quota_bytes is None else max(0, self.quota_bytes - self.used_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "used_bytes": self.used_bytes, "quota_bytes": self.quota_bytes,
                "free_bytes": self.free_bytes, "streams": {n: s.total for n, s in sorted(self.streams.items())}}


def read_usage(store: MetadataStore, namespace: str) -> NamespaceUsage:
    """The namespace's usage as ZooKeeper knows it now: its stream nodes' counts (a stream last
    changed before they were kept is counted from its segments, once). NoSuchNamespaceError if
    it does not exist."""
    with metadata_errors(f"read the storage usage of namespace {namespace}"):
        raw, heads = store.streams.read_stream_heads(namespace)
        streams: dict[str, StreamUsage] = {}
        for name, (meta, version) in heads.items():
            if meta.sealed_bytes is not None:
                streams[name] = StreamUsage(meta.sealed_bytes, meta.open_bytes, version)
                continue
            view = store.streams.read_stream(namespace, name)
            if view is not None:
                sealed, open_ = tr.on_bookies(view.ordered())
                streams[name] = StreamUsage(sealed, open_, view.version)
        settings = NamespaceSettings.from_json(decode_settings(raw, f"namespace {namespace}"))
    backlog = settings.backlog_quota_bytes if settings.backlog_quota_policy == "refuse_writes" else None
    return NamespaceUsage(namespace, sum(s.total for s in streams.values()), settings.storage_quota_bytes, streams,
                          backlog)


def read_all_usage(store: MetadataStore) -> list[NamespaceUsage]:
    """Every namespace's usage (the auditor's gauges), a namespace deleted meanwhile left out."""
    with metadata_errors("list namespaces"):
        names = store.streams.list_namespaces()
    out = []
    for name in names:
        try:
            out.append(read_usage(store, name))
        except errors.NoSuchNamespaceError:
            continue
    return out


def refusal(usage: int, quota: int, cost: int, where: str) -> errors.QuotaExceededError:
    return errors.QuotaExceededError(
        f"{where}: the namespace holds {usage} of its {quota} bytes of storage quota on bookies, and a record "
        f"of {cost} bytes does not fit; nothing was written. Writes are accepted again once retention, "
        "truncation or tiering free space (or the quota is raised)")


def backlog_refusal(backlog: int, quota: int, cost: int, where: str) -> errors.QuotaExceededError:
    return errors.QuotaExceededError(
        f"{where}: the stream's slowest subscription has {backlog} bytes to consume, its backlog quota is "
        f"{quota}, and a record of {cost} bytes does not fit; nothing was written. Writes are accepted again "
        "once the subscriptions consume and commit (or the quota is raised)")


# ---------------------------------------------------------------------- a writer's check

NOT_READ = object()   # a sync that did not read the backlog (no backlog quota, or the read failed)

class Verdict(enum.Enum):
    ADMIT = "admit"
    REFUSE = "refuse"
    RECHECK = "recheck"    # refused on an old read: read now (``sync``), then check again


class SyncPlan(NamedTuple):
    """One sync: publish ``nbytes`` for segment ``sequence`` (None: publish nothing), then read."""

    sequence: int | None
    nbytes: int


class QuotaGate:
    """One writer's view of its namespace's usage, and its decisions: admit a record, start a sync
    (publish, read). Pure: no I/O, times are arguments (monotonic seconds); the writer calls it
    under its lock and runs the syncs it asks for (``sync``), one at a time."""

    __slots__ = ("backlog_offset", "backlog_quota", "busy", "checking", "next_at", "next_bytes", "others",
                 "published", "published_at", "quota", "read_at", "refused", "sealed", "segment", "version")

    def __init__(self, quota: int | None, now: float, backlog_quota: int | None = None) -> None:
        self.quota = quota
        # The backlog quota: the stream's slowest subscription's backlog is sealed + backlog_offset
        # + the writer's own segment (None: no subscription, no backlog; or not read yet).
        self.backlog_quota = backlog_quota
        self.backlog_offset: int | None = None
        self.checking = quota is not None or backlog_quota is not None   # whether a write asks ``check``
        self.others = 0            # the other streams' bytes, as last read
        self.sealed = 0            # this stream's sealed segments' bytes ...
        self.version = -1          # ... from its stream node at this version
        self.read_at = -math.inf   # when the usage was last read (or a read last failed)
        self.segment: int | None = None   # the segment in progress whose bytes are published
        self.published = 0
        self.published_at = now
        self.busy = False          # a sync is running
        self.refused = False       # the last check refused
        # The writer asks ``due`` only once the time reaches next_at or its segment's appended bytes
        # reach next_bytes: a write's cost in a namespace without a quota is two comparisons.
        self.next_at = now
        self.next_bytes = math.inf

    def used(self, open_bytes: int) -> int:
        """The namespace's usage with this writer's segment at ``open_bytes`` (appended + buffered)."""
        return self.others + self.sealed + open_bytes

    def check(self, cost: int, open_bytes: int, now: float) -> Verdict:
        """May a record costing ``cost`` bytes be written? RECHECK (the sync then counts as
        running) when it would be refused on a read older than REFUSED_REFRESH_S."""
        q = self.quota
        fits = q is None or self.others + self.sealed + open_bytes + cost <= q
        if fits and not self._over_backlog(cost, open_bytes):
            self.refused = False
            return Verdict.ADMIT
        self.refused = True
        if not self.busy and now - self.read_at >= REFUSED_REFRESH_S:
            self.busy = True
            return Verdict.RECHECK
        return Verdict.REFUSE

    def _over_backlog(self, cost: int, open_bytes: int) -> bool:
        bq, offset = self.backlog_quota, self.backlog_offset
        return bq is not None and offset is not None and self.sealed + offset + open_bytes + cost > bq

    def refusal(self, open_bytes: int, cost: int, where: str) -> errors.QuotaExceededError:
        """Why ``check`` refused: the storage quota, or else the backlog quota."""
        q = self.quota
        if q is not None and self.used(open_bytes) + cost > q or self.backlog_offset is None:
            return refusal(self.used(open_bytes), q or 0, cost, where)
        return backlog_refusal(self.sealed + self.backlog_offset + open_bytes, self.backlog_quota or 0, cost, where)

    def unpublished(self, sent: int) -> int:
        """Bytes appended to the segment in progress (``sent`` so far) that are not published."""
        return sent - self.published if self.segment is not None else 0

    def due(self, sent: int, now: float, idle: bool = False) -> SyncPlan | None:
        """A sync to start now (then counted as running), or None. ``sent``: the bytes appended to
        the segment in progress so far; ``idle``: asked by the timer that publishes what a writer
        appended last (any unpublished bytes are then worth publishing, at the same bounded rate)."""
        if self.busy:
            return None
        unpublished = self.unpublished(sent)
        since = now - self.published_at
        publish = unpublished > 0 and (since >= PUBLISH_S or (since >= PUBLISH_MIN_S and (
            idle or (self.quota is not None and unpublished >= self.quota // SLICE_FRACTION))))
        if not publish and now - self.read_at < REFRESH_S:
            self.next_at = now + PUBLISH_MIN_S
            return None
        self.busy = True
        self.next_at = math.inf   # until the sync ends
        return SyncPlan(self.segment if publish else None, sent)

    def _rearm(self) -> None:
        """When ``due`` is next worth asking: a publication may be due PUBLISH_MIN_S after the last
        one (a slice: once its bytes are appended), a read REFRESH_S after the last."""
        self.next_at = min(self.read_at + REFRESH_S, self.published_at + PUBLISH_MIN_S)
        self.next_bytes = math.inf if self.quota is None else self.published + self.quota // SLICE_FRACTION

    def synced(self, plan: SyncPlan, published: bool, usage: NamespaceUsage | None, stream: str, now: float,
               backlog: object = NOT_READ) -> None:
        """A sync ended: ``published`` whether its publication was committed (or found needless),
        ``usage`` what it read (None: the read failed; the old figures stand until the next),
        ``backlog`` the backlog offset read (``NOT_READ``: none)."""
        self.busy = False
        self.read_at = now
        if backlog is not NOT_READ:
            self.backlog_offset = backlog if isinstance(backlog, int) else None
        if published and plan.sequence is not None and plan.sequence == self.segment:
            self.published = max(self.published, plan.nbytes)
            self.published_at = now
        if usage is not None:
            self.quota = usage.quota_bytes
            self.backlog_quota = usage.backlog_quota_bytes
            self.checking = self.quota is not None or self.backlog_quota is not None
            mine = usage.streams.get(stream)
            self.others = usage.used_bytes - (mine.total if mine is not None else 0)
            if mine is not None:
                self.committed(mine.sealed_bytes, mine.version)
        self._rearm()

    def committed(self, sealed_bytes: int | None, version: int) -> None:
        """This stream's sealed bytes as of its node's ``version`` (the writer's own change, or a
        read): kept if newer than what the gate has."""
        if sealed_bytes is not None and version > self.version:
            self.sealed, self.version = sealed_bytes, version

    def segment_started(self, sequence: int, now: float) -> None:
        self.segment, self.published, self.published_at = sequence, 0, now
        if not self.busy:
            self._rearm()


def fail_after(fut: Future[Any], before: Future[Any] | None, error: BaseException) -> None:
    """Fail a refused record's future once the record written before it settled, so that a
    writer's futures complete in write order, refused ones included."""
    if before is None or before.done():
        fut.set_exception(error)
    else:
        before.add_done_callback(lambda _f: fut.set_exception(error))


class WriterQuota:
    """A writer's quota machinery around its gate: the syncs (on the client's worker threads, or
    on a writer's caller for a RECHECK) and the timer that publishes what an idle writer appended
    last, which would otherwise wait for its next write. ``mutex`` is the writer's lock, which
    guards the gate; ``appended`` (called under it) is the bytes appended to its segment so far."""

    def __init__(self, ns: Namespace, name: str, lock: StreamLockInfo, mutex: threading.Lock,
                 appended: Callable[[], int]) -> None:
        s = ns.settings
        backlog_quota = s.backlog_quota_bytes if s.backlog_quota_policy == "refuse_writes" else None
        self.gate = QuotaGate(s.storage_quota_bytes, time.monotonic(), backlog_quota)
        self._ns, self._name, self._lock, self._mutex, self._appended = ns, name, lock, mutex, appended
        self._timer: threading.Timer | None = None
        self._mark = 0   # the bytes appended when the timer was armed
        self._closed = False
        if self.gate.checking:
            self.gate.busy = True
            self.sync(SyncPlan(None, 0))   # the first write is checked on a fresh read

    def admitted(self, now: float) -> None:
        """Under the writer's lock, after a record was admitted: start a sync that is due, or arm
        the timer for bytes that cannot be published yet."""
        plan = self.gate.due(self._appended(), now)
        if plan is not None:
            self._ns.client.run_soon(partial(self.sync, plan))
        elif self._timer is None and not self._closed:
            self._arm()

    def sync(self, plan: SyncPlan) -> None:
        """Not under the writer's lock: carry out ``plan``, then give the gate the result."""
        if self._closed:
            plan = plan._replace(sequence=None)   # the stream's lock may be gone: no more publications
        try:
            published, usage = sync(self._ns, self._name, self._lock, plan)
        except Exception:  # a bug must not leave the gate waiting for a sync forever
            log.exception("stream %s/%s: storage usage sync failed", self._ns.name, self._name)
            published, usage = False, None
        limit = usage.backlog_quota_bytes if usage is not None else self.gate.backlog_quota
        backlog = read_backlog(self._ns, self._name) if limit is not None else NOT_READ
        with self._mutex:
            self.gate.synced(plan, published, usage, self._name, time.monotonic(), backlog)

    def _arm(self) -> None:
        """Under the writer's lock: the timer, marked with the bytes appended now. Firing with
        nothing appended since, it finds the writer idle and publishes what it has not; a writer
        still writing publishes by the usual rules (``due``), and the timer looks again later."""
        self._mark = self._appended()
        self._timer = threading.Timer(PUBLISH_MIN_S, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._mutex:
            self._timer = None
            if self._closed:
                return
            sent = self._appended()
            plan = self.gate.due(sent, time.monotonic(), idle=sent == self._mark)
            if plan is None and self.gate.unpublished(sent) > 0:
                self._arm()   # still writing, a sync running, or the last publication too recent
        if plan is not None:
            self.sync(plan)

    def close(self) -> None:
        """Under the writer's lock, as it closes: no more publications or timers."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def sync(ns: Namespace, name: str, lock: StreamLockInfo, plan: SyncPlan) -> tuple[bool, NamespaceUsage | None]:
    """Carry out ``plan`` (no writer lock held): publish, then read the usage. (published, usage);
    a failure is logged and reported as not published / no usage, never raised: the writer goes
    on with the figures it has."""
    published = plan.sequence is None
    try:
        if plan.sequence is not None:
            seq = plan.sequence
            commit(ns, name, lambda v: tr.publish_open_bytes(v, seq, plan.nbytes), lock)
            published = True
        return published, read_usage(ns.client.store, ns.name)
    except errors.LedgerError as e:
        log.info("stream %s/%s: storage usage not %s: %s", ns.name, name, "read" if published else "published", e)
        return published, None


def read_backlog(ns: Namespace, name: str) -> object:
    """The gate's backlog offset: what the slowest subscription has not consumed of the stream's
    sealed and tiered segments, less what it consumed of the segment in progress, less the sealed
    bytes (the gate adds its own figure of those and its segment's); None without subscriptions,
    NOT_READ when the read failed (logged; the old figure stands)."""
    try:
        held = subs.unconsumed_held(ns.view(name))
    except errors.LedgerError as e:
        log.info("stream %s/%s: backlog not read: %s", ns.name, name, e)
        return NOT_READ
    return None if held is None else held[0] - held[1]
