"""Delayed ensemble changes (BookKeeper's delayEnsembleChange) and add timeouts for every Qw, piece
by piece: AddState's rules, placement as far as the spares go, the writer's send clock, the
setting. The whole writer is tested against real bookies in tests/integration/test_no_spare_bookie.py
and driven through fault schedules in tests/sim."""

from __future__ import annotations

import pytest

from ledger_client import ClientConfig, errors
from ledger_client.machines import AddState
from ledger_client.placement import BookieNode, EnsemblePlacement
from ledger_client.write_timing import SendClock, port_answers

pytestmark = pytest.mark.unit


def _acked(s: AddState, eid: int, *bookies: str) -> list[int]:
    return [c.entry_id for b in bookies for c in s.on_ack(eid, b)]


def _delayed(s: AddState, bookie: str) -> None:
    """`bookie` failed and the change found no spare."""
    assert s.on_bookie_failure(bookie)
    s.change_plan()
    s.delay_change()


def test_no_spare_keeps_the_bookie_delayed_and_completes_on_qa():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    s.append(1)
    assert s.on_bookie_failure("b")
    assert _acked(s, 0, "a", "c") == []               # no completion while the change runs
    assert s.change_plan() == (0, [1])
    assert [c.entry_id for c in s.delay_change()] == [0]   # no spare: write on with Qa
    assert s.delayed == {"b"} and not s.changing and s.ensembles == {0: ["a", "b", "c"]}
    eid, _, sent = s.append(1)
    assert sorted(sent) == ["a", "c"]                 # the delayed bookie is sent nothing
    assert _acked(s, eid, "a") == [] and _acked(s, eid, "c") == [1]
    assert not s.on_bookie_failure("b")               # already delayed: no new change
    assert not s.quorum_lost


def test_fewer_than_qa_live_bookies_complete_nothing():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    _delayed(s, "b")
    _delayed(s, "c")
    assert s.quorum_lost
    eid, _, sent = s.append(1)
    assert sent == ("a",)
    assert _acked(s, eid, "a") == [] and s.lac == -1   # one copy is not Qa: never acknowledged


def test_a_bookie_back_with_its_id_gets_what_it_was_not_sent():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    _delayed(s, "b")
    for _ in range(3):
        s.append(1)
    assert _acked(s, 0, "a", "c") == [0]              # 1 and 2 still pending
    assert s.begin_change() and not s.begin_change()   # a retry; one at a time
    key, idx = s.change_plan()
    assert (key, idx) == (1, [1])
    sends, done = s.apply_change(key, ["a", "b", "c"])  # not in `delayed`: taken back
    assert sorted((x.entry_id, x.bookie) for x in sends) == [(1, "b"), (2, "b")]
    assert done == [] and s.delayed == set() and s.ensembles[1] == ["a", "b", "c"]
    assert s.take_short() == {"b"}                    # entry 0 completed without it: mark the ledger
    assert s.take_short() == set()


def test_a_change_can_replace_some_and_keep_others_delayed():
    s = AddState(4, 3, 2, {0: ["a", "b", "c", "d"]})
    _delayed(s, "b")
    s.append(1)
    assert _acked(s, 0, "a", "c") == [0]
    assert s.on_bookie_failure("d")
    key, idx = s.change_plan()
    assert idx == [1, 3]
    sends, _ = s.apply_change(key, ["a", "b", "c", "x"], delayed={"b"})   # one spare for two
    assert s.delayed == {"b"} and s.ensemble == ["a", "b", "c", "x"] and not s.changing
    eid, _, sent = s.append(1)
    assert "b" not in sent and s.take_short() == {"b"}   # still short in the fragment just finished


def test_a_slow_bookie_owes_what_completed_without_it_and_settles_in_order():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    for _ in range(6):
        s.append(1)
    for e in range(6):
        _acked(s, e, "a", "b")
    assert s.lac == 5 and s.owed == {"c": [0, 5]}      # completed without c: c owes 0..5
    s.on_acks("c", [0, 1, 2])                         # answers in order: it still owes 3..5
    assert s.owed == {"c": [3, 5]}
    s.on_acks("c", [3, 4, 5])
    assert s.owed == {}


def test_a_debt_moves_to_the_bookies_next_write_set_when_e_is_above_qw():
    s = AddState(5, 2, 1, {0: ["a", "b", "c", "d", "e"]})   # b stores entries 0, 1, 5, 6, 10, ...
    for _ in range(11):
        s.append(1)
    for e in range(11):
        _acked(s, e, next(b for b in s.pending[e] if b != "b"))   # complete (Qa 1) without b
    assert s.owed["b"] == [0, 10]
    s.on_acks("b", [0, 1])
    assert s.owed["b"] == [5, 10]                     # not 2: entry 2 was never sent to b


def test_a_failed_bookie_late_acks_settle_nothing():
    s = AddState(3, 3, 2, {0: ["a", "b", "c"]})
    s.append(1)
    s.append(1)
    _acked(s, 0, "a", "b")
    assert s.owed == {"c": [0, 0]}
    _delayed(s, "c")
    _acked(s, 1, "a", "b")
    s.on_acks("c", [1])                               # a late answer for a send before it failed
    assert s.owed == {"c": [0, 1]}
    assert s.finish() == {"c"}                        # closing: it misses entries of the last fragment


def test_placement_replaces_as_far_as_the_spares_go():
    p = EnsemblePlacement()
    nodes = [BookieNode(b) for b in ("a:1", "b:1", "c:1", "d:1", "x:1")]
    new, left = p.replace_available(["a:1", "b:1", "c:1", "d:1"], [1, 3], nodes, exclude={"b:1", "d:1"})
    assert (left, sorted(new)) in (([3], ["a:1", "c:1", "d:1", "x:1"]), ([1], ["a:1", "b:1", "c:1", "x:1"]))
    new, left = p.replace_available(["a:1", "b:1", "c:1", "d:1"], [1, 3], nodes, exclude={"b:1", "d:1"},
                                    last={"b:1"})
    assert new == ["a:1", "b:1", "c:1", "x:1"] and left == [1]   # b may stay (it answers): the spare goes to d
    new, left = p.replace_available(["a:1", "b:1", "c:1"], [1], nodes[:3], exclude={"b:1"})
    assert new == ["a:1", "b:1", "c:1"] and left == [1]


def test_send_clock_bounds_the_age_of_completed_entries():
    clock = SendClock()
    clock.tick(0, 100.0, keep_s=5)
    clock.tick(10, 101.0, keep_s=5)      # entries 0..9 were sent by t=101
    clock.tick(10, 101.5, keep_s=5)      # no appends: no mark
    clock.tick(25, 103.0, keep_s=5)
    assert clock.sent_before(3) == 101.0 and clock.sent_before(10) == 103.0
    assert clock.sent_before(25) is None  # sent after the last mark: younger than a tick
    clock.tick(30, 110.0, keep_s=5)       # marks older than 5 s go, but the newest of them stays
    assert clock.sent_before(26) == 110.0 and clock.sent_before(3) == 103.0


def test_port_probe_tells_a_listening_bookie_from_a_closed_port():
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert port_answers(f"127.0.0.1:{port}", 1.0)
    assert not port_answers(f"127.0.0.1:{port}", 1.0)
    assert not port_answers("not-an-id", 1.0)


def test_the_setting_is_on_by_default_and_must_be_a_bool():
    assert ClientConfig().delay_ensemble_change is True
    assert ClientConfig(delay_ensemble_change=False).delay_ensemble_change is False
    with pytest.raises(errors.IncorrectParameterError):
        ClientConfig(delay_ensemble_change="yes")  # type: ignore[arg-type]
