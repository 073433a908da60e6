"""Small helpers for driving real bookies from tests with the low-level transport."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType, master_key
from ledger_client.transport import BookieClient

PASSWORD = b"secret"
KEY = master_key(PASSWORD)
DIGEST = Digester(DigestType.CRC32C, PASSWORD)


@pytest.fixture(name="tmpfs")
def tmpfs_fixture() -> Iterator[Callable[[Path, int], Path]]:
    """``mount(path, size_mib)``: a small filesystem of its own at ``path`` (tmpfs; CI runs as root,
    as `mount` needs), unmounted at teardown. A test that watches disk usage needs one: the shared
    disk's usage moves with whatever else runs on the machine."""
    mounted: list[Path] = []

    def mount(path: Path, size_mib: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for p in reversed(mounted):
            subprocess.run(["umount", "-l", str(p)], check=False)


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    """Deterministic, entry-specific bytes, so a wrong or stale entry is always noticed."""
    head = f"{ledger_id}:{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


def body(ledger_id: int, entry_id: int, size: int = 100, lac: int | None = None) -> bytes:
    lac = entry_id - 1 if lac is None else lac
    return DIGEST.frame(ledger_id, entry_id, lac, (entry_id + 1) * size, payload(ledger_id, entry_id, size))


def add_all(client: BookieClient, ledger_id: int, entry_ids: Iterable[int], size: int = 100,
            key: bytes = KEY, recovery: bool = False) -> list[pb.AddResponse]:
    futs: list[Future[pb.AddResponse]] = [
        client.add(ledger_id, e, key, body(ledger_id, e, size), recovery=recovery) for e in entry_ids]
    return [f.result(timeout=60) for f in futs]


def check_entry(client: BookieClient, ledger_id: int, entry_id: int, size: int = 100) -> None:
    r = client.read(ledger_id, entry_id)
    assert r.status == pb.EOK, f"entry {ledger_id}/{entry_id}: {pb.StatusCode.Name(r.status)} {r.detail}"
    _lac, _len, data = DIGEST.unframe(r.body, ledger_id, entry_id)
    assert data == payload(ledger_id, entry_id, size)


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def dir_bytes(path: str | os.PathLike[str]) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def wait_closed_by_bookie(s: socket.socket) -> None:
    """Return once the bookie ended the connection (EOF or reset); TimeoutError after 10 s of it
    staying open."""
    s.settimeout(10)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass


def module_cluster(bookies: int, doc: str = "") -> Callable[..., Iterator[object]]:
    """A module-scoped `sb` fixture: one Sandbox of `bookies` real bookie processes on the session's
    ZooKeeper, under a chroot of its own (the tests of the module use namespaces of their own)."""

    @pytest.fixture(scope="module")
    def sb(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
        from spark_bookie.local.sandbox import Sandbox

        s = Sandbox(tmp_path_factory.mktemp("cluster"), bookies,
                    zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                    bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000})
        s.start()
        try:
            yield s
        finally:
            s.stop()

    sb.__doc__ = doc or f"{bookies} bookies for the module"
    return sb
