"""Ledger recovery on open: fence, find the last recoverable entry, rewrite it, close.

BookKeeper's LedgerRecoveryOp as its TLA+ model has it after apache/bookkeeper#2614:
1. mark the metadata IN_RECOVERY (CAS);
2. fence: read "entry -1" with the FENCE flag from every bookie of the last fragment until the
   answers cover every write set; the old writer can then no longer get an entry to Qa acks;
3. from max(LAC seen, first entry of the last fragment − 1) + 1 on, read each entry with the FENCE
   flag from its write set in the ensemble recovery started with: one valid copy → recoverable
   (rewritten to its whole write set of the current ensemble with RECOVERY adds); Qw − Qa + 1
   "no such entry" → the end; anything else → abort (never guess). The reads of the next
   `recovery_read_window_entries` entries are in flight at once (BookKeeper's
   recoveryReadBatchSize); outcomes are taken in entry order and the first end stops it, so
   what is decided is what one read at a time would decide (at ~2.7 ms per entry one at a time,
   a writer's 20,000 unconfirmed appends would take most of the 60 s operation timeout);
4. close by CAS at the last recovered entry. If another recovery closed it first, its answer is
   adopted, so parallel recoveries agree (invariant 4).

No step waits for a bookie whose answer is not needed: every read goes to all its bookies at once
and the machines decide from the answers in hand (fencing at coverage, an entry at its first copy
or at Qw − Qa + 1 "no such entry", the length at the first copy of the start entry), and the
rewrites complete at Qa acks. A bookie that is cut off or stopped costs nothing while the others
settle it; asking it first and waiting out its read timeout made such a recovery take ~10 s.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from metadata import LedgerMetadata, LedgerState, transitions

from . import errors
from .machines import QuorumCoverage, ReadOutcome, RecoveryReadTally, fence_start_point, write_set
from .protocol import bookkeeper_pb2 as pb
from .protocol.framing import Digester, FramingError, parse_header
from .transport.completion import as_completed
from .write_handle import WriteHandle

if TYPE_CHECKING:
    from .core import LedgerCore

log = logging.getLogger(__name__)


@dataclass
class _RecoveryRead:
    """One entry's fencing reads in flight and the tally of their answers."""

    entry_id: int
    tally: RecoveryReadTally
    futures: dict[int, grpc.Future] = field(default_factory=dict)


class LedgerRecovery:
    def __init__(self, client: LedgerCore, md: LedgerMetadata, digester: Digester, master_key: bytes) -> None:
        self._client = client
        self._lid = md.ledger_id
        self._md = md
        self._digester = digester
        self._key = master_key
        self._deadline = time.monotonic() + client.config.operation_timeout_ms / 1000

    def run(self) -> LedgerMetadata:
        md, self._version = self._client.update_metadata_versioned(self._lid, transitions.begin_recovery)
        if md.state is LedgerState.CLOSED:
            return md
        self._md = md
        start = self._fence()
        log.info("ledger %d: fenced; recovering from entry %d", self._lid, start + 1)
        try:
            return self._read_and_rewrite(start)
        except (errors.LedgerFencedError, errors.MetadataVersionError):
            latest = self._client.ledger_metadata(self._lid)
            if latest.state is LedgerState.CLOSED:
                return latest  # another recovery (or the writer) closed it first: agree with it
            raise

    # ------------------------------------------------------------------ fencing

    def _fence(self) -> int:
        md = self._md
        key = max(md.ensembles)
        bookies = md.ensembles[key]
        cov = QuorumCoverage(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
        futs: dict[int, grpc.Future] = {}
        for i, b in enumerate(bookies):
            try:
                futs[i] = self._client.pool.get(b).read_future(self._lid, -1, fence=True, master_key=self._key)
            except errors.LedgerError:
                pass
        lacs: list[int] = []
        for i, f in as_completed(futs, self._deadline):
            lac = self._fence_answer(bookies[i], f)
            if lac is None:
                continue
            lacs.append(lac)
            if cov.add(i):
                return fence_start_point(key, lacs)
        raise errors.BookieUnavailableError(
            f"ledger {self._lid}: could not fence enough bookies of {bookies} to recover safely")

    def _fence_answer(self, bookie: str, fut: grpc.Future) -> int | None:
        try:
            resp = fut.result()
        except grpc.RpcError as e:
            refused = self._client.pool.get(bookie).error_of(e)
            if isinstance(refused, errors.UnauthorizedAccessError):  # our token: no bookie will fence for us
                raise refused from e
            return None
        if resp.status == pb.EUA:
            raise errors.UnauthorizedAccessError(f"bookie {bookie} refused the master key of ledger {self._lid}")
        if resp.status in (pb.ENOENTRY, pb.ENOLEDGER):
            return -1
        if resp.status != pb.EOK:
            return None
        try:
            _lid, eid, _lac, _len = parse_header(resp.body)
            lac, _length, _data = self._digester.unframe(resp.body, self._lid, eid)
        except FramingError:
            return None  # a corrupt copy proves nothing
        return lac

    # ------------------------------------------------------------------ read and rewrite

    def _entry_length(self, entry_id: int) -> int:
        """The ledger's cumulative length at `entry_id` (a confirmed entry), from the header of the
        first valid copy any bookie of its write set returns: all are asked at once, so a bookie
        that does not answer costs nothing while another has a copy."""
        if entry_id < 0:
            return 0
        _outcome, copy = self._finish_read(self._start_read(self._md, entry_id, confirmed=True))
        if copy is None:
            raise errors.ReadError(f"ledger {self._lid}: cannot read entry {entry_id} to learn its length")
        return copy[0]

    def _read_and_rewrite(self, start: int) -> LedgerMetadata:
        writer = WriteHandle(self._client, self._md, self._digester, self._key,
                             recovery=True, last_add_confirmed=start, length=self._entry_length(start))
        self._client.watch_writer(writer)  # add timeouts apply to recovery's rewrites too
        recovery_md = self._md  # reads go to the ensembles recovery started with (TLA+ model)
        window = self._client.config.recovery_read_window_entries
        reads: deque[_RecoveryRead] = deque()
        pending: list[Future[int]] = []
        e = start + 1
        try:
            while True:
                while len(reads) < window:  # the next entries' reads go out while this one's answer comes
                    reads.append(self._start_read(recovery_md, e + len(reads)))
                outcome, copy = self._finish_read(reads.popleft())
                if outcome is ReadOutcome.ABSENT:
                    break
                if outcome is not ReadOutcome.FOUND or copy is None:
                    raise errors.ReadError(f"ledger {self._lid}: cannot tell whether entry {e} exists "
                                           "(too many bookies unreachable); recovery aborted")
                pending.append(writer.append_async(copy[1]))
                e += 1
        finally:
            for r in reads:  # reads past the end: their answers no longer matter
                for f in r.futures.values():
                    f.cancel()
        try:
            for f in pending:
                f.result(timeout=max(1.0, self._deadline - time.monotonic()))
            writer.end_changes()   # a late failure of a rewrite must not start an ensemble change
            md, lac, length = writer.metadata, writer.last_add_confirmed, writer.length
            log.info("ledger %d: recovered up to entry %d (%d rewritten)", self._lid, e - 1, len(pending))
            closed = self._close(md, lac, length)
        except BaseException:
            self._client.forget_writer(writer)
            writer.abandon()
            raise
        # Bookies of a write set that missed rewrites (failed, or replaced meanwhile) make the
        # ledger under-replicated now that it is closed; the client's ticker watches the slower
        # ones until they acknowledge theirs (ledger_client/debts.py).
        writer.closed_with_debts()
        return closed

    def _close(self, local: LedgerMetadata, last_entry_id: int, length: int) -> LedgerMetadata:
        """Publish the recovery's fragments and its end in one CAS on the version recovery began
        with (the TLA+ model's rule): any other change meanwhile means another party decided —
        except re-replication swapping bookies in earlier fragments, which is rebased over."""
        began, version = self._md, self._version
        for _ in range(self._client.config.metadata_retries_max + 1):
            final = transitions.close(local, last_entry_id, length)
            try:
                self._client.replace_metadata(final, version)
                return final
            except errors.MetadataVersionError:
                latest, version = self._client.ledger_metadata_versioned(self._lid)
                rebased = transitions.rebase_recovery(began, latest, local)
                if rebased is None:
                    raise
                log.info("ledger %d: earlier fragments were re-replicated during recovery; closing on the "
                         "new version", self._lid)
                began, local = latest, rebased
        raise errors.MetadataVersionError(f"ledger {self._lid}: recovery close kept losing races")

    def _start_read(self, md: LedgerMetadata, entry_id: int, *, confirmed: bool = False) -> _RecoveryRead:
        """Send the read of `entry_id` to its whole write set at once (see _finish_read): fencing
        reads of the entries that may follow the end, a plain read of a `confirmed` one."""
        bookies = md.ensemble_at(entry_id)
        read = _RecoveryRead(entry_id, RecoveryReadTally(entry_id, md.ensemble_size, md.write_quorum_size,
                                                         md.ack_quorum_size, confirmed=confirmed))
        for i in write_set(entry_id, md.ensemble_size, md.write_quorum_size):
            try:
                read.futures[i] = self._client.pool.get(bookies[i]).read_future(
                    self._lid, entry_id, fence=not confirmed, master_key=self._key)
            except errors.LedgerError:
                read.tally.on_error(i)
        return read

    def _finish_read(self, read: _RecoveryRead) -> tuple[ReadOutcome, tuple[int, bytes] | None]:
        """The entry's outcome from its answers, in the order they come, as soon as the tally can
        tell (a silent bookie is not waited for once the others settle it); (FOUND, (its
        cumulative length, its data)) on the first valid copy. After a copy the other reads run
        on (their fence still lands on slow bookies); otherwise they are cancelled."""
        entry_id, tally, futs = read.entry_id, read.tally, read.futures
        outcome = tally.on_error(-1)  # evaluate (no-op index)
        answers = as_completed(futs, self._deadline)
        while outcome is ReadOutcome.PENDING and (done := next(answers, None)) is not None:
            i, f = done
            try:
                resp = f.result()
            except grpc.RpcError:
                outcome = tally.on_error(i)
                continue
            if resp.status == pb.EOK:
                try:
                    _lac, length, data = self._digester.unframe(resp.body, self._lid, entry_id)
                except FramingError:
                    outcome = tally.on_error(i)
                    continue
                return tally.on_found(i), (length, data)
            if resp.status == pb.EUA:
                raise errors.UnauthorizedAccessError(f"ledger {self._lid}: wrong master key")
            outcome = tally.on_absent(i) if resp.status in (pb.ENOENTRY, pb.ENOLEDGER) else tally.on_error(i)
        for f in futs.values():
            f.cancel()
        return outcome, None
