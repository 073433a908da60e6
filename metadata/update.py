"""The one compare-and-set update loop for ledger metadata (BookKeeper's MetadataUpdateLoop).

Every metadata change in the project goes through :func:`update_ledger`, which is how invariant 5
("every metadata change is a CAS") holds: read ``(metadata, version)``, apply a pure transition,
write only if something changed and only on the version that was read; after losing the race,
re-read and let the transition decide again from the fresh metadata.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from metadata.errors import BadVersionError, InvalidMetadataError, MetadataUpdateConflictError
from metadata.model import LedgerMetadata
from metadata.transitions import unchanged

log = logging.getLogger(__name__)

Transition = Callable[[LedgerMetadata], LedgerMetadata]


class LedgerMetadataAccess(Protocol):
    """What the loop needs of a store (every :class:`~metadata.store.MetadataStore` has it)."""

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]: ...

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int: ...


def _check_tenancy_kept(old: LedgerMetadata, new: LedgerMetadata) -> None:
    """A ledger's namespace and creator are set at creation and never change (bookies cache them
    for good); the one exception is the migration to tenants stamping a namespace (or a creator)
    on a ledger that predates them and has neither."""
    if (new.owner_role != old.owner_role and old.owner_role) or (new.namespace != old.namespace and old.namespace):
        raise InvalidMetadataError(
            f"ledger {old.ledger_id}: its namespace and creator role never change "
            f"({old.namespace!r}/{old.owner_role!r} -> {new.namespace!r}/{new.owner_role!r})")
    # The groups recorded at creation say where the writer may place copies; a namespace's later
    # change is the auditor's to apply (it compares with the namespace), never a rewrite of these.
    if (new.bookie_groups, new.bookie_groups_secondary) != (old.bookie_groups, old.bookie_groups_secondary):
        raise InvalidMetadataError(f"ledger {old.ledger_id}: its recorded placement groups never change")


def update_ledger(
    store: LedgerMetadataAccess,
    ledger_id: int,
    transition: Transition,
    *,
    retries_max: int = 20,
    backoff_ms: float = 5.0,
    known: tuple[LedgerMetadata, int] | None = None,
) -> tuple[LedgerMetadata, int]:
    """Apply ``transition`` to the ledger's metadata by CAS; return the stored ``(metadata, version)``.

    A transition that returns its input (or an equal value) writes nothing. A lost CAS
    (BadVersionError) re-reads and re-applies, at most ``retries_max`` times after the first
    attempt, with a short jittered backoff so racing writers spread out; then
    MetadataUpdateConflictError. Errors of the transition (e.g. LedgerClosedConflict) and of the
    store (NoNodeError, MetadataUnavailableError: outcome unknown, a caller may call again since
    transitions are idempotent) propagate unchanged.

    ``known``: the ``(metadata, version)`` the caller last wrote or read (a writer closing its own
    ledger knows them), tried first instead of a read: one round trip instead of two when nobody
    else wrote meanwhile, and a lost CAS otherwise, which reads as usual. Only a change is tried
    on it: "nothing to do" is decided on what the store holds.
    """
    for attempt in range(retries_max + 1):
        md, version = known if known is not None and attempt == 0 else store.read_ledger_metadata(ledger_id)
        new = transition(md)
        if known is not None and attempt == 0 and unchanged(md, new):
            md, version = store.read_ledger_metadata(ledger_id)
            new = transition(md)
        if unchanged(md, new):
            return md, version
        if new.ledger_id != ledger_id:
            raise ValueError(f"a transition of ledger {ledger_id} returned ledger {new.ledger_id}'s metadata")
        _check_tenancy_kept(md, new)
        try:
            return new, store.write_ledger_metadata(new, version)
        except BadVersionError:
            log.debug("ledger %d left version %d (attempt %d); retrying", ledger_id, version, attempt)
        if attempt < retries_max and backoff_ms > 0:
            time.sleep(random.uniform(0.5, 1.5) * backoff_ms * min(attempt + 1, 10) / 1000)
    raise MetadataUpdateConflictError(
        f"ledger {ledger_id}: metadata update lost the compare-and-set {retries_max + 1} times in a row; "
        "too many concurrent writers"
    )
