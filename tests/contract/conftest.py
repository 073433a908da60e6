"""The fixtures of the metadata stores' contract: every test runs against a real ZooKeeper and
against the in-memory twin.

The twin exists so higher layers can be tested fast; these tests are what keeps it honest. Each
test gets a fresh root (a chroot-like prefix), so tests never see each other's nodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from contract_helpers import Backend, memory_backend, zk_backend

from metadata import MetadataStore


@pytest.fixture(
    params=[pytest.param("memory", marks=pytest.mark.unit), pytest.param("zk", marks=pytest.mark.integration)]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    stores: list[MetadataStore] = []
    if request.param == "memory":
        yield memory_backend(stores)
    else:
        yield zk_backend(request.getfixturevalue("zk_server"), stores)
    for store in stores:
        store.close()


@pytest.fixture
def store(backend: Backend) -> MetadataStore:
    """An initialised cluster and one session on it."""
    s = backend.make()
    s.cluster.init_cluster()
    return s
