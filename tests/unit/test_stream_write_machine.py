"""The stream writer's machine (ledger_client/machines/stream_write.py): buffering, rolling, the
idle writer's LAC announcement, txids and in-order settling, driven directly (examples) and by
hypothesis (a model)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger_client import errors
from ledger_client.machines.stream_write import Actions, Done, Entry, Failed, Limits, StreamWriteState
from ledger_client.stream.records import RECORD_OVERHEAD_BYTES

pytestmark = pytest.mark.unit

OVERHEAD = RECORD_OVERHEAD_BYTES
NO_ROLL = Limits(buffer_bytes=1000, roll_bytes=None, roll_interval_s=None)


def _started(limits: Limits = NO_ROLL, last_txid: int = -1) -> StreamWriteState[str]:
    """A machine whose first segment (sequence 1) is open, nothing written yet."""
    sm: StreamWriteState[str] = StreamWriteState(last_txid, limits, OVERHEAD)
    assert sm.add(None, b"first", "r0")
    out = sm.step(0.0)
    assert out.transition and not out.send and sm.transitioning
    out = sm.segment_started(1, sm.first_buffered_txid(), 0.0, limits)
    [entry] = out.send
    assert entry.tokens == ["r0"] and entry.txids == [last_txid + 1] and entry.records_before == 0
    out = sm.settled(entry, 0, 0.0)   # idle: the LAC is announced, no entry follows
    assert out.announce and not out.send and sm.idle
    return sm


def _data(out: Actions[str]) -> list[Entry[str]]:
    return list(out.send)


def test_txids_are_assigned_or_checked_and_never_go_down():
    sm: StreamWriteState[str] = StreamWriteState(41, NO_ROLL, OVERHEAD)
    sm.add(None, b"a", "a")
    assert sm.last_txid == 42
    sm.add(42, b"b", "b")                     # equal to the last: allowed (non-decreasing)
    sm.add(100, b"c", "c")
    with pytest.raises(errors.TransactionIdOutOfOrderError):
        sm.add(99, b"d", "d")
    assert sm.last_txid == 100 and sm.first_buffered_txid() == 42
    sm.step(0.0)
    [entry] = sm.segment_started(1, 42, 0.0, NO_ROLL).send
    assert entry.txids == [42, 42, 100] and entry.tokens == ["a", "b", "c"]   # "d" was never buffered


def test_one_record_goes_at_once_and_records_gather_while_an_entry_is_in_flight():
    sm = _started()
    assert sm.add(None, b"x" * 10, "a")       # nothing in flight: step now
    [first] = sm.step(1.0).send
    assert first.tokens == ["a"]
    assert not sm.add(None, b"x" * 400, "b")   # in flight, 412 of 1000 bytes: wait
    assert sm.add(None, b"x" * 600, "c")       # 1024 >= 1000: step now, full entries only
    [full] = sm.step(1.0).send
    assert full.tokens == ["b"]               # "c" would take it past the limit: it waits
    assert not sm.step(1.0).send              # 612 left: not full, and entries are in flight
    assert _data(sm.step(1.0, flush=True)) and sm.idle is False   # flush: the rest goes now


def test_an_entry_holds_at_least_one_record_even_over_the_limit():
    sm = _started()
    sm.add(None, b"x" * 5000, "big")
    [entry] = sm.step(0.0).send
    assert entry.tokens == ["big"]


def test_records_settle_in_order_whatever_order_entries_complete_in():
    sm = _started()
    sm.add(None, b"a", "a")
    [e1] = sm.step(0.0).send
    sm.add(None, b"x" * 990, "b")
    [e2] = sm.step(0.0).send
    out = sm.settled(e2, 3, 0.0)
    assert not out.settle                     # entry 1 has no outcome yet
    out = sm.settled(e1, 2, 0.0)
    assert out.settle == [Done(1, 2, ["a"]), Done(1, 3, ["b"])]


def test_a_failed_entry_fails_every_record_not_yet_acknowledged_after_those_before_it():
    sm = _started()
    sm.add(None, b"a", "a")
    [e1] = sm.step(0.0).send
    sm.add(None, b"x" * 995, "b")
    [e2] = sm.step(0.0).send
    sm.add(None, b"c", "c")                   # buffered
    boom = errors.LedgerFencedError("fenced")
    assert not sm.settled(e2, boom, 0.0).settle
    out = sm.settled(e1, 2, 0.0)
    assert out.settle == [Done(1, 2, ["a"]), Failed(["b", "c"], boom)]
    assert sm.error is boom and sm.idle and not out.send
    assert not sm.step(0.0).send and not sm.settled(e2, 3, 0.0).settle   # nothing more moves


def test_fail_fails_in_flight_and_buffered_records_and_keeps_the_first_error():
    sm = _started()
    sm.add(None, b"a", "a")
    sm.step(0.0)
    sm.add(None, b"b", "b")
    first, second = errors.WriteError("first"), errors.WriteError("second")
    assert sm.fail(first).settle == [Failed(["a", "b"], first)]
    assert not sm.fail(second).settle and sm.error is first


def test_a_segment_rolls_by_bytes_once_nothing_is_in_flight_and_the_backlog_waits():
    limits = Limits(buffer_bytes=100, roll_bytes=150, roll_interval_s=None)
    sm = _started(limits)
    sm.add(None, b"x" * 88, "a")
    [e1] = sm.step(0.0).send                  # segment 1 now holds 17 + 100 = 117 bytes
    sm.add(None, b"x" * 88, "b")
    [e2] = sm.step(0.0).send                  # full: 217 bytes
    assert sm.add(None, b"x" * 88, "c")       # full again, but the segment is due to roll
    out = sm.step(0.0)
    assert not out.send and not out.transition and sm.transitioning   # waits for e1 and e2
    assert not sm.add(None, b"d", "d")        # nothing is sent during a transition
    assert sm.settled(e1, 2, 0.0).settle == [Done(1, 2, ["a"])]
    out = sm.settled(e2, 3, 0.0)
    assert out.transition and not out.send and out.settle == [Done(1, 3, ["b"])]
    assert sm.first_buffered_txid() == 3      # "c" starts the next segment
    out = sm.segment_started(2, 3, 0.0, limits)
    assert [e.tokens for e in out.send] == [["c"]]   # one entry at once, "d" waits: "c" + "d" is over 100
    assert sm.segment is not None and sm.segment.sequence == 2 and out.send[0].records_before == 0


def test_a_segment_rolls_by_age():
    limits = Limits(buffer_bytes=1000, roll_bytes=None, roll_interval_s=10.0)
    sm = _started(limits)                     # segment 1 started at 0.0
    sm.add(None, b"a", "a")
    [e1] = sm.step(9.9).send                  # 9.9 s old: not yet
    assert sm.settled(e1, 2, 9.9).announce
    assert sm.add(None, b"b", "b")
    out = sm.step(10.0)
    assert out.transition and not out.send and sm.first_buffered_txid() == 2


def test_an_idle_writer_announces_the_lac_after_its_last_records_and_sends_no_entry():
    sm = _started()
    sm.add(None, b"a", "a")
    [e1] = sm.step(0.0).send
    out = sm.settled(e1, 2, 0.0)
    assert out.announce and not out.send and out.settle == [Done(1, 2, ["a"])]
    assert sm.idle                            # nothing in flight: the next record goes at once
    assert sm.segment is not None and sm.segment.last_data_entry == 2
    assert sm.add(None, b"b", "b")
    [e2] = sm.step(0.0).send


def test_no_announcement_while_records_wait_or_a_transition_is_due():
    sm = _started()
    sm.add(None, b"a", "a")
    [e1] = sm.step(0.0).send
    sm.add(None, b"b", "b")
    out = sm.settled(e1, 2, 0.0)
    assert [e.tokens for e in out.send] == [["b"]] and not out.announce   # "b" carries the LAC
    assert sm.settled(out.send[0], 3, 0.0).announce
    limits = Limits(buffer_bytes=1000, roll_bytes=1, roll_interval_s=None)
    sm = _started(limits)
    sm.add(None, b"a", "a")
    out = sm.step(0.0)
    assert out.transition and not out.announce   # the roll closes the ledger: its close carries the end


def test_sealing_leaves_no_segment():
    sm = _started()
    seg = sm.segment_sealed()
    assert seg is not None and seg.sequence == 1 and seg.records == 1 and sm.segment is None


# ---------------------------------------------------------------------- the model

class WriterModel(RuleBasedStateMachine):
    """Random records, steps, flushes, completions in any order, failures, transitions and time,
    against what a stream writer must see: every record settled once, in write order, with
    positions that only grow; entries within the limit; nothing sent during a transition; a
    transition only with nothing in flight; segments rolled by size and age."""

    @initialize(limit=st.integers(20, 300), roll_bytes=st.none() | st.integers(50, 2000),
                 roll_s=st.none() | st.floats(1.0, 50.0))
    def start(self, limit: int, roll_bytes: int | None, roll_s: float | None) -> None:
        self.limits = Limits(limit, roll_bytes, roll_s)
        self.sm: StreamWriteState[int] = StreamWriteState(-1, self.limits, OVERHEAD)
        self.now = 0.0
        self.added: list[int] = []            # tokens in write order
        self.txids: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.settled_order: list[int] = []
        self.failed: list[int] = []
        self.positions: list[tuple[int, int, int]] = []
        self.flight: list[tuple[Entry[int], int]] = []   # sent, no outcome given yet; with its entry id
        self.next_entry_id = 0
        self.sequence = 0
        self.transition_asked = False
        self.segment_opened_at = 0.0

    # -- driving -----------------------------------------------------------------------------
    def _apply(self, out: Actions[int]) -> None:
        for entry in out.send:
            assert not self.transition_asked, "an entry sent while a segment transition runs"
            assert entry.segment.sequence == self.sequence
            assert entry.tokens, "every entry holds records"
            size = sum(self.sizes[t] + OVERHEAD for t in entry.tokens)
            assert len(entry.tokens) == 1 or size <= self.limits.buffer_bytes
            assert entry.txids == [self.txids[t] for t in entry.tokens]
            self.flight.append((entry, self.next_entry_id))
            self.next_entry_id += 1
        for item in out.settle:
            if isinstance(item, Done):
                self.settled_order += item.tokens
                self.positions += [(item.sequence, item.entry_id, slot) for slot in range(len(item.tokens))]
            else:
                self.failed += item.tokens
        data_done = any(isinstance(item, Done) for item in out.settle)
        if out.announce:   # only as records completed, with nothing left to carry the LAC
            assert data_done and not out.send and not out.transition and self.sm.idle
        if data_done and self.sm.error is None and self.sm.idle and not self.sm.transitioning:
            assert out.announce, "the writer went idle after records without announcing the LAC"
        if out.transition:
            assert not self.transition_asked and self.sm.transitioning
            assert all(e.outcome is not None for e, _ in self.flight), "a transition with entries in flight"
            self.transition_asked = True

    @rule(size=st.integers(0, 120), txid_step=st.none() | st.integers(-2, 3))
    def write(self, size: int, txid_step: int | None) -> None:
        if self.sm.error is not None:
            return
        token = len(self.added)
        txid = None if txid_step is None else self.sm.last_txid + txid_step
        try:
            go = self.sm.add(txid, b"x" * size, token)
        except errors.TransactionIdOutOfOrderError:
            assert txid is not None and txid < self.sm.last_txid
            return
        self.added.append(token)
        self.txids[token] = self.sm.last_txid
        self.sizes[token] = size
        if go:
            self._apply(self.sm.step(self.now))

    @rule(flush=st.booleans())
    def step(self, flush: bool) -> None:
        self._apply(self.sm.step(self.now, flush))

    @precondition(lambda self: any(e.outcome is None for e, _ in self.flight))
    @rule(pick=st.integers(0, 3), fail=st.integers(0, 60))
    def complete(self, pick: int, fail: int) -> None:
        open_ = [(e, eid) for e, eid in self.flight if e.outcome is None]
        entry, eid = open_[pick % len(open_)]
        # Any order, not only the ledger's (which completes in entry-id order): the machine must not care.
        outcome: int | errors.LedgerError = errors.WriteError("bookies gone") if fail == 0 else eid
        self._apply(self.sm.settled(entry, outcome, self.now))

    @precondition(lambda self: self.transition_asked)
    @rule()
    def run_transition(self) -> None:
        self.transition_asked = False
        if self.sm.error is not None:
            return
        seg = self.sm.segment
        if seg is not None:   # the roll was due: by size or by age
            lim = self.limits
            assert ((lim.roll_bytes is not None and seg.payload_bytes >= lim.roll_bytes)
                    or (lim.roll_interval_s is not None and self.now - self.segment_opened_at >= lim.roll_interval_s))
        self.sequence += 1
        self.next_entry_id = 0
        self.segment_opened_at = self.now
        self._apply(self.sm.segment_started(self.sequence, self.sm.first_buffered_txid(), self.now, self.limits))

    @rule(dt=st.floats(0.0, 20.0))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(chance=st.integers(0, 40))
    def writer_fails(self, chance: int) -> None:
        if chance == 0:   # rarely: a failed writer does nothing more, and the rest of the run is wasted
            self._apply(self.sm.fail(errors.StreamLockedError("lost the lock")))

    # -- what must hold ----------------------------------------------------------------------
    @invariant()
    def records_settle_once_in_write_order(self) -> None:
        done = self.settled_order
        assert done == self.added[:len(done)]
        if self.failed:
            assert self.settled_order + self.failed == self.added[:len(done) + len(self.failed)]
            assert self.sm.error is not None

    @invariant()
    def txids_never_go_down(self) -> None:
        txids = [self.txids[t] for t in self.added]
        assert txids == sorted(txids)

    @invariant()
    def segments_roll_by_size(self) -> None:
        seg, lim = self.sm.segment, self.limits
        if seg is not None and lim.roll_bytes is not None:   # at most one entry past the threshold
            assert seg.payload_bytes < lim.roll_bytes + max(lim.buffer_bytes, 120 + OVERHEAD)

    @invariant()
    def positions_only_grow(self) -> None:
        assert self.positions == sorted(self.positions) and len(set(self.positions)) == len(self.positions)

    @invariant()
    def idle_means_everything_settled(self) -> None:
        if self.sm.idle and self.sm.error is None:
            assert self.settled_order == self.added


TestWriterModel = WriterModel.TestCase
TestWriterModel.settings = settings(max_examples=200, stateful_step_count=80, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_the_model_drains_when_driven_to_the_end():
    """A writer that keeps being stepped and completed settles everything it was given."""
    model = WriterModel()
    model.start(limit=100, roll_bytes=300, roll_s=5.0)
    for i in range(200):
        model.write(size=i % 90, txid_step=None)
        if i % 7 == 0:
            model.tick(1.0)
        while model.transition_asked or any(e.outcome is None for e, _ in model.flight):
            if model.transition_asked:
                model.run_transition()
            else:
                model.complete(pick=0, fail=1)
        model.step(flush=True)
    while not model.sm.idle:
        model.step(flush=True)
        if model.transition_asked:
            model.run_transition()
        elif any(e.outcome is None for e, _ in model.flight):
            model.complete(pick=0, fail=1)
    assert model.settled_order == model.added and model.sequence > 1
