"""BookKeeper's request semantics: adds, reads, fencing, explicit LAC and long polls.

Reads, fences and LAC writes run on the server's event loop; adds also on the threads of TCP add
connections (spark_bookie.server.add_connection), so `_apply_lock` makes each add batch's checks, storage
writes and journal submit one step against a fence's (and a new ledger's key setting): an add that
found the ledger unfenced is submitted to the journal before the FENCE record, hence durable and
answered before the fencing read is. The rules (BookKeeper's Bookie.addEntry / readEntry /
fenceLedger):
- the first add or fence of a ledger records its master key (journaled before the entry); later
  adds and fences with another key get EUA;
- once fenced, normal adds get EFENCED and RECOVERY_ADD adds are still accepted;
- a fence is journaled (and fsynced) before the fencing read is answered;
- an add is answered EOK only after its journal record is fsynced; entries are put into ledger
  storage before they are journaled so that a checkpoint mark never passes an unapplied record.
Bodies are checked before they are written: the framed header must name the ledger and entry of
the request and the entry must fit the size limit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from itertools import pairwise
from typing import TypeVar

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import FramingError, parse_header, parse_lac_header
from metadata.tenancy import CONSUME, PRODUCE, Caller
from spark_bookie.errors import (
    BadRequestError,
    BookieError,
    FencedError,
    NoLedgerError,
    ReadOnlyError,
    StorageIOError,
    TooManyRequestsError,
    UnauthorizedError,
)
from spark_bookie.server.access_gate import AccessGate
from spark_bookie.server.adds import (
    AddGroup,
    BatchAnswer,
    Countdown,
    Reply,
    accept_bodies,
    add_groups,
    check_group_shape,
    group_failures,
)
from spark_bookie.server.admission import Admission, Piece
from spark_bookie.server.config import BookieConfig
from spark_bookie.server.lac import LacTracker
from spark_bookie.server.metrics import BookieMetrics
from spark_bookie.storage.journal import Journal, JournalCallback, JournalRecord, RecordType
from spark_bookie.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)
MASTER_KEY_BYTES = 20

T = TypeVar("T")


class RequestProcessor:
    def __init__(self, config: BookieConfig, storage: LedgerStorage, journal: Journal,
                 loop: asyncio.AbstractEventLoop, executor: Executor,
                 read_only: Callable[[], bool], has_room: Callable[[int], bool] = lambda _n: True,
                 metrics: BookieMetrics | None = None, gate: AccessGate | None = None,
                 admission: Admission | None = None) -> None:
        """``has_room(nbytes)``: whether adds of that many bytes still fit on the ledger disk
        (DiskMonitor.has_room: their flush must leave the reserves free). ``metrics``: counted
        once per add batch and per read request; None = not counted at all. ``gate``: who may
        touch which ledger (tenants, DESIGN §4.9); None = anyone the token checks let in.
        ``admission``: each add batch's turn in the journal and its hold for write rates (DESIGN
        §4.10); None = every ledger its own flow, nothing held."""
        self.admission = admission or Admission(None)
        self._metrics = metrics
        self.gate = gate
        self._cfg = config
        self._has_room = has_room
        self._storage = storage
        self._journal = journal
        self._loop = loop
        self._executor = executor
        self._read_only = read_only
        self._reads_in_flight = 0
        self._apply_lock = threading.Lock()  # see the module docstring
        self.lac = LacTracker(self._initial_lac, loop)

    # ------------------------------------------------------------------ helpers

    def _initial_lac(self, ledger_id: int) -> int:
        lac = -1
        explicit = self._storage.explicit_lac(ledger_id)
        if explicit is not None:
            lac = explicit[0]
        try:
            body = self._storage.get_entry(ledger_id, -1)
            lac = max(lac, parse_header(body)[2])
        except (BookieError, FramingError):
            pass
        return lac

    def _journal_async(self, records: Sequence[JournalRecord], flow: Hashable) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(exc: BaseException | None) -> None:
            self._loop.call_soon_threadsafe(_settle, fut, exc)

        self._journal.submit(records, done, flow=flow)
        return fut

    def _check_key(self, ledger_id: int, key: bytes, records: list[JournalRecord]) -> None:
        """Check `key` against the ledger's; for a new ledger, record it (journal record appended)."""
        if len(key) != MASTER_KEY_BYTES:
            raise BadRequestError(f"master key must be {MASTER_KEY_BYTES} bytes, got {len(key)}")
        known = self._storage.master_key(ledger_id)
        if known is None:
            self._storage.set_master_key(ledger_id, key)
            records.append(JournalRecord(RecordType.MASTER_KEY, ledger_id, -1, key))
        elif known != key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")

    # ------------------------------------------------------------------ adds

    # ------------------------------------------------------------------ tenants

    def add_refusals(self, groups: Sequence[AddGroup], caller: Caller | None) -> dict[int, str]:
        """Why each refused ledger of an add batch is refused (may read ZooKeeper on a cache miss:
        on the event loop, warm the gate with :meth:`check_async` first)."""
        if caller is None or self.gate is None:
            return {}
        refused = {}
        for lid in {g.ledger_id for g in groups}:
            why = self.gate.refusal(caller, lid, PRODUCE)
            if why is not None:
                refused[lid] = why
        return refused

    async def warm_add_checks(self, batch: pb.AddBatch, caller: Caller | None) -> None:
        """Decide, off the event loop, what process_adds will ask the gate about this batch, so
        that process_adds (which runs on the loop for gRPC) finds every decision cached."""
        if caller is None or self.gate is None:
            return
        for lid in {a.ledger_id for a in batch.adds} | {g.ledger_id for g in batch.ledger_adds}:
            await self.gate.refusal_async(caller, lid, PRODUCE, self._executor)

    async def check_async(self, caller: Caller | None, ledger_id: int, action: str) -> None:
        """UnauthorizedError unless ``caller`` may ``action`` the ledger. A role that may produce
        may also read a ledger fenced on this bookie: the reads of the recovery that fenced it,
        which a writer taking over a stream makes."""
        if caller is None or self.gate is None:
            return
        why = await self.gate.refusal_async(caller, ledger_id, action, self._executor)
        if why is not None and action == CONSUME and self._storage.is_fenced(ledger_id):
            if await self.gate.refusal_async(caller, ledger_id, PRODUCE, self._executor) is None:
                return
        if why is not None:
            raise UnauthorizedError(why)

    def _accept_group(self, g: AddGroup, answer: BatchAnswer) -> int:
        """Validate and apply one ledger's adds of a batch (one key check and one storage lock for
        the lot); returns the highest piggybacked LAC among the accepted ones (-2: none)."""
        try:
            why = answer.refused.get(g.ledger_id)
            if why is not None:
                raise UnauthorizedError(why)
            check_group_shape(g)
            if g.lac_body and not g.entry_ids:
                return self._announced_lac(g)
            self._check_key(g.ledger_id, g.master_key, answer.records)
            if g.flag != pb.RECOVERY_ADD and self._storage.is_fenced(g.ledger_id):
                raise FencedError(f"ledger {g.ledger_id} is fenced")
        except BookieError as e:
            answer.failures.extend(group_failures(g, e.status, str(e)))
            return -2
        entries, top_lac = accept_bodies(g, self._cfg.entry_size_bytes_max, answer.records, answer.ok_ids,
                                         answer.failures)
        if entries:
            self._storage.add_entries(g.ledger_id, entries)
        return top_lac

    def _announced_lac(self, g: AddGroup) -> int:
        """The explicit LAC a group without entries announces, kept as WriteLac's is (ReadLac
        answers it), if this bookie holds the ledger under the group's key and it is not fenced;
        returns it (-2: none). Not journaled: it may be lost with a crash, as a LAC may (a
        restarted bookie starts from the one its last entry carries); an unknown ledger is not
        created for it."""
        lid = g.ledger_id
        try:
            body_lid, lac = parse_lac_header(g.lac_body)
        except FramingError as e:   # nothing answers an announcement: the bookie says it
            log.warning("ledger %d: a malformed announced LAC was ignored: %s", lid, e)
            return -2
        if body_lid != lid or lac < -1:
            log.warning("ledger %d: an announced LAC naming ledger %d, LAC %d was ignored", lid, body_lid, lac)
            return -2
        if self._storage.master_key(lid) != g.master_key or self._storage.is_fenced(lid):
            return -2
        self._storage.set_explicit_lac(lid, lac, g.lac_body)
        return lac

    def admit(self, groups: Sequence[AddGroup]) -> tuple[Hashable, list[Piece]]:
        """(the batch's flow, its pieces with their holds for the namespace's write rate): asked
        before process_adds by a caller that holds no lock; it applies each piece once its hold
        is over and :meth:`wait_for_room` lets it."""
        return self.admission.assess(groups)

    def wait_for_room(self, flow: Hashable, timeout_s: float | None = None) -> bool:
        """Block while the flow has its share of the journal queued (fair share); False on timeout."""
        return self._journal.wait_for_room(flow, timeout_s)

    def process_adds(self, batch: pb.AddBatch, reply: Reply, flush: Callable[[], None] | None = None,
                     caller: Caller | None = None, flow: Hashable = None,
                     groups: list[AddGroup] | None = None) -> None:
        """Apply a batch; `reply(ok_request_ids, failures)` runs once all accepted adds are durable.

        Callable from any thread. Without `flush`, `reply` runs on the event loop. With it,
        `reply` may run on the journal thread (so it must be thread-safe) and only collects
        answers: `flush` sends them, once per journal group however many of the caller's batches
        the group held. That spares each durable add a wake-up of the event loop (its self-pipe,
        a loop turn and a second one for the write): about a quarter of a bookie's CPU per add at
        1,000 adds/s. With it, too, the caller's thread writes and syncs a small group itself
        when the journal is idle (Journal.commit_here), so `reply` and `flush` may run before
        this returns. An error while applying (a failed inline storage flush) propagates as
        before: the caller answers the whole batch EIO. ``caller``: who sent it (None: no token
        checks); its ledgers outside the caller's grants are answered EUA. ``flow`` and
        ``groups``: what :meth:`admit` was given and answered, when the caller asked it.
        """
        if groups is None:
            groups = add_groups(batch)
        nbytes = sum(sum(map(len, g.bodies)) for g in groups)
        if self._metrics is not None:
            reply = _metered(reply, self._metrics, time.perf_counter(), nbytes)
        answer = BatchAnswer(groups, reply, flush, self._loop)
        answer.refused = self.add_refusals(groups, caller)
        answer.flow = flow
        if self._read_only() or not self._has_room(nbytes):
            answer.answer_now([f for g in groups for f in group_failures(
                g, pb.EREADONLY, "bookie is read-only (disk usage above threshold, or its reserves reached)")])
            return
        refused = self._apply(answer)
        if refused is not None:
            answer.finish(refused)
            if flush is not None:
                flush()
        elif not answer.records:
            answer.answer_now(answer.failures)
        elif flush is not None:
            self._journal.commit_here()  # outside _apply_lock: others' adds queue meanwhile

    def _apply(self, answer: BatchAnswer) -> StorageIOError | None:
        """Check and store every group and submit the journal records, one step under _apply_lock;
        then publish the LACs they carry. Returns the journal's refusal, if it refused them."""
        lacs: dict[int, int] = {}
        refused = None
        with self._apply_lock:
            for g in answer.groups:
                lac = self._accept_group(g, answer)
                if lac > lacs.get(g.ledger_id, -2):
                    lacs[g.ledger_id] = lac
            if answer.records:  # with a flush the caller is a connection's thread: it may commit itself
                done = answer.finish if answer.flush is not None else answer.finish_on_loop
                try:
                    self._submit(answer, done)
                except StorageIOError as e:
                    refused = e
        # The LAC an entry carries names entries its writer was already told are durable (on Qa
        # bookies), so long polls may learn it now, before this entry's own journal sync, as
        # BookKeeper's ledger storage does on add: a tailing reader sees an entry one fdatasync
        # sooner. After the lock: a TCP long poll is answered from here (lac.py), and the entries
        # it returns were stored above.
        for lid, lac in lacs.items():
            if lac >= -1:
                self.lac.advance(lid, lac)
        return refused

    def _submit(self, answer: BatchAnswer, done: JournalCallback) -> None:
        """The batch's journal records in one submit, or one per ledger when it spans several (a
        journal taking turns keeps each ledger's records in one flow: storage/flow_queue.py)."""
        records, wake = answer.records, answer.flush is None
        if len({g.ledger_id for g in answer.groups}) == 1:
            self._journal.submit(records, done, wake=wake, flow=answer.flow)
            return
        by_ledger: dict[int, list[JournalRecord]] = {}
        for r in records:
            by_ledger.setdefault(r.ledger_id, []).append(r)
        countdown = Countdown(len(by_ledger), done)
        try:
            for i, (lid, recs) in enumerate(by_ledger.items()):
                self._journal.submit(recs, countdown.one, wake=wake,
                                     flow=answer.flow if i == 0 else self.admission.flow_of(lid))
        except StorageIOError:
            countdown.abandon()   # the caller answers the whole batch; a submit already queued must not
            raise

    # ------------------------------------------------------------------ fencing and LAC

    async def fence(self, ledger_id: int, key: bytes, caller: Caller | None = None) -> None:
        await self.check_async(caller, ledger_id, PRODUCE)
        records: list[JournalRecord] = []
        with self._apply_lock:
            self._check_key(ledger_id, key, records)
            if self._storage.set_fenced(ledger_id):
                log.info("fenced ledger %d", ledger_id)
            # Always journal: an earlier fence may still be in flight and must be durable before we answer.
            records.append(JournalRecord(RecordType.FENCE, ledger_id, -1, b""))
            durable = self._journal_async(records, self.admission.flow_of(ledger_id))
        await durable

    async def write_lac(self, req: pb.WriteLacRequest, caller: Caller | None = None) -> None:
        if req.ledger_id < 0 or req.lac < -1:
            raise BadRequestError("ledger id must be >= 0 and lac >= -1")
        await self.check_async(caller, req.ledger_id, PRODUCE)
        if self._read_only():
            raise ReadOnlyError("bookie is read-only (disk usage above threshold)")
        records: list[JournalRecord] = []
        with self._apply_lock:
            self._check_key(req.ledger_id, req.master_key, records)
            self._storage.set_explicit_lac(req.ledger_id, req.lac, req.body)
            records.append(JournalRecord(RecordType.EXPLICIT_LAC, req.ledger_id, req.lac, req.body))
            durable = self._journal_async(records, self.admission.flow_of(req.ledger_id))
        await durable
        self.lac.advance(req.ledger_id, req.lac)

    # ------------------------------------------------------------------ reads

    async def _in_executor(self, fn: Callable[..., T], *args: object) -> T:
        if self._reads_in_flight >= self._cfg.in_flight_reads_max:
            raise TooManyRequestsError(f"more than {self._cfg.in_flight_reads_max} reads in flight")
        self._reads_in_flight += 1
        try:
            return await self._loop.run_in_executor(self._executor, fn, *args)
        finally:
            self._reads_in_flight -= 1

    async def read(self, req: pb.ReadRequest, caller: Caller | None = None) -> pb.ReadResponse:
        m = self._metrics
        if m is None:
            return await self._read(req, caller)
        started = time.perf_counter()
        try:
            resp = await self._read(req, caller)
        except BaseException:
            m.read_done(started, 0, 0, False)
            raise
        m.read_done(started, 1 if resp.body else 0, len(resp.body), True)
        return resp

    async def _read(self, req: pb.ReadRequest, caller: Caller | None) -> pb.ReadResponse:
        lid, eid = req.ledger_id, req.entry_id
        if lid < 0 or eid < -1:
            raise BadRequestError(f"bad ids {lid}/{eid}: ledger >= 0, entry >= -1")
        if req.flag == pb.FENCE_LEDGER:
            await self.fence(lid, req.master_key, caller)
        else:
            await self.check_async(caller, lid, CONSUME)
        if req.has_previous_lac:
            resp = await self._long_poll(req)
            await self.check_async(caller, lid, CONSUME)   # a grant revoked during the poll
            return resp
        if not self._storage.ledger_exists(lid):
            raise NoLedgerError(f"no ledger {lid} on this bookie")
        body = await self._in_executor(self._storage.get_entry, lid, eid)
        if eid == -1:
            eid = parse_header(body)[1]
        return pb.ReadResponse(status=pb.EOK, ledger_id=lid, entry_id=eid, body=body)

    async def _long_poll(self, req: pb.ReadRequest) -> pb.ReadResponse:
        lid = req.ledger_id
        if not self._storage.ledger_exists(lid):
            raise NoLedgerError(f"no ledger {lid} on this bookie")
        timeout_ms = min(max(req.timeout_ms, 0), self._cfg.long_poll_timeout_ms_max)
        lac = await self.lac.wait_past(lid, req.previous_lac, timeout_ms / 1000.0)
        resp = pb.ReadResponse(status=pb.EOK, ledger_id=lid, entry_id=req.entry_id, max_lac=lac)
        if req.flag == pb.ENTRY_PIGGYBACK and 0 <= req.entry_id <= lac:
            try:
                body = await self._in_executor(self._storage.get_entry, lid, req.entry_id)
                resp.body = body
            except BookieError:
                pass  # the LAC alone still answers the poll
        return resp

    async def read_range(self, req: pb.ReadRangeRequest, caller: Caller | None = None) -> pb.ReadRangeResponse:
        m = self._metrics
        if m is None:
            return await self._read_range(req, caller)
        started = time.perf_counter()
        try:
            resp = await self._read_range(req, caller)
        except BaseException:
            m.read_done(started, 0, 0, False)
            raise
        m.read_done(started, len(resp.bodies), sum(map(len, resp.bodies)), True)
        return resp

    async def _read_range(self, req: pb.ReadRangeRequest, caller: Caller | None) -> pb.ReadRangeResponse:
        lid, first, last = req.ledger_id, req.first_entry_id, req.last_entry_id
        ids = _listed_ids(lid, req.entry_ids) if req.entry_ids else None  # listed: the range is not used
        if req.ids_only and ids is None:
            raise BadRequestError(f"ledger {lid}: ids_only needs the entry ids to look for (a listed read)")
        max_bytes = await self._range_checks(req, caller, listed=ids is not None)
        if ids is not None and req.ids_only:
            held = await self._in_executor(self._storage.held_entries, lid, ids)
            return pb.ReadRangeResponse(status=pb.EOK, ledger_id=lid, first_entry_id=ids[0], entry_ids=held)
        if ids is not None:
            found, bodies = await self._in_executor(self._storage.get_entries, lid, ids, max_bytes)
            return pb.ReadRangeResponse(status=pb.EOK, ledger_id=lid, first_entry_id=found[0], bodies=bodies,
                                        entry_ids=found)
        if req.wait_for_lac:
            resp = await self._range_long_poll(req, max_bytes)
            await self.check_async(caller, lid, CONSUME)   # a grant revoked during the poll
            return resp
        bodies = await self._in_executor(self._storage.get_range, lid, first, last, max_bytes)
        return pb.ReadRangeResponse(status=pb.EOK, ledger_id=lid, first_entry_id=first, bodies=bodies)

    async def _range_checks(self, req: pb.ReadRangeRequest, caller: Caller | None, listed: bool = False) -> int:
        """A range read's checks (the ids, the caller's grant, the ledger here); its max_bytes."""
        lid, first, last = req.ledger_id, req.first_entry_id, req.last_entry_id
        if lid < 0 or (not listed and (first < 0 or last < first)):
            raise BadRequestError(f"bad range {lid}/[{first}, {last}]")
        await self.check_async(caller, lid, CONSUME)
        if not self._storage.ledger_exists(lid):
            raise NoLedgerError(f"no ledger {lid} on this bookie")
        limit = self._cfg.read_range_bytes_max
        return min(req.max_bytes, limit) if req.max_bytes > 0 else limit

    def _poll_timeout_s(self, req: pb.ReadRangeRequest) -> float:
        return min(max(req.timeout_ms, 0), self._cfg.long_poll_timeout_ms_max) / 1000

    async def prepare_poll(self, req: pb.ReadRangeRequest, caller: Caller | None) -> tuple[int, float]:
        """A range long poll's checks before it waits, as read_range makes them: (its max_bytes,
        its timeout in seconds, bounded by long_poll_timeout_ms_max). BookieError as read_range
        raises it."""
        return await self._range_checks(req, caller), self._poll_timeout_s(req)

    def tail_answer(self, req: pb.ReadRangeRequest, lac: int, max_bytes: int, caller: Caller | None,
                    started: float) -> pb.ReadRangeResponse | None:
        """A long poll's answer once the LAC is ``lac``, from what is at hand: the write cache and
        a grant decision already cached; None when either is missing (the event loop answers it
        then, as _range_long_poll does). Runs on the thread that raised the LAC: never blocks.
        ``started``: when the poll arrived (perf_counter), for the read metrics."""
        lid = req.ledger_id
        if caller is not None and self.gate is not None and self.gate.cached_refusal(caller, lid, CONSUME) is not None:
            return None   # not cached, or refused (the loop's check names why, fenced ledgers included)
        resp = self._cached_poll_answer(req, lac, max_bytes)
        if resp is None:
            return None
        if self._metrics is not None:
            self._metrics.read_done(started, len(resp.bodies), sum(map(len, resp.bodies)), True)
        return resp

    async def _range_long_poll(self, req: pb.ReadRangeRequest, max_bytes: int) -> pb.ReadRangeResponse:
        """Wait for the LAC to pass previous_lac (bounded by long_poll_timeout_ms_max), then the
        entries from first_entry_id up to it: everything a tailing reader has not seen, at once."""
        lid, first = req.ledger_id, req.first_entry_id
        lac = await self.lac.wait_past(lid, req.previous_lac, self._poll_timeout_s(req))
        resp = self._cached_poll_answer(req, lac, max_bytes)   # a tail's entries: without the executor's hop
        if resp is None:
            bodies = await self._in_executor(self._storage.get_range, lid, first, min(req.last_entry_id, lac),
                                             max_bytes)
            resp = pb.ReadRangeResponse(status=pb.EOK, ledger_id=lid, first_entry_id=first, lac=lac, bodies=bodies)
        return resp

    def _cached_poll_answer(self, req: pb.ReadRangeRequest, lac: int, max_bytes: int) -> pb.ReadRangeResponse | None:
        """A long poll's answer once the LAC is ``lac``: its entries first_entry_id..min(last, lac)
        from the write cache (None when they are not all there)."""
        lid, first = req.ledger_id, req.first_entry_id
        resp = pb.ReadRangeResponse(status=pb.EOK, ledger_id=lid, first_entry_id=first, lac=lac)
        last = min(req.last_entry_id, lac)
        if first <= last:
            bodies = self._storage.get_cached_range(lid, first, last, max_bytes)
            if bodies is None:
                return None
            resp.bodies.extend(bodies)
        return resp

    async def read_lac(self, req: pb.ReadLacRequest, caller: Caller | None = None) -> pb.ReadLacResponse:
        lid = req.ledger_id
        await self.check_async(caller, lid, CONSUME)
        if not self._storage.ledger_exists(lid):
            raise NoLedgerError(f"no ledger {lid} on this bookie")
        resp = pb.ReadLacResponse(status=pb.EOK, ledger_id=lid)
        explicit = self._storage.explicit_lac(lid)
        if explicit is not None:
            resp.lac_body = explicit[1]
        try:
            last = await self._in_executor(self._storage.get_entry, lid, -1)
            resp.last_entry_body = last
        except BookieError:
            pass
        return resp


LISTED_READ_IDS_MAX = 65_536  # entry ids one listed ReadRange may name (a bound on the work one request asks)


def _listed_ids(ledger_id: int, entry_ids: Sequence[int]) -> list[int]:
    """The ids of a listed read, checked: at most LISTED_READ_IDS_MAX, >= 0, strictly ascending."""
    ids = list(entry_ids)
    if len(ids) > LISTED_READ_IDS_MAX:
        raise BadRequestError(f"ledger {ledger_id}: {len(ids)} entry ids in one read, over {LISTED_READ_IDS_MAX}")
    if ids[0] < 0 or any(b <= a for a, b in pairwise(ids)):
        raise BadRequestError(f"ledger {ledger_id}: listed entry ids must be >= 0 and strictly ascending")
    return ids


def _metered(reply: Reply, metrics: BookieMetrics, started: float, nbytes: int) -> Reply:
    """`reply`, counting the batch's answers once (bytes: the batch's, pro rata when some failed)."""
    def answer(ok: list[int], failed: list[pb.AddResponse]) -> None:
        n_ok, n_failed = len(ok), len(failed)
        metrics.adds_done(started, n_ok, n_failed, nbytes if not n_failed else nbytes * n_ok // (n_ok + n_failed))
        reply(ok, failed)
    return answer


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(StorageIOError(f"journal write failed: {exc}"))
