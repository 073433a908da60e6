"""An add batch as the bookie takes it apart: groups per ledger, the body checks, the answers.

Pure parts of RequestProcessor.process_adds (spark_bookie.server.processor), which keeps only what
needs the storage, the journal and the lock. `accept_bodies` is the per-add loop every add runs
through; `check_body` states the same rules plainly and gives a rejected add its precise error.
tests/unit/test_add_checks.py checks with hypothesis that the two accept exactly the same adds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from typing import NamedTuple, cast

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER, HEADER_BYTES, FramingError, parse_header
from spark_bookie.errors import BadRequestError, BookieError
from spark_bookie.storage.journal import JournalRecord, RecordType

# (request ids now durable, answers for adds that failed): one call per batch.
Reply = Callable[[list[int], list[pb.AddResponse]], None]


class AddGroup(NamedTuple):
    """Adds of one ledger with one key and flag, column-wise (what pb.LedgerAdds carries)."""

    ledger_id: int
    flag: int
    master_key: bytes
    entry_ids: list[int]
    request_ids: list[int]
    bodies: list[bytes]
    lac_body: bytes = b""   # an announced explicit LAC (pb.LedgerAdds.lac_body; a group without entries)


def add_groups(batch: pb.AddBatch) -> list[AddGroup]:
    """The batch's adds as groups: packed LedgerAdds as they are, one-per-message adds grouped."""
    groups = [AddGroup(g.ledger_id, g.flag, g.master_key, list(g.entry_ids), list(g.request_ids), list(g.bodies),
                       g.lac_body)
              for g in batch.ledger_adds]
    singles: dict[tuple[int, int, bytes], AddGroup] = {}
    for a in batch.adds:
        k = (a.ledger_id, a.flag, a.master_key)
        g = singles.get(k)
        if g is None:
            g = singles[k] = AddGroup(a.ledger_id, a.flag, a.master_key, [], [], [])
            groups.append(g)
        g.entry_ids.append(a.entry_id)
        g.request_ids.append(a.request_id)
        g.bodies.append(a.body)
    return groups


def batch_size(batch: pb.AddBatch) -> int:
    """How many adds (request ids) a batch carries, in both forms: each gets exactly one answer."""
    return len(batch.adds) + sum(len(g.request_ids) for g in batch.ledger_adds)


def failure(ledger_id: int, entry_id: int, request_id: int, status: int, detail: str) -> pb.AddResponse:
    return pb.AddResponse(status=cast(pb.StatusCode, status), ledger_id=ledger_id, entry_id=entry_id,
                          request_id=request_id, detail=detail)


def group_failures(g: AddGroup, status: int, detail: str) -> list[pb.AddResponse]:
    """One answer per request id of the group (an add is a request id; a malformed group may have
    fewer entry ids, which are then reported as -1)."""
    eids = g.entry_ids
    return [failure(g.ledger_id, eids[i] if i < len(eids) else -1, rid, status, detail)
            for i, rid in enumerate(g.request_ids)]


def check_group_shape(g: AddGroup) -> None:
    """What holds for the whole group before its key and fencing are asked about."""
    if not len(g.entry_ids) == len(g.request_ids) == len(g.bodies):
        raise BadRequestError(f"ledger {g.ledger_id}: {len(g.entry_ids)} entry ids, {len(g.request_ids)} "
                              f"request ids and {len(g.bodies)} bodies do not line up")
    if g.ledger_id < 0:
        raise BadRequestError(f"ledger and entry ids must be >= 0 (got ledger {g.ledger_id})")


def check_body(lid: int, eid: int, body: bytes, size_max: int) -> int:
    """Validate one add before anything is written; returns the LAC its header piggybacks."""
    if eid < 0:
        raise BadRequestError(f"ledger and entry ids must be >= 0 (got {lid}/{eid})")
    if len(body) > size_max:
        raise BadRequestError(f"entry {lid}/{eid} is {len(body)} bytes, over the limit of "
                              f"{size_max} (entry_size_bytes_max)")
    try:
        hlid, heid, hlac, _length = parse_header(body)
    except FramingError as e:
        raise BadRequestError(str(e)) from e
    if hlid != lid or heid != eid:
        raise BadRequestError(f"body header names entry {hlid}/{heid}, request names {lid}/{eid}")
    return hlac


def accept_bodies(g: AddGroup, size_max: int, records: list[JournalRecord], ok_ids: list[int],
                  failures: list[pb.AddResponse]) -> tuple[list[tuple[int, bytes]], int]:
    """The group's adds whose bodies pass check_body: (their (entry id, body) to store, the highest
    LAC they piggyback, -2 if none); each one's journal record and request id are appended, each
    rejected one's answer too."""
    lid = g.ledger_id
    entries: list[tuple[int, bytes]] = []
    top_lac = -2
    add_record, add_ok, add_entry = records.append, ok_ids.append, entries.append
    # check_body's rules inlined for the adds that pass them (all but a bad client's): this loop
    # runs for every add, and the call, and building each record through NamedTuple's __new__,
    # were a third of it. An add that fails the fast test goes through check_body for its error.
    unpack, new_record, add = HEADER.unpack_from, tuple.__new__, RecordType.ADD
    for eid, rid, body in zip(g.entry_ids, g.request_ids, g.bodies, strict=True):
        if eid >= 0 and HEADER_BYTES <= len(body) <= size_max:
            hlid, heid, hlac, _length = unpack(body)
            fast = hlid == lid and heid == eid
        else:
            fast = False
        if not fast:
            try:
                hlac = check_body(lid, eid, body, size_max)
            except BookieError as e:
                failures.append(failure(lid, eid, rid, e.status, str(e)))
                continue
        add_entry((eid, body))
        add_record(new_record(JournalRecord, (add, lid, eid, body)))
        add_ok(rid)
        if hlac > top_lac:
            top_lac = hlac
    return entries, top_lac


class BatchAnswer:
    """One batch's answers: collected while it is applied, sent once its journal records are
    durable (or failed). `flush` (see process_adds) sends what `reply` collected."""

    __slots__ = ("groups", "reply", "flush", "loop", "failures", "records", "ok_ids", "refused", "flow")

    def __init__(self, groups: list[AddGroup], reply: Reply, flush: Callable[[], None] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.groups, self.reply, self.flush, self.loop = groups, reply, flush, loop
        self.failures: list[pb.AddResponse] = []
        self.records: list[JournalRecord] = []
        self.ok_ids: list[int] = []
        self.refused: dict[int, str] = {}  # ledger id -> why the caller may not add to it (tenants)
        self.flow: Hashable = None         # whose turn in the journal (server/admission.py)

    def finish(self, exc: BaseException | None) -> Callable[[], None] | None:
        """The journal's callback: every accepted add is durable, or (exc) none is."""
        if exc is not None:
            detail = f"journal write failed: {exc}"
            accepted = set(self.ok_ids)
            self.failures.extend(f for g in self.groups for f in group_failures(g, pb.EIO, detail)
                                 if f.request_id in accepted)
            self.reply([], self.failures)
            return self.flush
        self.reply(self.ok_ids, self.failures)
        return self.flush

    def finish_on_loop(self, exc: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self.finish, exc)

    def answer_now(self, failures: list[pb.AddResponse]) -> None:
        """Answer at once, nothing durable to wait for (`failures`: an answer for every add)."""
        self.reply([], failures)
        if self.flush is not None:
            self.flush()


class Countdown:
    """One journal callback for a batch split into several submits (one per ledger): ``done``
    runs once all of them completed, with the first error if any. ``abandon`` (the batch was
    answered otherwise) makes the rest complete silently."""

    __slots__ = ("done", "error", "left", "lock", "settled")

    def __init__(self, submits: int, done: Callable[[BaseException | None], Callable[[], None] | None]) -> None:
        self.left, self.done = submits, done
        self.error: BaseException | None = None
        self.settled = False
        self.lock = threading.Lock()

    def one(self, exc: BaseException | None) -> Callable[[], None] | None:
        with self.lock:
            if exc is not None and self.error is None:
                self.error = exc
            self.left -= 1
            if self.left or self.settled:
                return None
            self.settled = True
            error = self.error
        return self.done(error)

    def abandon(self) -> None:
        with self.lock:
            self.settled = True
