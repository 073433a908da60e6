"""Reading a striped fragment (E > Qw) with listed reads to every bookie at once.

The decisions (which replica serves which entry, what an answer means, failover, speculation)
are ``machines.read_plan.StripedRead``'s; this module sends its reads, bounded in number, hands
it the answers with their digests checked, and puts the payloads back in entry order. Used by
``ReadHandle.read`` / ``read_unconfirmed`` and by ``read_arrow`` (and so by the Spark source and
compaction), so a striped ledger reads at close to the rate of an unstriped one.
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from . import errors
from .body_check import BodyChecker
from .machines.read_plan import Ask, Miss, StripedRead
from .protocol import bookkeeper_pb2 as pb

if TYPE_CHECKING:
    from .read_handle import ReadHandle

log = logging.getLogger(__name__)

_ABSENT = (pb.ENOENTRY, pb.ENOLEDGER)
_READS_PER_BOOKIE = 2   # listed reads in flight per bookie of the ensemble: one answered while one is read


@dataclass
class _Sent:
    ask: Ask
    at: float
    speculated: bool = False


class _StripedScan:
    """One striped read: the plan, the reads in flight and the payloads found so far."""

    def __init__(self, h: ReadHandle, first: int, last: int, bookies: list[str]) -> None:
        md, cfg = h.metadata, h.client_config
        self.h, self.bookies, self.first = h, bookies, first
        self.plan = StripedRead(first, last, md.ensemble_size, md.write_quorum_size,
                                rotation=h.next_rotation(), chunk_entries=max(1, cfg.read_batch_entries_max))
        self.checker = BodyChecker(h.ledger_id, md.digest_type, h.digester.password)
        # Object arrays: a whole answer's payloads go to their (strided) slots in one C-level step.
        self.payloads = np.empty(last - first + 1, dtype=object)
        self.filled = np.zeros(last - first + 1, dtype=bool)
        self.answers: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self.sent: dict[int, _Sent] = {}
        self.todo: list[Ask] = []
        self.tokens = 0
        self.limit = _READS_PER_BOOKIE * len(bookies)
        self.read_timeout_s = cfg.read_timeout_ms / 1000
        self.speculate_s = cfg.speculative_read_timeout_ms / 1000
        self.bytes_max = cfg.read_batch_bytes_max

    def run(self) -> list[bytes]:
        self.todo = self.plan.initial()
        while not self.plan.finished:
            self._launch_some()
            try:
                token, fut = self.answers.get(timeout=self._wait_s())
            except queue.Empty:
                self._on_slow(time.monotonic())
                continue
            sent = self.sent.pop(token, None)
            if sent is not None:        # else: given up on already (timed out)
                self._on_answer(sent.ask, fut)
        if self.plan.failed:
            raise self._error()
        return self.payloads.tolist()  # every slot filled: finished without failures

    def _launch_some(self) -> None:
        while self.todo and len(self.sent) < self.limit:
            ask = self.todo.pop(0)
            try:
                client = self.h.bookie(self.bookies[ask.index])
                fut = client.read_entries_future(self.h.ledger_id, list(ask.entry_ids), self.bytes_max)
            except errors.LedgerError as e:
                log.debug("listed read of %d entries from %s not sent: %s", len(ask.entry_ids),
                          self.bookies[ask.index], e)
                self.todo += self.plan.on_failure(ask, Miss.ERROR)
                continue
            self.tokens += 1
            self.sent[self.tokens] = _Sent(ask, time.monotonic())
            fut.add_done_callback(lambda f, t=self.tokens: self.answers.put((t, f)))

    def _wait_s(self) -> float:
        """Until the next read becomes slow enough to speculate on or to give up."""
        now = time.monotonic()
        due = [s.at + (self.read_timeout_s if s.speculated else self.speculate_s) for s in self.sent.values()]
        return max(0.001, min(due) - now) if due else self.read_timeout_s

    def _on_slow(self, now: float) -> None:
        for token, s in list(self.sent.items()):
            if now - s.at >= self.read_timeout_s:
                del self.sent[token]
                self.todo += self.plan.on_failure(s.ask, Miss.ERROR)
            elif not s.speculated and now - s.at >= self.speculate_s:
                s.speculated = True
                self.todo += self.plan.speculate(s.ask)
                if self.h.metrics is not None:
                    self.h.metrics.speculative_reads.inc()

    def _on_answer(self, ask: Ask, fut: Any) -> None:
        bookie = self.bookies[ask.index]
        try:
            resp = fut.result(timeout=0)
        except (grpc.RpcError, errors.LedgerError, TimeoutError, OSError, CancelledError) as e:
            log.debug("listed read from %s failed: %s", bookie, e)
            self.todo += self.plan.on_failure(ask, Miss.ERROR)
            return
        if resp.status in _ABSENT:
            self.todo += self.plan.on_answer(ask, [], [])
            return
        ids = np.asarray(resp.entry_ids, dtype=np.int64)
        if resp.status != pb.EOK or not len(ids) or len(ids) != len(resp.bodies) \
                or not np.isin(ids, ask.entry_ids).all() or (np.diff(ids) <= 0).any():
            log.debug("listed read from %s: %s %s (%d ids, %d bodies)", bookie, pb.StatusCode.Name(resp.status),
                      resp.detail, len(ids), len(resp.bodies))
            self.todo += self.plan.on_failure(ask, Miss.ERROR)
            return
        # Out of the message once: each access to a repeated bytes field copies every body.
        ok, payloads = self.checker.check(ids, list(resp.bodies))
        rel = ids - self.first
        take = ok & ~self.filled[rel]    # a speculated copy may have come first: keep that one
        if take.all():
            self.payloads[rel] = _objects(payloads)
        else:
            self.payloads[rel[take]] = _objects(payloads)[take]
        self.filled[rel[take]] = True
        if not ok.all():
            log.warning("ledger %d: %d entries from %s failed their check; reading other copies",
                        self.h.ledger_id, int((~ok).sum()), bookie)
        self.todo += self.plan.on_answer(ask, ids, ok)

    def _error(self) -> errors.LedgerError:
        e, misses = min(self.plan.failed.items())
        where = f"entry {self.h.ledger_id}/{e} (asked {[self.bookies[i] for i in self.plan.replicas_asked(e)]})"
        if all(m is Miss.ABSENT for m in misses):
            return errors.NoSuchEntryError(f"{where} is on no replica")
        if Miss.CORRUPT in misses:
            return errors.DigestMismatchError(f"{where}: every readable replica failed its digest")
        return errors.ReadError(f"{where} unreadable: {[m.value for m in misses]}")


def _objects(items: list[bytes]) -> np.ndarray:
    """A 1-d object array of ``items`` (np.array would try to make a 2-d one of equal-length bytes)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def read_striped(h: ReadHandle, first: int, last: int, bookies: list[str]) -> list[bytes]:
    """Payloads of entries first..last of one striped fragment whose ensemble is ``bookies``, in
    order, digests checked. Raises NoSuchEntryError when an entry is on no replica,
    DigestMismatchError when every copy found is corrupt, ReadError otherwise."""
    return _StripedScan(h, first, last, bookies).run()
