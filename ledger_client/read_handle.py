"""Reading a ledger: failover between replicas, speculative reads, range reads, LAC, tailing.

Every entry's digest is checked; a replica whose copy fails it is skipped, never returned. An
open ledger's fragments can change under a reader (the writer's ensemble changes), so a read that
finds nothing refreshes the metadata once before giving up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from metadata import LedgerMetadata, LedgerState

from . import errors
from .entry import LedgerEntry
from .listed_read import read_striped
from .machines import QuorumCoverage, write_set
from .protocol import bookkeeper_pb2 as pb
from .protocol.framing import Digester, FramingError, parse_header
from .transport import status_error
from .transport.completion import as_completed

if TYPE_CHECKING:
    import pyarrow as pa

    from .config import ClientConfig
    from .core import LedgerCore
    from .metrics import ClientMetrics
    from .transport import BookieClient


class _FirstValid:
    """Staggered reads of one entry from its replicas: the first copy that passes its digest wins."""

    def __init__(self, handle: ReadHandle, entry_id: int) -> None:
        self.h, self.entry_id = handle, entry_id
        self.cond = threading.Condition()
        self.result: LedgerEntry | None = None
        self.errors: list[errors.LedgerError] = []
        self.launched = 0

    def launch(self, bookie: str) -> None:
        self.launched += 1
        try:
            fut = self.h._client.pool.get(bookie).read_future(self.h.ledger_id, self.entry_id)
        except errors.LedgerError as e:
            self._finish(None, e)
            return
        fut.add_done_callback(lambda f, b=bookie: self._done(b, f))

    def _done(self, bookie: str, fut: grpc.Future) -> None:
        try:
            resp = fut.result()
        except grpc.RpcError as e:
            self._finish(None, self.h._client.pool.get(bookie).error_of(e))
            return
        if resp.status != pb.EOK:
            self._finish(None, status_error(resp.status, resp.detail, f"read {self.h.ledger_id}/"
                                            f"{self.entry_id} from {bookie}"))
            return
        try:
            self._finish(self.h.decode(self.entry_id, resp.body), None)
        except errors.DigestMismatchError as e:
            self._finish(None, e)

    def _finish(self, entry: LedgerEntry | None, err: errors.LedgerError | None) -> None:
        with self.cond:
            if entry is not None and self.result is None:
                self.result = entry
            if err is not None:
                self.errors.append(err)
            self.cond.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """True once there is a result or every launched read has failed."""
        with self.cond:
            return self.cond.wait_for(
                lambda: self.result is not None or len(self.errors) >= self.launched, timeout_s)

    def error(self) -> errors.LedgerError:
        if self.errors and all(isinstance(e, (errors.NoSuchEntryError, errors.NoSuchLedgerError))
                               for e in self.errors):
            return errors.NoSuchEntryError(f"entry {self.h.ledger_id}/{self.entry_id} is on no replica")
        if self.errors and all(isinstance(e, errors.UnauthorizedAccessError) for e in self.errors):
            return errors.UnauthorizedAccessError(f"entry {self.h.ledger_id}/{self.entry_id}: every bookie "
                                                  f"refused our credentials ({self.errors[0]})")
        if any(isinstance(e, errors.DigestMismatchError) for e in self.errors):
            return errors.DigestMismatchError(f"entry {self.h.ledger_id}/{self.entry_id}: every readable "
                                              f"replica failed its digest ({self.errors})")
        return errors.ReadError(f"entry {self.h.ledger_id}/{self.entry_id} unreadable: {self.errors}")


class ReadHandle:
    """A reader of one ledger (opened with or without recovery). Thread-safe."""

    def __init__(self, client: LedgerCore, md: LedgerMetadata, digester: Digester,
                 last_add_confirmed: int | None = None) -> None:
        self._client = client
        self.ledger_id = md.ledger_id
        self._md = md
        self._digester = digester
        self._lac = md.last_entry_id if md.state is LedgerState.CLOSED else (
            -1 if last_add_confirmed is None else last_add_confirmed)
        self._lock = threading.Lock()
        self._rotate = 0
        self._known_length = (-1, 0)   # (entry id, the ledger's length through it): the highest confirmed read

    # ------------------------------------------------------------------ state

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._md.state is LedgerState.CLOSED

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        """The closed ledger's length; for one still being written, its length through the highest
        confirmed entry this handle has read (each entry's framing header carries the ledger's
        length through it, as BookKeeper's does): what a reader knows of a growing ledger."""
        return self._md.length if self.is_closed else self._known_length[1]

    @property
    def known_length(self) -> tuple[int, int]:
        """(entry id, the ledger's length through it) of the highest confirmed entry this handle
        has read (-1, 0 before any): how a subscription learns the bytes up to its position from
        the one entry it reads (stream/subscriptions.py)."""
        return self._known_length

    def _advance_lac(self, lac: int) -> int:
        with self._lock:
            if lac > self._lac:
                self._lac = lac
            return self._lac

    def refresh_metadata(self) -> LedgerMetadata:
        md = self._client.ledger_metadata(self.ledger_id)
        self._md = md
        if md.state is LedgerState.CLOSED:
            self._advance_lac(md.last_entry_id)
        return md

    # ---- for ledger_client.arrow (same package; the scan reuses this handle's replicas and failover)

    @property
    def digester(self) -> Digester:
        return self._digester

    @property
    def metrics(self) -> ClientMetrics | None:
        return self._client.metrics

    @property
    def client_config(self) -> ClientConfig:
        return self._client.config

    def bookie(self, bookie_id: str) -> BookieClient:
        return self._client.pool.get(bookie_id)

    def next_rotation(self) -> int:
        """Which replica a range read starts at: rotates so repeated scans spread over replicas."""
        with self._lock:
            self._rotate += 1
            return self._rotate

    def entry_reads(self, first: int, last: int, bookies: list[str]) -> list[LedgerEntry]:
        """Per-entry reads with speculative failover over one fragment's `bookies`."""
        return self._entry_reads(first, last, bookies)

    def decode(self, entry_id: int, body: bytes) -> LedgerEntry:
        try:
            _lac, length, data = self._digester.unframe(body, self.ledger_id, entry_id)
        except FramingError as e:
            raise errors.DigestMismatchError(str(e)) from e
        if self._known_length[0] < entry_id <= self._lac:
            with self._lock:
                if self._known_length[0] < entry_id:
                    self._known_length = (entry_id, length)
        return LedgerEntry(self.ledger_id, entry_id, data)

    # ------------------------------------------------------------------ entries

    def _check_range(self, first: int, last: int) -> None:
        if not (isinstance(first, int) and isinstance(last, int)) or first < 0 or last < first:
            raise errors.IncorrectParameterError(f"bad entry range [{first}, {last}]")

    def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries first..last (inclusive); last must not pass the LAC."""
        self._check_range(first, last)
        if last > self._lac:
            raise errors.IncorrectParameterError(
                f"entry {last} of ledger {self.ledger_id} is past the last add confirmed ({self._lac}); "
                "use read_unconfirmed() or read_last_add_confirmed() first")
        return self._timed_read(first, last)

    def _timed_read(self, first: int, last: int) -> list[LedgerEntry]:
        metrics = self._client.metrics
        if metrics is None:
            return self._read(first, last)
        started = time.monotonic()
        try:
            return self._read(first, last)
        finally:
            metrics.read_latency.observe(time.monotonic() - started)

    def read_arrow(self, first: int, last: int) -> pa.RecordBatch:
        """Entries first..last as one Arrow batch (ledger_id int64, entry_id int64, payload binary).

        Same rules as read() (last <= LAC, digests checked, failover); built from batched range
        reads without a Python object per entry (ledger_client.arrow). An empty range
        (last == first - 1, e.g. 0..LAC of an empty ledger) gives an empty batch.
        """
        # Imported here: pyarrow is needed only by Arrow reads, and the bookie hosting job runs
        # where it is not installed (the Spark 3.5 path: tests/spark/test_bookie_cluster.py).
        from . import arrow

        if last == first - 1 and isinstance(first, int) and first >= 0:
            return arrow.read_arrow(self, first, last)
        self._check_range(first, last)
        if last > self._lac:
            raise errors.IncorrectParameterError(
                f"entry {last} of ledger {self.ledger_id} is past the last add confirmed ({self._lac}); "
                "use read_last_add_confirmed() first")
        return arrow.read_arrow(self, first, last)

    def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries that may not be confirmed yet (BookKeeper's readUnconfirmedEntries)."""
        self._check_range(first, last)
        return self._timed_read(first, last)

    def _read(self, first: int, last: int) -> list[LedgerEntry]:
        try:
            return self._read_fragments(first, last)
        except errors.NoSuchEntryError:
            if self.is_closed:
                raise
            self.refresh_metadata()  # an ensemble change may have moved newer entries
            return self._read_fragments(first, last)

    def _read_fragments(self, first: int, last: int) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        e = first
        md = self._md
        keys = sorted(md.ensembles)
        while e <= last:
            k = max(key for key in keys if key <= e)
            nxt = [key for key in keys if key > k]
            end = min(last, nxt[0] - 1) if nxt else last
            bookies = md.ensembles[k]
            if md.ensemble_size == md.write_quorum_size:
                out += self._range_read(e, end, bookies)
            elif e == end:  # one entry of a striped fragment: from its write set, header and all
                out += self._entry_reads(e, end, bookies)
            else:
                lid = self.ledger_id
                out += [LedgerEntry(lid, e + i, p) for i, p in enumerate(read_striped(self, e, end, bookies))]
            e = end + 1
        return out

    def _range_read(self, first: int, last: int, bookies: list[str]) -> list[LedgerEntry]:
        """Every bookie of the fragment has every entry: page through one, fail over to the next."""
        out: list[LedgerEntry] = []
        cfg = self._client.config
        self._rotate += 1
        order = bookies[self._rotate % len(bookies):] + bookies[:self._rotate % len(bookies)]
        e = first
        for bookie in order:
            while e <= last:
                stop = min(last, e + cfg.read_batch_entries_max - 1)
                try:
                    resp = self._client.pool.get(bookie).read_range(self.ledger_id, e, stop, cfg.read_batch_bytes_max)
                except errors.LedgerError:
                    break
                if resp.status != pb.EOK or not resp.bodies:
                    break
                try:
                    got = [self.decode(e + i, b) for i, b in enumerate(resp.bodies)]
                except errors.DigestMismatchError:
                    break  # this replica is corrupt here: the per-entry path below sorts it out
                out += got
                e += len(got)
            if e > last:
                return out
        return out + self._entry_reads(e, last, bookies)

    def _entry_reads(self, first: int, last: int, bookies: list[str], window: int = 64) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        for start in range(first, last + 1, window):
            readers = [self._start_read(e, bookies) for e in range(start, min(last, start + window - 1) + 1)]
            out += [self._finish_read(r, bookies) for r in readers]
        return out

    def _replicas(self, entry_id: int, bookies: list[str]) -> list[str]:
        md = self._md
        return [bookies[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum_size)]

    def _start_read(self, entry_id: int, bookies: list[str]) -> _FirstValid:
        r = _FirstValid(self, entry_id)
        r.launch(self._replicas(entry_id, bookies)[0])
        return r

    def _finish_read(self, r: _FirstValid, bookies: list[str]) -> LedgerEntry:
        cfg = self._client.config
        replicas = self._replicas(r.entry_id, bookies)
        deadline = time.monotonic() + cfg.read_timeout_ms / 1000 * len(replicas)
        for nxt in replicas[1:]:
            r.wait(cfg.speculative_read_timeout_ms / 1000)  # slow or failed: ask the next replica too
            if r.result is not None:
                return r.result
            r.launch(nxt)
            if self._client.metrics is not None:
                self._client.metrics.speculative_reads.inc()
        while r.result is None and len(r.errors) < r.launched and time.monotonic() < deadline:
            r.wait(0.1)
        if r.result is not None:
            return r.result
        raise r.error()

    # ------------------------------------------------------------------ LAC

    def _lac_answers(self, first_only: bool) -> int:
        md = self._md
        bookies = md.ensembles[max(md.ensembles)]
        cov = QuorumCoverage(md.ensemble_size, md.write_quorum_size, md.ack_quorum_size)
        futs = {}
        for i, b in enumerate(bookies):
            try:
                futs[i] = self._client.pool.get(b).read_lac_future(self.ledger_id)
            except errors.LedgerError:
                pass
        best = -1
        deadline = time.monotonic() + self._client.config.read_timeout_ms / 1000
        for i, f in as_completed(futs, deadline):
            lac = self._lac_of(f)
            if lac is None:
                continue
            best = max(best, lac)
            if cov.add(i) or first_only:
                return best
        raise errors.BookieUnavailableError(
            f"ledger {self.ledger_id}: too few bookies of {bookies} answered the LAC read")

    def _lac_of(self, fut: grpc.Future) -> int | None:
        """The LAC one ReadLac answer proves (None: no definitive answer)."""
        try:
            resp = fut.result()
        except grpc.RpcError:
            return None
        if resp.status in (pb.ENOLEDGER, pb.ENOENTRY):
            return -1
        if resp.status != pb.EOK:
            return None
        lac = -1
        try:
            if resp.lac_body:
                lac = self._digester.unframe_lac(resp.lac_body, self.ledger_id)
            if resp.last_entry_body:
                lid, eid, _piggy, _len = parse_header(resp.last_entry_body)
                entry_lac, _l, _d = self._digester.unframe(resp.last_entry_body, self.ledger_id, eid)
                lac = max(lac, entry_lac)
        except FramingError:
            return None
        return lac

    def read_last_add_confirmed(self) -> int:
        """The LAC, from answers that cover every write set of the last fragment."""
        if self.is_closed:
            return self._lac
        return self._advance_lac(self._lac_answers(first_only=False))

    def try_read_last_add_confirmed(self) -> int:
        """The LAC from the first bookie that answers (may lag the quorum-covered one)."""
        if self.is_closed:
            return self._lac
        return self._advance_lac(self._lac_answers(first_only=True))

    def read_last_add_confirmed_and_entry(self, entry_id: int, timeout_ms: int) -> tuple[int, LedgerEntry | None]:
        """Long poll: wait up to timeout_ms for the LAC to reach entry_id; return (lac, entry or None)."""
        if entry_id <= self._lac:
            return self._lac, self._read(entry_id, entry_id)[0]
        if self.is_closed:
            return self._lac, None
        md = self._md
        bookies = md.ensembles[max(md.ensembles)]
        polls = []
        for b in bookies:
            try:
                polls.append(self._client.pool.get(b).read_future(
                    self.ledger_id, entry_id, previous_lac=self._lac, long_poll_timeout_ms=timeout_ms,
                    piggyback=True))
            except errors.LedgerError:
                pass
        entry = self._await_poll(polls, entry_id, time.monotonic() + timeout_ms / 1000 + 1)
        for p in polls:
            p.cancel()
        if entry is None and entry_id <= self._lac:
            entry = self._read(entry_id, entry_id)[0]
        return self._lac, entry

    def poll_entries(self, first: int, last: int, timeout_ms: int,
                     cancel: threading.Event | None = None) -> list[LedgerEntry]:
        """Long poll for a tail: entries first..last confirmed so far, waiting up to ``timeout_ms``
        for the LAC to reach ``first``; [] if it did not. One range read on one bookie of the
        write set (the next one if it fails): everything confirmed since the last poll comes back
        in one answer, so a reader polls once per batch, not once per entry. ``cancel``: set, the
        poll gives up within POLL_CANCEL_CHECK_S and returns [] (a reader being closed)."""
        if first <= self._lac:
            return self._read(first, min(last, self._lac))
        if self.is_closed:
            return []
        md, cfg = self._md, self._client.config
        replicas = self._replicas(first, md.ensembles[max(md.ensembles)])
        start = self.next_rotation()
        deadline = time.monotonic() + timeout_ms / 1000 + cfg.read_timeout_ms / 1000
        refusals: list[str] = []
        for k in range(len(replicas)):
            b = replicas[(start + k) % len(replicas)]
            try:
                fut = self._client.pool.get(b).poll_range_future(self.ledger_id, first, last, first - 1, timeout_ms,
                                                                 cfg.read_batch_bytes_max)
                resp = _poll_result(fut, deadline, cancel)
            except (errors.LedgerError, grpc.RpcError, TimeoutError, grpc.FutureTimeoutError):
                continue
            if resp is None:
                return []
            if resp.status == pb.EUA:
                refusals.append(f"{b}: {resp.detail}")
            if resp.status != pb.EOK:
                continue
            self._advance_lac(resp.lac)
            try:
                return [self.decode(first + i, b) for i, b in enumerate(resp.bodies)]
            except errors.DigestMismatchError:
                continue
        if refusals and len(refusals) == len(replicas):   # a grant revoked: no bookie will serve us
            raise errors.UnauthorizedAccessError(f"ledger {self.ledger_id}: every bookie refused the poll "
                                                 f"({refusals[0]})")
        return []

    def _await_poll(self, polls: list[grpc.Future], entry_id: int, deadline: float) -> LedgerEntry | None:
        for _i, f in as_completed(dict(enumerate(polls)), deadline):
            try:
                resp = f.result()
            except (grpc.RpcError, grpc.FutureCancelledError):
                continue
            if resp.status != pb.EOK or resp.max_lac <= self._lac:
                continue
            self._advance_lac(resp.max_lac)
            if resp.body and entry_id <= resp.max_lac:
                try:
                    return self.decode(entry_id, resp.body)
                except errors.DigestMismatchError:
                    return None
            return None
        return None

    def tail(self, start_entry_id: int = 0, timeout_ms: int | None = None) -> Iterator[LedgerEntry]:
        """Follow the ledger: yield entries from start_entry_id as they are confirmed.

        Ends when the ledger is closed and fully read, or when no new entry arrives for timeout_ms
        (None: wait for as long as the ledger stays open).
        """
        nxt = start_entry_id
        idle_since = time.monotonic()
        batch = self._client.config.read_batch_entries_max
        while True:
            if nxt <= self._lac:
                for entry in self._read(nxt, min(self._lac, nxt + batch - 1)):
                    yield entry
                    nxt = entry.entry_id + 1
                idle_since = time.monotonic()
                continue
            if self.is_closed:
                return
            left = None if timeout_ms is None else timeout_ms / 1000 - (time.monotonic() - idle_since)
            if left is not None and left <= 0:
                return
            poll_ms = 1000 if left is None else max(1, min(1000, int(left * 1000)))
            _lac, polled = self.read_last_add_confirmed_and_entry(nxt, poll_ms)
            if polled is not None:
                yield polled
                nxt += 1
                idle_since = time.monotonic()
            elif self._lac < nxt:
                self.refresh_metadata()  # closed, or moved to a new ensemble?


POLL_CANCEL_CHECK_S = 0.02   # how often a cancellable long poll looks at its cancel event


def _poll_result(fut: Any, deadline: float, cancel: threading.Event | None) -> Any:
    """A long poll's answer by ``deadline``; None once ``cancel`` is set (the poll is cancelled)."""
    if cancel is None:
        return fut.result(timeout=max(0.001, deadline - time.monotonic()))
    while True:
        left = deadline - time.monotonic()
        try:
            return fut.result(timeout=max(0.001, min(left, POLL_CANCEL_CHECK_S)))
        except (TimeoutError, grpc.FutureTimeoutError):
            if cancel.is_set():
                fut.cancel()
                return None
            if left <= POLL_CANCEL_CHECK_S:
                raise
