"""A started bookie on the in-memory metadata twin, for unit tests that drive its parts themselves
(its GC thread sleeps: a test runs GC rounds when it wants them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from metadata import InMemoryMetadataStore
from spark_bookie.local.zookeeper import free_port
from spark_bookie.server.bookie import Bookie
from spark_bookie.server.config import BookieConfig


@contextmanager
def started_bookie(store: InMemoryMetadataStore, root: Path) -> Iterator[Bookie]:
    cfg = BookieConfig(zk_connect="memory://unused", port=free_port(), journal_dirs=(str(root / "j"),),
                       ledger_dirs=(str(root / "l"),), gc_interval_ms=3_600_000).validate()
    (root / "j").mkdir()
    (root / "l").mkdir()
    b = Bookie(cfg, metadata=store)
    b.start()
    try:
        yield b
    finally:
        b.stop(grace_s=0.2)
