"""What the contract tests of the metadata stores share: the two backends (a real ZooKeeper and
the in-memory twin; the fixtures are in conftest.py) and the helpers that wait for callbacks and
session events.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metadata import DigestType, InMemoryMetadataStore, InMemoryZooKeeper, LedgerMetadata, MetadataStore, connect

SESSION_TIMEOUT_MS = 2000  # the smallest the embedded ZooKeeper allows (its min_session_timeout_ms)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Backend:
    """How a test makes stores of one cluster, and simulates failures, for one implementation."""

    kind: str
    make: Callable[[], MetadataStore]  # a new store (= a new session) on the test's root
    hold_registration: Callable[[str], Callable[[], None]]  # another live session registers an id;
    #                                                         returns "kill -9 that process"
    expire: Callable[[MetadataStore], None]  # expire a store's session on the server side


def memory_backend(stores: list[MetadataStore]) -> Backend:
    zk = InMemoryZooKeeper(session_timeout_ms=SESSION_TIMEOUT_MS)
    root = f"/t-{uuid.uuid4().hex[:8]}/ledgers"

    def make() -> MetadataStore:
        store = InMemoryMetadataStore(zk, root=root)
        stores.append(store)
        return store

    def hold(bookie_id: str) -> Callable[[], None]:
        other = InMemoryMetadataStore(zk, root=root)
        other.cluster.register_bookie(bookie_id, readonly=False, wait_ms_max=0)
        return other.crash

    def expire(store: MetadataStore) -> None:
        assert isinstance(store, InMemoryMetadataStore)
        store.expire_session()

    return Backend("memory", make, hold, expire)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from metadata.zk.store import ZkMetadataStore
    store = ZkMetadataStore(sys.argv[1], session_timeout_ms=int(sys.argv[3]))
    store.cluster.register_bookie(sys.argv[2], readonly=False, wait_ms_max=0)
    print("registered", flush=True)
    time.sleep(600)
    """
)


def zk_backend(hosts: str, stores: list[MetadataStore]) -> Backend:
    connect_string = f"{hosts}/t-{uuid.uuid4().hex[:8]}/ledgers"

    def make() -> MetadataStore:
        store = connect(connect_string, session_timeout_ms=SESSION_TIMEOUT_MS, op_timeout_ms=5000)
        stores.append(store)
        return store

    def hold(bookie_id: str) -> Callable[[], None]:
        """A real other process holds the registration; kill -9 leaves its session to time out."""
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, connect_string, bookie_id, str(SESSION_TIMEOUT_MS)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"

        def kill() -> None:
            proc.kill()
            proc.wait()

        return kill

    def expire(store: MetadataStore) -> None:
        """Expire the store's session as a long partition would (kazoo stays under metadata/zk/)."""
        from metadata.zk.testing import expire_session

        expire_session(store, timeout_s=SESSION_TIMEOUT_MS / 1000)

    return Backend("zk", make, hold, expire)


ENSEMBLE = ["b1:3181", "b2:3181", "b3:3181"]


def new_md(ledger_id: int, **custom: bytes) -> LedgerMetadata:
    return LedgerMetadata.new_open(
        ledger_id, ENSEMBLE, write_quorum_size=3, ack_quorum_size=2, digest_type=DigestType.CRC32C,
        password=b"pw", custom_metadata=custom,
    )


# -- waiting for what callbacks report -----------------------------------------------------------
def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


class Recorder:
    """A session listener that records events and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, event: str) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, *expected: str, timeout_s: float = 30.0) -> None:
        """Wait until ``expected`` occurred in this order (other events may come between)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not _is_subsequence(list(expected), self.events):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"expected {expected} in order, got {self.events}"
                self._cond.wait(remaining)


class Calls:
    """A watch callback that records its calls (and the thread they came on) for a test to wait on."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.threads: set[str] = set()
        self._cond = threading.Condition()

    def __call__(self, *args: Any) -> None:
        with self._cond:
            self.calls.append(args)
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.calls) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"expected {count} calls, got {self.calls}"
                self._cond.wait(remaining)
            return list(self.calls)


class Events:
    """Records one-argument callback calls (and the threads they came on); a test waits for a condition."""

    def __init__(self) -> None:
        self.calls: list[object] = []
        self.threads: set[str] = set()
        self.cond = threading.Condition()

    def __call__(self, value: object) -> None:
        with self.cond:
            self.calls.append(value)
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()

    def wait_until(self, predicate: Callable[[list[object]], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not predicate(self.calls):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"condition not met; calls so far: {self.calls}"
                self.cond.wait(remaining)
