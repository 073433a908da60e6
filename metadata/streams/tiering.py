"""Pure transitions of tiering a stream's sealed segments into Delta (DESIGN §4.6).

Tiering is three steps, each safe to repeat after a crash before the next
(jobs/stream_tiering.py runs them):

1. the records of sealed segments are committed into a Delta table (one Delta commit that also
   records an application transaction per segment, so a rerun finds them there and adds nothing);
2. ``mark_tiered``: those segments become TIERED with the table and a Delta version that holds
   them, in one CAS on the stream; their ``ledger_id`` stays, so a crash before step 3 leaves a
   record of which ledgers are still to delete;
3. the ledgers are deleted, then ``forget_ledgers`` clears ``ledger_id`` of TIERED segments whose
   ledger is gone (a segment without a ledger is what readers and ``stream info`` show once tiered).

Readers read a TIERED segment from Delta whether or not its ledger is deleted yet, so records are
readable through every step: from the ledger before step 2, from Delta after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from metadata.errors import InvalidMetadataError
from metadata.streams.model import SegmentMeta, SegmentState, TierInfo
from metadata.streams.transitions import Change, StreamView


def tierable(view: StreamView) -> list[SegmentMeta]:
    """Sealed segments with a ledger, oldest first: what tiering may copy now. The segment in
    progress is never tiered (its end is not fixed)."""
    return [s for s in view.ordered() if s.state is SegmentState.SEALED and s.ledger_id is not None]


def ledgers_to_release(view: StreamView) -> dict[int, int]:
    """TIERED segments whose ledger may still exist: sequence -> ledger id (step 3's work)."""
    return {s.sequence: s.ledger_id for s in view.ordered()
            if s.state is SegmentState.TIERED and s.ledger_id is not None}


def mark_tiered(view: StreamView, tiers: Mapping[int, tuple[int, TierInfo]]) -> Change | None:
    """Mark segments TIERED: ``tiers`` maps a sequence to (the ledger id that was copied, where its
    records are now). A segment that is already TIERED, gone (truncated, retention) or now holds
    another ledger is left alone; None when nothing is left to change."""
    update: list[tuple[SegmentMeta, int]] = []
    for seq, (ledger_id, tier) in sorted(tiers.items()):
        if tier.delta_version < 0 or not tier.table:
            raise InvalidMetadataError(f"segment {seq}: bad tier {tier}")
        got = view.segments.get(seq)
        if got is None:
            continue
        seg, version = got
        if seg.state is not SegmentState.SEALED or seg.ledger_id != ledger_id:
            continue
        update.append((replace(seg, state=SegmentState.TIERED, tier=tier), version))
    if not update:
        return None
    return Change(view.meta, update=tuple(update))


def forget_ledgers(view: StreamView, deleted: Iterable[int]) -> Change | None:
    """TIERED segments whose ledger is deleted (ids in ``deleted``) no longer name it."""
    gone = set(deleted)
    update = tuple((replace(s, ledger_id=None), view.segment_version(s.sequence)) for s in view.ordered()
                   if s.state is SegmentState.TIERED and s.ledger_id is not None and s.ledger_id in gone)
    return Change(view.meta, update=update) if update else None
