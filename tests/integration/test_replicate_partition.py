"""`spark-bookie replicate` across a partition between two clusters on network-namespace hosts
(DESIGN §4.12, invariant 13; issue 31).

Cluster A: bookies on h1 and h2, its ZooKeeper on the gateway (the harness's). Cluster B: bookies
on h3 and h4, a ZooKeeper of its own on the gateway (another port), as a second data centre has.
The replicator (`spark-bookie replicate`, Spark in local mode) runs inside h5. A client on the
gateway writes to A all along. h5 is then cut for a seeded 10-15 s, while A keeps taking records
(and a stream is created on A), in one of two seeded shapes:

- from B's bookie hosts only: its tasks' writes to B wait;
- from B's bookie hosts and B's ZooKeeper: its query fails (a micro-batch's sink cannot reach B)
  and the replicator restarts it on its checkpoint with a back-off (jobs/replicate._supervise).

In both the replicator process must ride it out: it never exits.

Healed, B must end with exactly A's records: same order, txids and payloads, nothing twice; at
every look before that each replica is a prefix of its source; and the running replicator's
status.json shows no lag. SPARK_BOOKIE_SEED=N replays a run (shape, window, records).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from client_helpers import FAST
from host_helpers import multihost_fixture  # noqa: F401  (the `multihost` fixture)

from ledger_client import ClientConfig, LedgerClient
from spark_bookie.local.hosts import Host
from spark_bookie.local.multihost import BOOKIE_PORT, HostBookie, MultiHostCluster
from spark_bookie.local.processes import stop_session
from spark_bookie.local.sandbox import connect_as_bookies, init_layout, stop_cluster
from spark_bookie.local.zookeeper import EmbeddedZooKeeper, free_port

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(480)]

NS = "ns"
NS_SETTINGS = {"ensemble_size": 2, "write_quorum_size": 2, "ack_quorum_size": 2, "retention_ms": None,
               "segment_rolling_bytes": 20_000, "output_buffer_bytes": 2_000}
RATE_PER_S = 50            # records a second into each stream being fed
SHAPES = {   # the partition, chosen by the seed
    "bookies": "B's bookie hosts only (B's ZooKeeper in reach): its writes to B wait",
    "bookies+zookeeper": "B's bookie hosts and B's ZooKeeper: its query fails and is restarted on its checkpoint",
}
RESTARTED = "restarting on its checkpoint"   # what the replicator logs when it restarts its failed query


def cfg() -> ClientConfig:
    return ClientConfig(**FAST.__dict__)


class ClusterB:
    """A second cluster on the same hosts' bridge: its own ZooKeeper on the gateway, a bookie on
    each of ``hosts`` (the harness's MultiHostCluster is cluster A)."""

    def __init__(self, a: MultiHostCluster, hosts: list[Host], root: Path) -> None:
        self.hosts = hosts
        self.zk = EmbeddedZooKeeper(free_port(), root / "zookeeper-b", host=a.hosts.gateway)
        self.bookies: list[HostBookie] = []
        self.store = None
        self.settings = dict(a.settings)

    def start(self) -> ClusterB:
        try:
            if not self.zk.running:
                self.zk.start()
            self.store = connect_as_bookies(self.zk.connect_string, self.settings)
            init_layout(self.store, self.settings)
            for host in self.hosts:
                b = HostBookie(self.zk.connect_string, BOOKIE_PORT, host.root / "bookie-b", dict(self.settings),
                               host=host)
                self.bookies.append(b)
                host.services.append(b)
                b.start()
            for b in self.bookies:
                b.wait_registered(self.store)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_cluster(self.bookies, self.store, self.zk)
        self.store = None


class HostReplicator:
    """`spark-bookie replicate` inside a host (so a partition cuts it), its output in a log file."""

    def __init__(self, host: Host, zk_a: str, zk_b: str, streams: str, checkpoint: Path) -> None:
        self.host = host
        self.args = [sys.executable, "-m", "spark_bookie", "replicate", "--from", zk_a, "--to", zk_b,
                     "--streams", streams, "--checkpoint", str(checkpoint), "--metrics-port", "0",
                     "--trigger-interval-ms", "200"]
        self.checkpoint = checkpoint
        self.log = checkpoint.parent / "replicate.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._since = 0

    def launch(self) -> HostReplicator:
        """Start the process (Spark takes a while: ``wait_ready``)."""
        # Spark binds its driver to SPARK_LOCAL_IP: the host's own address, as on a real machine
        # (in local mode the namespace's loopback works too: driver and Python workers are local)
        env = {**os.environ, "SPARK_LOCAL_IP": self.host.address, "PYSPARK_PYTHON": sys.executable}
        self._since = self.log.stat().st_size if self.log.exists() else 0
        self.proc = self.host.popen(self.args, log_path=self.log, env=env, cwd=self.checkpoint.parent)
        return self

    def wait_ready(self, timeout_s: float = 180) -> HostReplicator:
        """Until it says it replicates (its query started); AssertionError if it exits first."""
        assert self.proc is not None
        wait_for(lambda: "replicating " in self.output() or self.proc.poll() is not None, timeout_s,
                 "the replicator to start", self.tail)
        return self.alive()

    def start(self) -> HostReplicator:
        return self.launch().wait_ready()

    def alive(self) -> HostReplicator:
        """AssertionError (with its log's tail) if it exited."""
        assert self.proc is not None and self.proc.poll() is None, \
            f"the replicator exited {self.exited()}:\n{self.tail()}"
        return self

    def output(self) -> str:
        """This run's output (since the last start)."""
        with open(self.log, "rb") as f:
            f.seek(self._since)
            return f.read().decode(errors="replace")

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> int | None:
        """SIGTERM (the query stops between batches); SIGKILL to its session after 60 s."""
        rc = stop_session(self.proc)
        assert rc != -signal.SIGKILL, f"the replicator ignored SIGTERM for 60 s:\n{self.tail()}"
        return rc

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def status(self) -> dict:
        try:
            return json.loads((self.checkpoint / "status.json").read_text())
        except (OSError, ValueError):
            return {}


class Feeder:
    """Writes records into streams of A from a thread, ~RATE_PER_S a second per stream: distinct
    payloads, txids that jump now and then (seeded). ``failure`` holds a write's error, if any."""

    def __init__(self, ns, rng: random.Random) -> None:
        self.ns, self.rng = ns, rng
        self.writers: dict[str, object] = {}
        self.counts: dict[str, int] = {}
        self._txid: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def add(self, stream: str) -> None:
        with self._lock:
            self.writers[stream] = self.ns.open_writer(stream)
            self.counts[stream], self._txid[stream] = 0, 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        chunk = max(1, RATE_PER_S // 10)
        try:
            while not self._stop.wait(0.1):
                with self._lock:
                    for stream in list(self.writers):
                        self._write(stream, chunk)
        except BaseException as e:   # noqa: BLE001 (A is never cut from the test: the test fails on it)
            self.failure = e

    def _write(self, stream: str, count: int) -> None:
        w, futs = self.writers[stream], []
        for _ in range(count):
            self._txid[stream] += self.rng.choice((1, 1, 1, 7))
            i = self.counts[stream]
            payload = f"{stream}-{i}-".encode() + self.rng.randbytes(self.rng.randrange(0, 120))
            futs.append(w.write_async(payload, txid=self._txid[stream]))
            self.counts[stream] = i + 1
        for f in futs:
            f.result(60)

    def written(self, stream: str) -> int:
        with self._lock:
            return self.counts[stream]

    def halt(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the feeder is stuck writing to A"
        for w in self.writers.values():
            w.close()
        if self.failure is not None:
            raise AssertionError(f"a write to A failed: {self.failure!r}") from self.failure


def records(ns, stream: str, timeout_s: float = 60) -> list[tuple[int, bytes]]:
    """The stream's records from its start to its end as of now: (txid, payload). Bounded by the
    end read first, since reading "until nothing comes" never ends on a stream written all along."""
    if not ns.stream_exists(stream):
        return []
    last = ns.stream_info(stream).last_dlsn
    got: list = []
    if last is None:
        return got
    deadline = time.monotonic() + timeout_s
    with ns.open_reader(stream) as r:
        while not got or got[-1].dlsn < last:
            assert time.monotonic() < deadline, f"{stream}: {len(got)} records in {timeout_s:g} s, not to {last}"
            got += r.read_batch(100_000, 300)
    return [(rec.txid, rec.payload) for rec in got if rec.dlsn <= last]


def namespace_or_none(client: LedgerClient, name: str):
    from ledger_client import errors

    try:
        return client.namespace(name)
    except errors.NoSuchNamespaceError:
        return None


def wait_for(pred, timeout_s: float, what: str, diag=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{diag()}")
        time.sleep(0.3)


def check_prefix(a_ns, b_ns, stream: str) -> tuple[int, int]:
    """B's replica is a prefix of A's stream, now; (records in B, records in A)."""
    dst = records(b_ns, stream)
    src = records(a_ns, stream)   # read second: its end is past every record B copied
    if dst != src[:len(dst)]:
        at = next((i for i in range(min(len(src), len(dst))) if src[i] != dst[i]), min(len(src), len(dst)))
        raise AssertionError(f"{stream}: the replica is not a prefix of its source: {len(src)} source records, "
                             f"{len(dst)} in the replica, first difference at {at}: source {src[at:at + 2]!r:.200} "
                             f"replica {dst[at:at + 2]!r:.200}")
    return len(dst), len(src)


def count(ns, stream: str) -> int:
    """The stream's records now, from its metadata (and its segment in progress's LAC): cheap."""
    if not ns.stream_exists(stream):
        return 0
    return sum(seg.record_count for seg in ns.stream_info(stream).segments)


def test_replicator_partitioned_from_b_heals_and_catches_up(multihost, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    window_s = rng.uniform(10, 15)
    shape = rng.choice(sorted(SHAPES))
    t0 = time.monotonic()

    def at() -> str:
        return f"[{time.monotonic() - t0:5.1f} s]"

    a = multihost(5, bookie_hosts=2)   # A: bookies on h1, h2; its ZooKeeper on the gateway
    hosts = a.hosts
    b_hosts, rep_host = [hosts[3], hosts[4]], hosts[5]
    b = ClusterB(a, b_hosts, tmp_path)
    rep = HostReplicator(rep_host, a.connect_string, b.zk.connect_string, f"{NS}/*", tmp_path / "ck")
    feeder: Feeder | None = None
    ca = cb = None
    try:
        b.zk.start()
        rep.launch()   # Spark starts while B's bookies do: it needs only the two ZooKeepers yet
        b.start()
        print(f"{at()} A: ZooKeeper {a.connect_string}, bookies {[x.bookie_id for x in a.bookies]}; "
              f"B: ZooKeeper {b.zk.connect_string}, bookies {[x.bookie_id for x in b.bookies]}; "
              f"replicator on {rep_host.name} {rep_host.address}\n  partition ({shape}) for {window_s:.1f} s: "
              f"from {SHAPES[shape]}")
        ca, cb = LedgerClient(a.connect_string, config=cfg()), LedgerClient(b.zk.connect_string, config=cfg())
        a_ns = ca.create_namespace(NS, **NS_SETTINGS)
        feeder = Feeder(a_ns, rng)
        feeder.add("orders")
        feeder.start()
        rep.wait_ready()
        print(f"{at()} replicator up")
        wait_for(lambda: rep.alive() and namespace_or_none(cb, NS) is not None, 120, f"namespace {NS} on B",
                 rep.tail)
        b_ns = cb.namespace(NS)
        wait_for(lambda: rep.alive() and count(b_ns, "orders") >= RATE_PER_S, 120, "B to hold the first records",
                 rep.tail)
        before = check_prefix(a_ns, b_ns, "orders")
        print(f"{at()} replicating: B holds {before[0]} of A's {before[1]} records")

        # the partition: h5 cut from B's bookie hosts (and B's ZooKeeper); A is still in reach
        faults = hosts.faults
        faults.partition([rep_host], b_hosts)
        if shape == "bookies+zookeeper":
            faults.isolate_from([rep_host], hosts.gateway, b.zk.port)
        cut_at, checked_at = time.monotonic(), 0.0
        late_added, died = False, None
        while (left := window_s - (time.monotonic() - cut_at)) > 0:
            if not late_added and left < window_s / 2:
                feeder.add("late")   # a stream that appears on A while B is out of reach
                late_added = True
            if rep.exited() is not None and died is None:
                died = f"exited {rep.exited()} {time.monotonic() - cut_at:.1f} s into the partition"
            if time.monotonic() - checked_at > 3:
                check_prefix(a_ns, b_ns, "orders")
                checked_at = time.monotonic()
            time.sleep(min(0.5, max(left, 0)))
        during = check_prefix(a_ns, b_ns, "orders")
        faults.heal()
        healed_at = time.monotonic()
        print(f"{at()} healed after {healed_at - cut_at:.1f} s: B went {before[0]} -> {during[0]} records "
              f"meanwhile, A {before[1]} -> {during[1]}; the replicator "
              + (died or ("exited " + str(rep.exited()) if rep.exited() is not None else "is alive")))

        last_check = [time.monotonic()]

        def going(*streams: str) -> bool:
            """The replicator runs (it never exits), and every few seconds each replica is still a prefix."""
            rc = rep.exited()
            assert rc is None, f"the replicator exited {rc} after a partition ({shape}):\n{rep.tail()}"
            if time.monotonic() - last_check[0] > 5:
                for s in streams:
                    check_prefix(a_ns, b_ns, s)
                last_check[0] = time.monotonic()
            return True

        # records written after the heal reach B while A still takes more: copying resumed
        mark = feeder.written("orders")
        wait_for(lambda: going("orders") and count(b_ns, "orders") > mark, 180,
                 "B to copy records written after the heal", rep.tail)
        print(f"{at()} copying again, {time.monotonic() - healed_at:.1f} s after the heal")
        feeder.stop()
        for stream in ("orders", "late"):
            want = feeder.written(stream)
            wait_for(lambda s=stream, n=want: going(s) and count(b_ns, s) >= n, 120,
                     f"B's {stream} to hold A's {want} records", rep.tail)
            src, dst = records(a_ns, stream), records(b_ns, stream)
            assert len(src) == want, f"{stream}: A holds {len(src)} records, {want} were acknowledged"
            if dst != src:
                check_prefix(a_ns, b_ns, stream)   # says where they differ, if they do
                raise AssertionError(f"{stream}: B holds {len(dst)} records, A {len(src)}")
            assert len({p for _, p in dst}) == len(dst), f"{stream}: a record copied twice"
        print(f"{at()} caught up {time.monotonic() - healed_at:.1f} s after the heal: B holds A's "
              f"{feeder.written('orders')} + {feeder.written('late')} records exactly; the replicator "
              + ("restarted its query" if RESTARTED in rep.output() else "rode the partition out in one query"))

        # the monitor of the running replicator sees both streams caught up too
        pid = rep.proc.pid if rep.proc else None

        def no_lag() -> bool:
            st = rep.status()
            return st.get("pid") == pid and {k: v["lag_records"] for k, v in st.get("streams", {}).items()} == {
                f"{NS}/orders": 0, f"{NS}/late": 0}

        wait_for(lambda: going() and no_lag(), 30, "status.json to show no lag", lambda: json.dumps(rep.status()))
        assert rep.stop() == 0, rep.tail()
        print(f"{at()} done")
    finally:
        if feeder is not None:
            feeder.halt()
        if rep.exited() is None and rep.proc is not None:
            os.killpg(rep.proc.pid, signal.SIGKILL)
            rep.proc.wait(30)
        for c in (ca, cb):
            if c is not None:
                c.close()
        b.stop()
