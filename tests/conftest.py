"""Shared fixtures: one real ZooKeeper per test session, a fresh chroot per test, real bookies."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledger_client  # noqa: F401  (before any test module imports grpc: sets gRPC's fork mode)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# Tiers whose tests run clusters of processes (bookies, ZooKeepers, Spark) and wait on them: with
# pytest-xdist (scripts/test: -n 2) they run one after another on one worker, as without it, while
# the pure-logic tiers (unit, sim, contract) run on the other: on CI's two cores those ~130 s of
# CPU-bound tests then overlap the clusters' waits instead of adding to them.
SERIAL_TIERS = frozenset({"integration", "spark"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Tests of SERIAL_TIERS as one unit of work, every other test as a unit of its own. (Not
    ``--dist loadgroup``: xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9
    no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ClustersInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/", 2)
            return "clusters" if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_TIERS else nodeid

    return ClustersInTurn(config, log)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real embedded ZooKeeper (pyspark's jars) for the whole session; yields host:port."""
    from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

    zk = EmbeddedZooKeeper(free_port(), tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    try:
        yield zk.connect_string
    finally:
        zk.stop()


@pytest.fixture
def zk_connect(zk_server: str) -> str:
    """A connect string with a chroot of its own, so tests never see each other's bookies."""
    return f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed for randomized tests, printed so a failure can be replayed (SPARK_BOOKIE_SEED=...)."""
    value = int(os.environ.get("SPARK_BOOKIE_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"\n[{request.node.name}] seed = {value}")
    return value


@pytest.fixture
def cluster_factory(zk_connect: str, tmp_path: Path) -> Iterator[object]:
    """Build Sandboxes of real bookie processes on the shared ZooKeeper; all stopped at teardown."""
    from spark_bookie.local.sandbox import Sandbox

    made: list[Sandbox] = []

    def make(bookies: int = 1, **settings: object) -> Sandbox:
        base = {"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000}
        base.update(settings)
        sb = Sandbox(tmp_path / f"cluster-{len(made)}", bookies, zk_connect=zk_connect,
                     bookie_settings=base)
        made.append(sb)
        sb.start()
        return sb

    yield make
    for sb in made:
        sb.stop()
