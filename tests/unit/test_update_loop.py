"""The CAS update loop: lost races are retried through the transition, never overwritten."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from metadata import (
    BadVersionError,
    DigestType,
    InMemoryMetadataStore,
    LedgerClosedConflict,
    LedgerMetadata,
    LedgerState,
    MetadataUpdateConflictError,
    NoNodeError,
    begin_recovery,
    close,
    replace_bookie,
    set_fragment,
    update_ledger,
)

pytestmark = pytest.mark.unit

B = ["b1:1", "b2:1", "b3:1"]
C = ["b4:1", "b5:1", "b6:1"]


class Interfering:
    """A store wrapper whose writes first run ``before_write`` (another writer slipping in
    between our read and our write), and which counts the writes attempted."""

    def __init__(self, store: InMemoryMetadataStore, before_write: Callable[[int], None]) -> None:
        self.store = store
        self.before_write = before_write
        self.writes = 0
        self.reads = 0

    def read_ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        self.reads += 1
        return self.store.ledgers.read_ledger_metadata(ledger_id)

    def write_ledger_metadata(self, md: LedgerMetadata, version: int) -> int:
        self.writes += 1
        self.before_write(self.writes)
        return self.store.ledgers.write_ledger_metadata(md, version)


@pytest.fixture
def store() -> Iterator[InMemoryMetadataStore]:
    with InMemoryMetadataStore() as s:
        s.cluster.init_cluster()
        md = LedgerMetadata.new_open(
            1, B, write_quorum_size=2, ack_quorum_size=2, digest_type=DigestType.CRC32, password=b"p"
        )
        s.ledgers.create_ledger_metadata(md)
        yield s


def test_no_change_writes_nothing(store: InMemoryMetadataStore) -> None:
    wrapped = Interfering(store, lambda n: None)
    md, version = update_ledger(wrapped, 1, lambda m: m)
    assert (wrapped.writes, version) == (0, 0)
    recovering, version = update_ledger(wrapped, 1, begin_recovery)
    assert recovering.state is LedgerState.IN_RECOVERY and version == 1
    again, version = update_ledger(wrapped, 1, begin_recovery)  # already: nothing to write
    assert again == recovering and version == 1 and wrapped.writes == 1


def test_lost_race_is_retried_and_both_changes_survive(store: InMemoryMetadataStore) -> None:
    def other_writer(attempt: int) -> None:
        if attempt == 1:  # someone changes the ensemble between our read and our write
            update_ledger(store.ledgers, 1, partial(set_fragment, first_entry_id=5, bookies=C))

    wrapped = Interfering(store, other_writer)
    md, version = update_ledger(wrapped, 1, partial(replace_bookie, first_entry_id=0, old_bookie="b2:1",
                                                    new_bookie="n:1"))
    assert wrapped.writes == 2 and wrapped.reads == 2
    assert md.ensembles == {0: ["b1:1", "n:1", "b3:1"], 5: C}  # both changes
    assert store.ledgers.read_ledger_metadata(1) == (md, version) and version == 2


def _closes_first(store: InMemoryMetadataStore, last_entry_id: int, length: int) -> Callable[[int], None]:
    """A recovery that closes the ledger between the writer's read and its write."""

    def interfere(attempt: int) -> None:
        if attempt == 1:
            update_ledger(store.ledgers, 1, partial(close, last_entry_id=last_entry_id, length=length))

    return interfere


def test_close_racing_a_close_at_the_same_end_succeeds(store: InMemoryMetadataStore) -> None:
    """The transition decides again on the fresh metadata: already closed at our end is success."""
    wrapped = Interfering(store, _closes_first(store, 9, 90))
    md, version = update_ledger(wrapped, 1, partial(close, last_entry_id=9, length=90))
    assert md.is_closed and (md.last_entry_id, md.length, version) == (9, 90, 1)
    assert wrapped.writes == 1  # the lost write was not repeated: nothing left to change


def test_close_racing_a_close_at_another_end_conflicts(store: InMemoryMetadataStore) -> None:
    """BookKeeper's close rule: the loser never overwrites the winner's end."""
    wrapped = Interfering(store, _closes_first(store, 7, 70))
    with pytest.raises(LedgerClosedConflict, match="already closed at entry 7"):
        update_ledger(wrapped, 1, partial(close, last_entry_id=9, length=90))
    assert store.ledgers.read_ledger_metadata(1)[0].last_entry_id == 7


def test_gives_up_after_retries_max(store: InMemoryMetadataStore) -> None:
    bumps = iter(range(5, 1000))

    def always_interfere(attempt: int) -> None:
        update_ledger(store.ledgers, 1, partial(set_fragment, first_entry_id=next(bumps), bookies=C))

    wrapped = Interfering(store, always_interfere)
    with pytest.raises(MetadataUpdateConflictError, match="4 times") as info:
        update_ledger(wrapped, 1, begin_recovery, retries_max=3, backoff_ms=0)
    assert wrapped.writes == 4
    assert isinstance(info.value, BadVersionError)
    assert store.ledgers.read_ledger_metadata(1)[0].state is LedgerState.OPEN


def test_errors_propagate(store: InMemoryMetadataStore) -> None:
    with pytest.raises(NoNodeError, match="ledger 99"):
        update_ledger(store.ledgers, 99, begin_recovery)
    with pytest.raises(ValueError, match="ledger 2's"):
        update_ledger(store.ledgers, 1, lambda m: dataclasses.replace(m, ledger_id=2))


def test_concurrent_writers_all_land(store: InMemoryMetadataStore) -> None:
    """Many threads each append a fragment; the CAS loop serialises them without losing one."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            update_ledger(store.ledgers, 1, partial(_append_if_higher, first=10 * (i + 1)), retries_max=100)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    md, version = store.ledgers.read_ledger_metadata(1)
    assert md.ensembles[0] == B
    assert 1 <= version <= 8  # each thread either wrote or found a higher key already there


def _append_if_higher(md: LedgerMetadata, first: int) -> LedgerMetadata:
    last = max(md.ensembles)
    return set_fragment(md, first, C) if first > last else md


def test_a_known_version_writes_without_reading(store: InMemoryMetadataStore) -> None:
    """A writer closing its own ledger knows (metadata, version): one write, no read."""
    wrapped = Interfering(store, lambda n: None)
    known = store.ledgers.read_ledger_metadata(1)
    md, version = update_ledger(wrapped, 1, partial(close, last_entry_id=-1, length=0), known=known)
    assert md.is_closed and version == 1 and (wrapped.reads, wrapped.writes) == (0, 1)


def test_a_stale_known_version_loses_its_cas_and_decides_again(store: InMemoryMetadataStore) -> None:
    """Someone closed it meanwhile at another end: the stale guess never overwrites that."""
    known = store.ledgers.read_ledger_metadata(1)
    update_ledger(store.ledgers, 1, partial(close, last_entry_id=7, length=70))
    wrapped = Interfering(store, lambda n: None)
    with pytest.raises(LedgerClosedConflict, match="already closed at entry 7"):
        update_ledger(wrapped, 1, partial(close, last_entry_id=9, length=90), known=known)
    assert (wrapped.reads, wrapped.writes) == (1, 1)
    assert store.ledgers.read_ledger_metadata(1)[0].last_entry_id == 7


def test_nothing_to_do_on_a_known_version_is_checked_against_the_store(store: InMemoryMetadataStore) -> None:
    """"Unchanged" on a guess proves nothing: the store's metadata decides."""
    stale = store.ledgers.read_ledger_metadata(1)
    recovering, _ = update_ledger(store.ledgers, 1, begin_recovery)
    md, version = update_ledger(store.ledgers, 1, lambda m: m, known=stale)
    assert md == recovering and version == 1
