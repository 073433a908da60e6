"""A recovery's close rebased over re-replication of earlier fragments, and nothing else."""

from __future__ import annotations

import dataclasses

import pytest

from metadata import DigestType, LedgerMetadata, LedgerState, transitions

pytestmark = pytest.mark.unit


def _md(ensembles: dict[int, list[str]], state: LedgerState = LedgerState.IN_RECOVERY) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=9, state=state, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                          last_entry_id=-1, length=0, ensembles=ensembles, digest_type=DigestType.CRC32C,
                          password_hash=b"p" * 20, ctime=1)


BEGAN = _md({0: ["a", "b", "c"], 10: ["a", "b", "d"]})
# The recovery replaced d in its last fragment and started a new one at 15.
LOCAL = transitions.set_fragment(transitions.set_fragment(BEGAN, 10, ["a", "b", "e"]), 15, ["a", "f", "e"])


def test_earlier_fragment_rereplicated_is_kept_and_recovery_fragments_go_on_top():
    latest = transitions.replace_bookie(BEGAN, 0, "c", "x")
    rebased = transitions.rebase_recovery(BEGAN, latest, LOCAL)
    assert rebased is not None
    assert rebased.ensembles == {0: ["a", "b", "x"], 10: ["a", "b", "e"], 15: ["a", "f", "e"]}
    assert transitions.close(rebased, 20, 100).state is LedgerState.CLOSED


@pytest.mark.parametrize("change", [
    lambda md: transitions.replace_bookie(md, 10, "d", "x"),            # the fragment recovery decided about
    lambda md: transitions.set_fragment(md, 12, ["a", "b", "x"]),       # a writer's ensemble change
    lambda md: transitions.close(md, 11, 50),                           # someone closed it
    lambda md: dataclasses.replace(md, custom_metadata={"k": b"v"}),    # anything else
    lambda md: dataclasses.replace(md, state=LedgerState.OPEN),
])
def test_any_other_change_is_not_rebased(change):
    assert transitions.rebase_recovery(BEGAN, change(BEGAN), LOCAL) is None


def test_nothing_changed_rebases_to_local():
    assert transitions.rebase_recovery(BEGAN, BEGAN, LOCAL) == LOCAL
