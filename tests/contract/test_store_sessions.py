"""The contract of a store's session, across its stores: closing, session events, and what every
call does while ZooKeeper is down (each backend has its own way to take "ZooKeeper" down)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from contract_helpers import Backend, Calls, Recorder, new_md

from metadata import (
    InMemoryMetadataStore,
    InMemoryZooKeeper,
    MetadataUnavailableError,
    SessionEvent,
    StoreClosedError,
    begin_recovery,
    connect,
    update_ledger,
)


# -- session and lifecycle ----------------------------------------------------------------------
def test_closed_store_refuses_calls(backend: Backend) -> None:
    s = backend.make()
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.cluster.list_bookies()


def test_context_manager_closes(backend: Backend) -> None:
    with backend.make() as s:
        s.cluster.init_cluster()
    with pytest.raises(StoreClosedError):
        s.cluster.instance_id()


# -- outages (each backend has its own way to take "ZooKeeper" down) ----------------------------
@pytest.mark.unit
def test_memory_outage_raises_and_recovers() -> None:
    zk = InMemoryZooKeeper()
    with InMemoryMetadataStore(zk) as s:
        s.cluster.init_cluster()
        events = Recorder()
        s.add_session_listener(events)
        s.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)
        zk.set_available(False)
        for call in (
            s.cluster.list_bookies,
            lambda: s.cluster.write_cookie("b:1", b"", None),
            s.ledgers.generate_ledger_id,
            lambda: s.ledgers.read_ledger_metadata(1),
            lambda: s.ledgers.watch_ledger_metadata(1, Calls()),
            lambda: s.cluster.watch_bookies(Calls()),
            lambda: s.cluster.bookie_info("b:1"),
        ):
            with pytest.raises(MetadataUnavailableError):
                call()
        zk.set_available(True)
        events.wait_for(SessionEvent.SUSPENDED, SessionEvent.CONNECTED)
        assert s.cluster.list_bookies() == ["b:1"]


@pytest.mark.unit
def test_memory_connect_factory() -> None:
    name = uuid.uuid4().hex
    with connect(f"memory://{name}/custom") as a, connect(f"memory://{name}/custom") as b:
        assert a.cluster.init_cluster() == b.cluster.instance_id()
        assert isinstance(a, InMemoryMetadataStore) and a.paths.root == "/custom"


@pytest.mark.integration
def test_zk_unreachable_fails_fast() -> None:
    from spark_bookie.local.zookeeper import free_port

    started = time.monotonic()
    with pytest.raises(MetadataUnavailableError, match="could not connect"):
        connect(f"127.0.0.1:{free_port()}", connect_timeout_ms=1000)
    assert time.monotonic() - started < 10


@pytest.mark.integration
def test_zk_down_gives_deadline_errors_and_session_survives_short_outage(tmp_path: Path) -> None:
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    zk = EmbeddedZooKeeper(free_port(), tmp_path / "zk", max_session_timeout_ms=60_000)
    zk.start()
    try:
        s = connect(zk.connect_string, session_timeout_ms=30_000, op_timeout_ms=1500)
        events = Recorder()
        s.add_session_listener(events)
        s.cluster.init_cluster()
        s.cluster.register_bookie("b:1", readonly=False, wait_ms_max=0)
        s.ledgers.create_ledger_metadata(new_md(1))
        watched = Calls()
        s.ledgers.watch_ledger_metadata(1, watched)
        watched.wait_for(1)
        zk.stop()
        events.wait_for(SessionEvent.SUSPENDED)
        for call in (
            s.cluster.list_bookies,
            s.ledgers.ledger_ids,
            lambda: s.cluster.write_cookie("b:1", b"", None),
            s.ledgers.generate_ledger_id,
            lambda: s.ledgers.read_ledger_metadata(1),
            lambda: update_ledger(s.ledgers, 1, begin_recovery),
            lambda: s.ledgers.watch_ledger_metadata(1, Calls()),
            lambda: s.cluster.watch_bookies(Calls()),
            lambda: s.cluster.bookie_info("b:1"),
        ):
            started = time.monotonic()
            with pytest.raises(MetadataUnavailableError):
                call()
            assert time.monotonic() - started < 5
        zk.start()  # same data dir: the session is still within its timeout
        events.wait_for(SessionEvent.SUSPENDED, SessionEvent.CONNECTED)
        assert "LOST" not in events.events
        assert s.cluster.list_bookies() == ["b:1"]
        update_ledger(s.ledgers, 1, begin_recovery)  # kazoo dropped the watch on suspension: re-armed
        assert watched.wait_for(2)[1][1] == 1
        s.close()
    finally:
        zk.stop()
