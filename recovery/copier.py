"""Copying a fragment's entries to new bookies: many reads in flight, batched RECOVERY adds.

The bodies are copied exactly as stored (header + the writer's digest + payload), so a reader
checks the same digest on the new copy as on the old. Each body is checked before it is written:
its header must name the entry asked for and, for digests that need no password (CRC32, CRC32C,
DUMMY), the digest must match; a copy that fails is read from the next source instead. HMAC
digests are keyed by the ledger's password, which the metadata does not hold (only its hash, the
master key), so for HMAC ledgers only the header is checked and readers still verify the digest.

Throughput: each run is one listed read (ReadRange with entry ids) of up to
``copy_range_entries_max`` entries that share their sources: a whole E == Qw fragment in a few
reads, a striped E > Qw fragment in one read per surviving source (its entries on one bookie are
not consecutive). Up to ``copy_reads_in_flight_max`` reads are in flight; adds go on each target's
batching add stream with ``RECOVERY_ADD`` (accepted even if the ledger is fenced), in bursts of up
to ``copy_add_burst_bytes_max`` (a burst leaves as one stream message and one journal commit),
bounded by ``copy_bytes_in_flight_max`` bytes read but not yet acknowledged. Both the reads and
the adds travel on the bookies' TCP port (ClientConfig's read and add transports; gRPC if set):
on gRPC the copies' reads cost the workers and the bookies over a quarter more CPU, and a
re-replication is bound by CPU, not by the disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import grpc

from ledger_client import errors
from ledger_client.bookies import BookiePool
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, FramingError, parse_header
from metadata import DigestType, LedgerMetadata

from .config import AutoRecoveryConfig
from .errors import FragmentUnrecoverableError, ReplicationError
from .plan import CopyRun

log = logging.getLogger(__name__)

_ABSENT = (pb.ENOENTRY, pb.ENOLEDGER)


@dataclass(frozen=True)
class CopyStats:
    entries: int   # entry copies written (an entry sent to two targets counts twice)
    bytes: int     # body bytes written


class _Acks:
    """Add results of one copy (an AddSink): what is still unacknowledged, and the first failure."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: dict[tuple[str, int], int] = {}
        self.bytes_pending = 0
        self.error: str | None = None
        self.last_progress = time.monotonic()

    def expect(self, bookie: str, entry_id: int, size: int) -> None:
        with self.cond:
            self.pending[(bookie, entry_id)] = size
            self.bytes_pending += size

    def on_add_results(self, bookie: str, ok: list[int], failed: list[tuple[int, int, str]]) -> None:
        with self.cond:
            for eid in ok:
                self.bytes_pending -= self.pending.pop((bookie, eid), 0)
            for eid, status, detail in failed:
                self.pending.pop((bookie, eid), None)
                if self.error is None:
                    name = pb.StatusCode.Name(status) if status in pb.StatusCode.values() else "TRANSPORT"
                    self.error = f"recovery add of entry {eid} on {bookie} failed: {name} {detail}"
            self.last_progress = time.monotonic()
            self.cond.notify_all()

    def wait_below(self, limit_bytes: int, stall_s: float) -> None:
        """Block until at most ``limit_bytes`` are unacknowledged; ReplicationError on a failed add
        or when nothing was acknowledged for ``stall_s``."""
        with self.cond:
            while True:
                if self.error is not None:
                    raise ReplicationError(self.error)
                if self.bytes_pending <= limit_bytes and (limit_bytes > 0 or not self.pending):
                    return
                if time.monotonic() - self.last_progress > stall_s:
                    raise ReplicationError(f"no add acknowledged for {stall_s:.0f}s; "
                                           f"{len(self.pending)} copies outstanding")
                self.cond.wait(0.1)


class _Verifier:
    def __init__(self, md: LedgerMetadata) -> None:
        self.lid = md.ledger_id
        self.digester = Digester(md.digest_type, b"") if md.digest_type is not DigestType.HMAC else None

    def check(self, entry_id: int, body: bytes) -> None:
        if self.digester is not None:
            self.digester.unframe(body, self.lid, entry_id)
            return
        lid, eid, _lac, _len = parse_header(body)
        if lid != self.lid or eid != entry_id:
            raise FramingError(f"body is entry {lid}/{eid}, expected {self.lid}/{entry_id}")


_Read = tuple[CopyRun, int, Any]   # (run, index of the source asked, its future)


class _AddBurst:
    """Verified bodies waiting to be sent, per target. Sent together, a target's adds leave in one
    stream message (its sender drains whatever is queued): a message per entry or two cost both
    sides two to three times the CPU per add of a message per ledger, and a journal commit each."""

    def __init__(self, pool: BookiePool, md: LedgerMetadata, acks: _Acks) -> None:
        self._pool = pool
        self._lid = md.ledger_id
        self._key = md.password_hash
        self._acks = acks
        self._queued: dict[str, list[tuple[int, bytes]]] = {}
        self.bytes = 0
        self.copies = 0
        self.written = 0

    def add(self, targets: tuple[str, ...], entry_id: int, body: bytes) -> None:
        for target in targets:
            self._queued.setdefault(target, []).append((entry_id, body))
            self.bytes += len(body)

    def send(self) -> None:
        queued, self._queued = self._queued, {}
        self.bytes = 0
        for target, items in queued.items():
            client = self._pool.get(target)
            for eid, body in items:
                self._acks.expect(target, eid, len(body))
                try:
                    client.add_async(self._lid, eid, self._key, body, self._acks, recovery=True)
                except errors.LedgerError as e:
                    raise ReplicationError(f"cannot send entry {eid} to {target}: {e}") from e
                self.copies += 1
                self.written += len(body)


class FragmentCopier:
    """Copies runs of entries of one ledger at a time; thread-safe (one instance per worker)."""

    def __init__(self, pool: BookiePool, config: AutoRecoveryConfig) -> None:
        self._pool = pool
        self._cfg = config

    def copy(self, md: LedgerMetadata, runs: list[CopyRun], cancel: threading.Event | None = None) -> CopyStats:
        """Copy every run; returns what was written once every target acknowledged it durably.
        ReplicationError as soon as ``cancel`` is set (the worker is stopping)."""
        cfg = self._cfg
        stall_s = cfg.copy_stall_timeout_ms / 1000
        acks = _Acks()
        verifier = _Verifier(md)
        adds = _AddBurst(self._pool, md, acks)
        todo: deque[tuple[CopyRun, int]] = deque((run, 0) for run in runs)
        inflight: deque[_Read] = deque()
        absent: Counter[int] = Counter()   # entry id → sources that said they do not have it
        while todo or inflight:
            if cancel is not None and cancel.is_set():
                raise ReplicationError(f"ledger {md.ledger_id}: copy cancelled (stopping)")
            while todo and len(inflight) < cfg.copy_reads_in_flight_max \
                    and acks.bytes_pending + adds.bytes < cfg.copy_bytes_in_flight_max:
                run, si = todo.popleft()
                inflight.append((run, si, self._launch(md.ledger_id, run, si)))
            if not inflight:
                adds.send()
                acks.wait_below(cfg.copy_bytes_in_flight_max - 1, stall_s)
                continue
            run, si, fut = inflight.popleft()
            got, why = self._answer(run, si, fut, stall_s)
            if why:
                if why == "absent":
                    absent.update(run.entry_ids)
                self._elsewhere(md, run, run.entry_ids, si, todo, absent, why)
                continue
            good = self._verified(verifier, run, si, got)
            for eid, body in good:
                adds.add(run.targets, eid, body)
            later, missing, bad = _split(run.entry_ids, [eid for eid, _ in got], len(good))
            absent.update(missing)
            if later:   # cut short by the byte limit (or after a bad copy): go on from the same source
                todo.appendleft((replace(run, entry_ids=later), si))
            if missing or bad:
                why = "absent" if missing else f"every copy of entry {bad[0]} failed its check"
                self._elsewhere(md, run, tuple(sorted(missing + bad)), si, todo, absent, why)
            if adds.bytes >= cfg.copy_add_burst_bytes_max or not inflight:
                adds.send()
        adds.send()
        acks.wait_below(0, stall_s)
        return CopyStats(adds.copies, adds.written)

    # ------------------------------------------------------------------ reads

    def _launch(self, ledger_id: int, run: CopyRun, si: int) -> Any:
        client = self._pool.get(run.sources[si])
        return client.read_entries_future(ledger_id, list(run.entry_ids), self._cfg.copy_range_bytes_max)

    def _answer(self, run: CopyRun, si: int, fut: Any, stall_s: float) -> tuple[list[tuple[int, bytes]], str]:
        """The (entry id, body) pairs a read returned; ([], reason) when it returned nothing:
        "absent" when the source holds none of them, else an error text."""
        source = run.sources[si]
        try:
            resp = fut.result(timeout=stall_s)
        except (grpc.RpcError, grpc.FutureTimeoutError, errors.LedgerError, TimeoutError) as e:
            log.debug("read of %d entries from %d on %s failed: %s", run.entries, run.first, source, e)
            return [], f"{source}: {e}"
        if resp.status in _ABSENT:
            return [], "absent"
        if resp.status != pb.EOK:
            return [], f"{source}: {pb.StatusCode.Name(resp.status)} {resp.detail}"
        ids = list(resp.entry_ids)
        asked = set(run.entry_ids)
        if not ids or len(ids) != len(resp.bodies) or not asked.issuperset(ids) \
                or any(b <= a for a, b in pairwise(ids)):
            return [], f"{source}: malformed answer ({len(ids)} ids for {len(resp.bodies)} bodies)"
        return list(zip(ids, resp.bodies, strict=True)), ""

    def _verified(self, verifier: _Verifier, run: CopyRun, si: int,
                  got: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """The prefix of ``got`` that passes its check (a bad copy ends the prefix)."""
        good: list[tuple[int, bytes]] = []
        for eid, body in got:
            try:
                verifier.check(eid, body)
            except FramingError as e:
                log.warning("ledger %d entry %d from %s failed its check (%s); reading another copy",
                            verifier.lid, eid, run.sources[si], e)
                break
            good.append((eid, body))
        return good

    @staticmethod
    def _elsewhere(md: LedgerMetadata, run: CopyRun, ids: tuple[int, ...], si: int,
                   todo: deque[tuple[CopyRun, int]], absent: Counter[int], why: str) -> None:
        """Entries source ``si`` could not give: ask the next source, or give up when none is left."""
        if si + 1 < len(run.sources):
            todo.appendleft((replace(run, entry_ids=ids), si + 1))
            return
        lost = [e for e in ids if absent[e] >= len(run.sources)]
        if lost:
            raise FragmentUnrecoverableError(
                f"ledger {md.ledger_id} entry {lost[0]}: no surviving copy (asked {list(run.sources)})")
        raise ReplicationError(f"ledger {md.ledger_id} entry {ids[0]}: no source answered ({why})")


def _split(asked: tuple[int, ...], returned: list[int], good: int) -> tuple[tuple[int, ...], list[int], list[int]]:
    """After a listed read that returned ``returned`` (a prefix of ``asked`` minus what the source
    lacks) of which the first ``good`` passed their check: (ids to read again from the same source,
    ids it does not hold, the id whose copy failed its check, if any)."""
    top = returned[-1]
    got = set(returned)
    missing = [e for e in asked if e < top and e not in got]
    if good < len(returned):
        bad = [returned[good]]
        later = tuple(returned[good + 1:]) + tuple(e for e in asked if e > top)
    else:
        bad = []
        later = tuple(e for e in asked if e > top)
    return later, missing, bad
