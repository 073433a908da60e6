"""A writer and a replication worker changing the same open ledger's metadata at the same time.

BookKeeper's HandleFailuresTest.testOldEnsembleChangedDuringFailureHandler: the writer's ensemble
change and the worker's bookie swap in an older fragment both go through the one CAS loop
(``metadata.update_ledger``), each re-reading and re-applying its own transition after losing the
race, so neither overwrites the other. The writer's transition here is the write handle's own
(``WriteHandle._with_fragment``), the worker's is ``recovery.plan.replace_in_fragment``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import partial
from types import SimpleNamespace

import pytest

from ledger_client import errors
from ledger_client.write_handle import WriteHandle
from metadata import DigestType, InMemoryMetadataStore, LedgerMetadata, LedgerState, close, update_ledger
from recovery.errors import OpenFragmentError
from recovery.plan import replace_in_fragment

pytestmark = pytest.mark.unit

B1, B2, B3, B4, B5, B6 = (f"b{i}:3181" for i in range(1, 7))


class Interfering:
    """Store wrapper: ``before_write(n)`` runs before the n-th write attempt (a racer slipping in
    between our read and our write)."""

    def __init__(self, store: InMemoryMetadataStore, before_write: Callable[[int], None]) -> None:
        self.store, self.before_write, self.writes = store, before_write, 0

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return self.store.ledgers.read_ledger_metadata(ledger_id)

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        self.writes += 1
        self.before_write(self.writes)
        return self.store.ledgers.write_ledger_metadata(md, version)


@pytest.fixture
def store() -> Iterator[InMemoryMetadataStore]:
    """Ledger 1, open, E3/Qw3/Qa2: fragment 0 on b1,b2,b3; b3 failed at entry 1 → fragment 1 on b1,b2,b4."""
    with InMemoryMetadataStore() as s:
        s.cluster.init_cluster()
        md = LedgerMetadata.new_open(1, [B1, B2, B3], write_quorum_size=3, ack_quorum_size=2,
                                     digest_type=DigestType.CRC32C, password=b"")
        s.ledgers.create_ledger_metadata(dataclasses.replace(md, ensembles={0: [B1, B2, B3], 1: [B1, B2, B4]}))
        yield s


def writer_change(key: int, ensemble: list[str]) -> Callable[[LedgerMetadata], LedgerMetadata]:
    """The transition WriteHandle._change_ensemble hands to the CAS loop."""
    handle = SimpleNamespace(ledger_id=1)
    return partial(WriteHandle._with_fragment, handle, key=key, ensemble=ensemble)  # type: ignore[arg-type]


def worker_swap(first: int, old: str, new: str) -> Callable[[LedgerMetadata], LedgerMetadata]:
    return partial(replace_in_fragment, first_entry_id=first, replacements={old: new})


def test_writer_ensemble_change_keeps_the_workers_swap_of_an_older_fragment(store):
    """The worker swaps b3 in fragment 0 while the writer's change (b1 failed at entry 2) is in flight."""
    def worker_slips_in(attempt: int) -> None:
        if attempt == 1:
            update_ledger(store.ledgers, 1, worker_swap(0, B3, B5))

    racing = Interfering(store, worker_slips_in)
    md, _ = update_ledger(racing, 1, writer_change(2, [B6, B2, B4]))
    assert racing.writes == 2   # lost the first CAS, re-read, re-applied
    assert md.ensembles == {0: [B1, B2, B5], 1: [B1, B2, B4], 2: [B6, B2, B4]}
    assert store.ledgers.read_ledger_metadata(1)[0] == md


def test_worker_swap_keeps_the_writers_new_fragment(store):
    def writer_slips_in(attempt: int) -> None:
        if attempt == 1:
            update_ledger(store.ledgers, 1, writer_change(2, [B6, B2, B4]))

    racing = Interfering(store, writer_slips_in)
    md, _ = update_ledger(racing, 1, worker_swap(0, B3, B5))
    assert racing.writes == 2
    assert md.ensembles == {0: [B1, B2, B5], 1: [B1, B2, B4], 2: [B6, B2, B4]}


def test_writer_in_place_change_of_its_empty_last_fragment_keeps_the_workers_swap(store):
    """A second failure before the new fragment's first entry replaces that fragment in place."""
    def worker_slips_in(attempt: int) -> None:
        if attempt == 1:
            update_ledger(store.ledgers, 1, worker_swap(0, B3, B5))

    racing = Interfering(store, worker_slips_in)
    md, _ = update_ledger(racing, 1, writer_change(1, [B1, B6, B4]))
    assert md.ensembles == {0: [B1, B2, B5], 1: [B1, B6, B4]}


def test_writer_close_keeps_the_workers_swap(store):
    def worker_slips_in(attempt: int) -> None:
        if attempt == 1:
            update_ledger(store.ledgers, 1, worker_swap(0, B3, B5))

    racing = Interfering(store, worker_slips_in)
    md, _ = update_ledger(racing, 1, partial(close, last_entry_id=5, length=60))
    assert md.is_closed and md.last_entry_id == 5
    assert md.ensembles == {0: [B1, B2, B5], 1: [B1, B2, B4]}


def test_worker_never_touches_the_writers_last_fragment(store):
    """Whatever it read before, the worker's transition refuses the live fragment on re-apply."""
    with pytest.raises(OpenFragmentError):
        update_ledger(store.ledgers, 1, worker_swap(1, B4, B5))
    assert store.ledgers.read_ledger_metadata(1)[0].ensembles[1] == [B1, B2, B4]


def test_writer_change_after_recovery_took_over_is_fenced(store):
    """The worker fences an open ledger by recovery: the writer's next change must not go through."""
    update_ledger(store.ledgers, 1, lambda md: dataclasses.replace(md, state=LedgerState.IN_RECOVERY))
    with pytest.raises(errors.LedgerFencedError):
        update_ledger(store.ledgers, 1, writer_change(2, [B6, B2, B4]))
