"""A bookie whose disk turned read-only (or writable again) moves its registration; a move that
fails, ZooKeeper being slow or away, is tried again: the disk's state does not change a second time
by itself, and a bookie with room left must not stay listed read-only (on the in-memory twin)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memory_bookie import started_bookie

import spark_bookie.server.bookie as bookie_module
from metadata import InMemoryMetadataStore, InMemoryZooKeeper
from metadata.errors import MetadataError

pytestmark = pytest.mark.unit


@pytest.fixture
def store() -> Iterator[InMemoryMetadataStore]:
    with InMemoryMetadataStore(InMemoryZooKeeper()) as s:
        s.cluster.init_cluster()
        yield s


def test_a_registration_move_that_failed_is_tried_again(store: InMemoryMetadataStore, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with started_bookie(store, tmp_path) as b:
        assert b.bookie_id in store.cluster.list_bookies()
        real, calls = store.cluster.register_bookie, []

        def away_once(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("readonly"))
            if len(calls) == 1:
                raise MetadataError("ZooKeeper away")
            return real(*args, **kwargs)

        monkeypatch.setattr(store.cluster, "register_bookie", away_once)
        monkeypatch.setattr(bookie_module, "REGISTRATION_RETRY_S", 0.05)
        monkeypatch.setattr(b._disk._state, "read_only", True)   # the disk turned read-only
        b._on_read_only_change(True)
        deadline = time.monotonic() + 10
        while b.bookie_id not in store.cluster.list_bookies(readonly=True) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.bookie_id in store.cluster.list_bookies(readonly=True)
        assert b.bookie_id not in store.cluster.list_bookies() and calls == [True, True]
