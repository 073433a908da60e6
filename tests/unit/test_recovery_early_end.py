"""Recovery decides from the answers in hand (machines/recovery.py, machines/quorum.py): a bookie
that never answers delays nothing the others' answers settle (issue 27, item 5), and nothing is
decided that could close a ledger below an acknowledged entry (DESIGN §5, invariant 4)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.machines import QuorumCoverage, ReadOutcome, RecoveryReadTally, fence_start_point, write_set

pytestmark = pytest.mark.unit

FOUND, ABSENT, ERROR = "found", "absent", "error"


@st.composite
def quorums(draw: st.DrawFn, min_qa: int = 1) -> tuple[int, int, int]:
    e = draw(st.integers(max(min_qa, 1), 7))
    qw = draw(st.integers(max(min_qa, 1), e))
    qa = draw(st.integers(min_qa, qw))
    return e, qw, qa


def _expected(answers: list[str], silent: int, qw: int, qa: int, confirmed: bool) -> ReadOutcome:
    """What the answers in hand settle (the rule, stated directly)."""
    if FOUND in answers:
        return ReadOutcome.FOUND
    if not confirmed and answers.count(ABSENT) >= qw - qa + 1:
        return ReadOutcome.ABSENT
    return ReadOutcome.PENDING if silent else ReadOutcome.UNKNOWN


@settings(max_examples=400, deadline=None)
@given(quorums(), st.integers(0, 50), st.data(), st.booleans())
def test_tally_decides_at_the_answer_that_settles_it(q, entry_id, data, confirmed):
    """Each bookie of the write set holds the entry, does not, fails, or never answers; fed the
    answers in any order, the tally says exactly what those in hand settle, at every step."""
    e, qw, qa = q
    ws = write_set(entry_id, e, qw)
    kinds = {i: data.draw(st.sampled_from([FOUND, ABSENT, ERROR, None]), label=f"bookie {i}") for i in ws}
    order = data.draw(st.permutations([i for i in ws if kinds[i] is not None]), label="answer order")
    silent = sum(1 for k in kinds.values() if k is None)
    t = RecoveryReadTally(entry_id, e, qw, qa, confirmed=confirmed)
    seen: list[str] = []
    for n, i in enumerate(order):
        kind = kinds[i]
        assert kind is not None
        outcome = {FOUND: t.on_found, ABSENT: t.on_absent, ERROR: t.on_error}[kind](i)
        seen.append(kind)
        assert outcome is _expected(seen, silent + len(order) - n - 1, qw, qa, confirmed), (kinds, order, seen)
        if outcome is not ReadOutcome.PENDING:
            return


@settings(max_examples=400, deadline=None)
@given(quorums(min_qa=2), st.integers(0, 50), st.data())
def test_one_silent_bookie_never_keeps_a_tally_waiting(q, entry_id, data):
    """With Qa >= 2, Qw - 1 definitive answers always decide: one bookie silent forever (cut off,
    stopped) is never waited for, whatever the others hold; ABSENT only when the entry cannot
    have Qa copies even counting the silent one."""
    e, qw, qa = q
    ws = write_set(entry_id, e, qw)
    silent = data.draw(st.sampled_from(ws), label="silent")
    holds = {i: data.draw(st.booleans(), label=f"bookie {i} holds it") for i in ws if i != silent}
    t = RecoveryReadTally(entry_id, e, qw, qa)
    outcome = ReadOutcome.PENDING
    for i in data.draw(st.permutations(sorted(holds)), label="order"):
        outcome = t.on_found(i) if holds[i] else t.on_absent(i)
        if outcome is not ReadOutcome.PENDING:
            break
    assert outcome in (ReadOutcome.FOUND, ReadOutcome.ABSENT), "waited for the silent bookie"
    if not any(holds.values()):
        assert outcome is ReadOutcome.ABSENT
    if outcome is ReadOutcome.ABSENT:   # whatever the silent bookie holds, Qa copies are impossible
        assert sum(holds.values()) + 1 < qa


@settings(max_examples=400, deadline=None)
@given(quorums(), st.integers(0, 50), st.data())
def test_tally_never_calls_absent_an_entry_that_may_have_been_acknowledged(q, entry_id, data):
    """Safety: bookies answer truthfully or not at all; if Qa of them hold the entry (it may have
    been acknowledged), the tally never says ABSENT, however many others are silent or fail."""
    e, qw, qa = q
    ws = write_set(entry_id, e, qw)
    holders = set(data.draw(st.lists(st.sampled_from(ws), min_size=qa, max_size=qw, unique=True), label="holders"))
    answering = data.draw(st.lists(st.sampled_from(ws), unique=True), label="answering, in order")
    t = RecoveryReadTally(entry_id, e, qw, qa)
    for i in answering:
        fails = data.draw(st.booleans(), label=f"bookie {i} fails")
        outcome = t.on_error(i) if fails else (t.on_found(i) if i in holders else t.on_absent(i))
        assert outcome is not ReadOutcome.ABSENT
        if outcome is not ReadOutcome.PENDING:
            break


@settings(max_examples=300, deadline=None)
@given(quorums(), st.data())
def test_coverage_is_reached_without_bookies_it_can_do_without(q, data):
    """Fencing (and the LAC read) may go on once fewer than Qa bookies of every write set are
    unknown: with such a set of bookies silent forever, the others' answers, in any order, cover;
    with one more, they never do."""
    e, qw, qa = q
    silent = set(data.draw(st.lists(st.integers(0, e - 1), unique=True), label="silent"))
    enough = all(sum(1 for i in write_set(s, e, qw) if i in silent) < qa for s in range(e))
    cov = QuorumCoverage(e, qw, qa)
    covered = False
    for i in data.draw(st.permutations([i for i in range(e) if i not in silent]), label="order"):
        was = covered
        covered = cov.add(i)
        assert covered or not was, "coverage went away"
    assert covered == enough
    if not enough:
        return
    # What coverage stands on: any entry that reached Qa bookies reached one that answered.
    for s in range(e):
        assert len([i for i in write_set(s, e, qw) if i not in silent]) >= qw - qa + 1


# ------------------------------------------------------------------ the whole decision, one bookie silent


@dataclass
class _Ledger:
    """What a writer that stopped left on the bookies: entry e on copies[e] (ensemble indexes),
    framed with lacs[e], its writer's LAC when it sent e."""

    e: int
    qw: int
    qa: int
    copies: list[set[int]]
    lacs: list[int]

    def acknowledged(self) -> int:
        """The highest id the writer could have been told of: completions are in order, each at Qa."""
        last = -1
        for eid, c in enumerate(self.copies):
            if len(c) < self.qa:
                break
            last = eid
        return last

    def last_entry_on(self, index: int) -> int | None:
        held = [eid for eid, c in enumerate(self.copies) if index in c]
        return max(held) if held else None


@st.composite
def ledgers(draw: st.DrawFn) -> _Ledger:
    e, qw, qa = draw(quorums(min_qa=2))
    n = draw(st.integers(0, 14))
    copies: list[set[int]] = []
    lacs: list[int] = []
    confirmed = -1  # entries 0..confirmed have Qa copies so far: a LAC a copy may carry
    for eid in range(n):
        ws = write_set(eid, e, qw)
        # Mostly what writers leave (Qa copies, the whole write set, none), sometimes anything.
        size = draw(st.sampled_from([qa, qa, qw, 0, None]))
        some = draw(st.permutations(ws))
        copies.append(set(some[:size]) if size is not None else
                      set(draw(st.lists(st.sampled_from(ws), unique=True, max_size=qw))))
        lacs.append(draw(st.integers(lacs[-1] if lacs else -1, confirmed)))
        if confirmed == eid - 1 and len(copies[-1]) >= qa:
            confirmed = eid
    return _Ledger(e, qw, qa, copies, lacs)


@settings(max_examples=500, deadline=None)
@given(ledgers(), st.data())
def test_recovery_decisions_with_one_bookie_silent_end_at_or_above_every_ack(ledger, data):
    """Fencing, the start point, the length read and every entry read decided from the other
    bookies' answers alone, in any order: recovery never has to wait for the silent bookie, and
    the end it finds is at or above every entry that may have been acknowledged (invariant 4)."""
    e, qw, qa = ledger.e, ledger.qw, ledger.qa
    silent = data.draw(st.integers(0, e - 1), label="silent")
    live = [i for i in range(e) if i != silent]
    # Fencing: answers (each bookie's last entry's LAC) until coverage.
    cov, lacs = QuorumCoverage(e, qw, qa), []
    for i in data.draw(st.permutations(live), label="fence order"):
        last = ledger.last_entry_on(i)
        lacs.append(-1 if last is None else ledger.lacs[last])
        if cov.add(i):
            break
    assert cov.covered(), "fencing waited for the silent bookie"
    start = fence_start_point(0, lacs)
    assert start <= ledger.acknowledged()

    def read(eid: int, confirmed: bool) -> ReadOutcome:
        t = RecoveryReadTally(eid, e, qw, qa, confirmed=confirmed)
        holders = ledger.copies[eid] if eid < len(ledger.copies) else set()
        peers = [i for i in write_set(eid, e, qw) if i != silent]
        for i in data.draw(st.permutations(peers), label=f"order of entry {eid}"):
            outcome = t.on_found(i) if i in holders else t.on_absent(i)
            if outcome is not ReadOutcome.PENDING:
                return outcome
        return ReadOutcome.PENDING

    if start >= 0:
        assert read(start, confirmed=True) is ReadOutcome.FOUND, "the start entry's length needs the silent bookie"
    end = start
    while (outcome := read(end + 1, confirmed=False)) is ReadOutcome.FOUND:
        end += 1
    assert outcome is ReadOutcome.ABSENT, f"entry {end + 1}: {outcome} without the silent bookie"
    assert end >= ledger.acknowledged(), (end, ledger.acknowledged())
