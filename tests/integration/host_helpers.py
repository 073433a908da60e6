"""Helpers for multi-host tests: a cluster fixture, clients running inside hosts, and the checks
every scenario ends with (acknowledged entries read back, readers agree on the end, placement)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from client_helpers import FAST, data

from ledger_client import LedgerClient
from metadata import MetadataStore
from spark_bookie.local.hosts import NETNS, Host, namespaces_unavailable
from spark_bookie.local.multihost import MultiHostCluster

AGENTS = Path(__file__).with_name("host_agents.py")


def require_namespaces() -> None:
    """Skip (saying why) where partitions cannot be made: not root, no ip, no nft."""
    import shutil

    why = namespaces_unavailable() or (None if shutil.which("nft") else "no nft (scripts/bootstrap installs it)")
    if why:
        pytest.skip(f"multi-host faults need network namespaces: {why}")


def start_cluster(root: Path, hosts: int, **kwargs: object) -> MultiHostCluster:
    cluster = MultiHostCluster(root, hosts, **kwargs)  # type: ignore[arg-type]
    cluster.start()
    print(f"\nhosts: {cluster.hosts.mode}, ZooKeeper {cluster.connect_string}, "
          f"bookies {[b.bookie_id for b in cluster.bookies]}")
    return cluster


@pytest.fixture(name="multihost")
def multihost_fixture(tmp_path: Path) -> Iterator[Callable[..., MultiHostCluster]]:
    """Build one MultiHostCluster (namespaces required); always torn down, namespaces included."""
    made: list[MultiHostCluster] = []

    def make(hosts: int, **kwargs: object) -> MultiHostCluster:
        require_namespaces()
        cluster = start_cluster(tmp_path / f"mh-{len(made)}", hosts, **kwargs)
        made.append(cluster)
        assert cluster.hosts.mode == NETNS
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


class Agent:
    """A host_agents.py command running inside a host; its output lines collected as they come."""

    def __init__(self, host: Host, *args: object) -> None:
        self.host = host
        self.lines: list[str] = []
        self._cond = threading.Condition()
        cmd = host.wrap([sys.executable, str(AGENTS), *map(str, args)])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, cwd=AGENTS.parent, start_new_session=True)
        host.procs.append(self.proc)  # type: ignore[arg-type]  (killed with its host)
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def events(self, kind: str) -> list[list[str]]:
        with self._cond:
            return [line.split()[1:] for line in self.lines if line.split()[:1] == [kind]]

    def wait_for(self, pred: Callable[[Agent], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not pred(self):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not pred(self)):
                    tail = "\n".join(self.lines[-20:])
                    raise AssertionError(f"agent on {self.host.name}: timed out or exited waiting for {what}; "
                                         f"last output:\n{tail}")
                self._cond.wait(min(left, 0.5))

    def acked(self) -> list[int]:
        return [int(e[0]) for e in self.events("ack")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def client(cluster: MultiHostCluster, **overrides: object) -> LedgerClient:
    from ledger_client import ClientConfig

    return LedgerClient(cluster.connect_string, config=ClientConfig(**{**FAST.__dict__, **overrides}))


def check_ledger(c: LedgerClient, ledger_id: int, acked: list[int], readers: list[Agent] = ()) -> int:
    """The ledger is closed at an end >= every acknowledged id, every entry up to the end reads back
    byte for byte, and every reader agent reports the same end and verified all of it."""
    md = c.ledger_metadata(ledger_id)
    assert md.is_closed, f"ledger {ledger_id} is {md.state}"
    end = md.last_entry_id
    assert not acked or max(acked) <= end, f"acknowledged entry {max(acked)} beyond the closed end {end}"
    r = c.open_ledger(ledger_id, recovery=False)
    for first in range(0, end + 1, 500):
        for entry in r.read(first, min(first + 499, end)):
            assert entry.data == data(ledger_id, entry.entry_id), f"entry {entry.entry_id} differs"
    for agent in readers:
        agent.wait_for(lambda a: bool(a.events("verified") or a.events("fail")), 120, "a verified read")
        assert agent.events("end") == [[str(end)]], (agent.host.name, agent.lines[-5:])
        assert agent.events("verified") == [[str(end + 1)]], (agent.host.name, agent.lines[-5:])
    return end


def check_placement(cluster: MultiHostCluster, store: MetadataStore | None = None) -> int:
    """No two copies of any entry on one host: every fragment's ensemble names distinct hosts
    (ensembles never exceed the hosts with bookies in these tests, so distinct is always possible).
    Returns the number of fragments checked."""
    store = store or cluster.store
    assert store is not None
    fragments = 0
    for lid in store.ledgers.list_ledgers():
        md = store.ledgers.read_ledger_metadata(lid)[0]
        for first, ensemble in md.ensembles.items():
            hosts = [cluster.host_of(b).name for b in ensemble]
            assert len(set(hosts)) == len(hosts), f"ledger {lid} fragment {first}: {ensemble} on hosts {hosts}"
            fragments += 1
    return fragments


def assert_fenced_on_every_bookie(c: LedgerClient, ledger_id: int, writer: Agent) -> None:
    """What "the old writer gets no more acks" rests on, checked on the bookies themselves: in the
    fragment the writer writes to (its "ensemble" event), every write set has fewer than Qa bookies
    that still take a plain (non-recovery) add past the end, as the old writer's next add would be.
    Recovery need not fence every bookie (one it could not reach stays unfenced), only enough that no
    write set can reach Qa acks. The ledger's last fragment is not the one to check: a recovery's
    rewrite may replace a bookie there, unfenced, that the old writer never learns of (seed
    3136509107 found it so)."""
    from ledger_client.machines import write_set
    from ledger_client.protocol import bookkeeper_pb2 as pb
    from ledger_client.protocol.framing import Digester, DigestType, master_key
    from ledger_client.transport import BookieClient

    md = c.ledger_metadata(ledger_id)
    said = writer.events("ensemble")
    assert said, "the writer said no ensemble (it says one at its first failure and when done)"
    key, ensemble = int(said[-1][0]), said[-1][1:]
    assert md.ensembles.get(key) == ensemble or key > md.last_entry_id, \
        f"the writer's fragment {key} {ensemble} is not in the closed ledger's {md.ensembles}"
    entry = md.last_entry_id + 1
    body = Digester(DigestType.CRC32C, b"").frame(ledger_id, entry, md.last_entry_id, md.length + 4, b"late")
    takes_adds = set()
    for bookie in ensemble:
        with BookieClient(bookie) as bc:
            resp = bc.add(ledger_id, entry, master_key(b""), body).result(timeout=60)
        assert resp.status in (pb.EOK, pb.EFENCED), f"{bookie}: {pb.StatusCode.Name(resp.status)}"
        if resp.status == pb.EOK:
            takes_adds.add(bookie)
    for e in range(md.ensemble_size):
        open_in_set = [ensemble[i] for i in write_set(e, md.ensemble_size, md.write_quorum_size)
                       if ensemble[i] in takes_adds]
        assert len(open_in_set) < md.ack_quorum_size, f"write set of entry {e} could still ack: {open_in_set}"
