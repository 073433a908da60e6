"""Pure ledger-metadata transitions: each takes metadata and returns the next metadata, or raises.

They hold every rule about *which* changes are allowed, so the CAS loop in :mod:`metadata.update`
can re-apply them to whatever it reads after losing a race: the transition decides again from the
fresh state (a close that finds the ledger already closed at the same end is a success, at another
end a conflict). A transition returns ``md`` itself when there is nothing to change, so re-applying
after an unknown-outcome write is harmless and the loop writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from metadata.errors import InvalidMetadataError, LedgerAlreadyClosedError, LedgerClosedConflict
from metadata.model import LedgerMetadata, LedgerState


def unchanged(md: LedgerMetadata, new: LedgerMetadata) -> bool:
    """Whether applying a transition to ``md`` left nothing to write."""
    return new is md or new == md


def close(md: LedgerMetadata, last_entry_id: int, length: int) -> LedgerMetadata:
    """OPEN or IN_RECOVERY → CLOSED at ``last_entry_id`` / ``length`` (BookKeeper's close rule).

    Already closed at the same end: ``md`` unchanged (the close is idempotent, e.g. a retry after
    a lost connection). Already closed at a different end: LedgerClosedConflict, because someone
    else decided where the ledger ends. A writer's close overrides IN_RECOVERY: the writer's own
    end is authoritative for entries it had acknowledged, and recovery then finds it closed.
    """
    if md.is_closed:
        if md.last_entry_id == last_entry_id and md.length == length:
            return md
        raise LedgerClosedConflict(
            f"ledger {md.ledger_id} is already closed at entry {md.last_entry_id} (length {md.length}); "
            f"cannot close it at entry {last_entry_id} (length {length})"
        )
    return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)


def begin_recovery(md: LedgerMetadata) -> LedgerMetadata:
    """OPEN → IN_RECOVERY (a recovering reader marks the ledger); otherwise unchanged."""
    if md.state is LedgerState.OPEN:
        return dataclasses.replace(md, state=LedgerState.IN_RECOVERY)
    return md


def set_fragment(md: LedgerMetadata, first_entry_id: int, bookies: Sequence[str]) -> LedgerMetadata:
    """Ensemble change: the fragment starting at ``first_entry_id`` is stored on ``bookies``.

    Equal to the last fragment's key: that fragment's bookies are replaced (nothing was written
    there yet, e.g. a second change before the first entry of the new fragment). Greater: a new
    fragment is appended. Smaller: InvalidMetadataError, since fragment keys must stay strictly
    increasing (invariant 5) and no change may rewrite where earlier entries live.
    """
    if md.is_closed:
        raise LedgerAlreadyClosedError(
            f"ledger {md.ledger_id} is closed; cannot change its ensemble from entry {first_entry_id}"
        )
    wanted = list(bookies)
    keys = list(md.ensembles)
    if keys and first_entry_id < keys[-1]:
        raise InvalidMetadataError(
            f"ledger {md.ledger_id}: a fragment cannot start at entry {first_entry_id}, before the "
            f"last fragment's first entry {keys[-1]} (fragment keys must increase)"
        )
    if keys and first_entry_id == keys[-1] and md.ensembles[first_entry_id] == wanted:
        return md
    ensembles = {k: v for k, v in md.ensembles.items()}
    ensembles[first_entry_id] = wanted
    return dataclasses.replace(md, ensembles=ensembles)


def replace_bookie(
    md: LedgerMetadata, first_entry_id: int, old_bookie: str, new_bookie: str
) -> LedgerMetadata:
    """Re-replication: ``new_bookie`` takes ``old_bookie``'s place in one fragment (closed or not).

    Already done (``old_bookie`` gone, ``new_bookie`` there): ``md`` unchanged, so two workers
    racing on the same fragment, or a retry, both succeed. Errors: the fragment does not exist,
    ``old_bookie`` is not in it, or ``new_bookie`` is in it already beside ``old_bookie``.
    """
    ensemble = md.ensembles.get(first_entry_id)
    if ensemble is None:
        raise InvalidMetadataError(
            f"ledger {md.ledger_id} has no fragment starting at entry {first_entry_id} "
            f"(fragments: {list(md.ensembles)})"
        )
    if old_bookie not in ensemble:
        if new_bookie in ensemble:
            return md
        raise InvalidMetadataError(
            f"ledger {md.ledger_id}: bookie {old_bookie} is not in fragment {first_entry_id} ({ensemble})"
        )
    if new_bookie in ensemble:
        raise InvalidMetadataError(
            f"ledger {md.ledger_id}: bookie {new_bookie} is already in fragment {first_entry_id} ({ensemble})"
        )
    ensembles = dict(md.ensembles)
    ensembles[first_entry_id] = [new_bookie if b == old_bookie else b for b in ensemble]
    return dataclasses.replace(md, ensembles=ensembles)


def rebase_recovery(began: LedgerMetadata, latest: LedgerMetadata, local: LedgerMetadata) -> LedgerMetadata | None:
    """A recovery's fragments (``local``, built on ``began``) re-applied on ``latest``, or None.

    A recovery closes by CAS on the version it began with, because any change to the part of the
    ledger it decided about means someone else decided. Re-replication, though, swaps bookies in
    *earlier* fragments of an unclosed ledger without deciding anything about its end; failing a
    recovery for that would make recovery opens fail whenever autorecovery is busy. So: if
    ``latest`` is still IN_RECOVERY, has exactly ``began``'s fragment keys, the same last fragment,
    and differs from ``began`` only in the bookies of earlier fragments, the recovery's last and
    new fragments are put on top of ``latest``. Anything else returns None (the caller gives up).
    """
    if latest.state is not LedgerState.IN_RECOVERY or list(latest.ensembles) != list(began.ensembles):
        return None
    last = max(began.ensembles)
    if latest.ensembles[last] != began.ensembles[last]:
        return None
    if dataclasses.replace(latest, ensembles=began.ensembles) != began:
        return None  # something other than earlier fragments' bookies changed
    merged = latest
    for key, bookies in local.ensembles.items():
        if key >= last:
            merged = set_fragment(merged, key, bookies)
    return merged
