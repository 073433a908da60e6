"""Placement groups end to end (DESIGN §4.10), on one cluster of real bookie processes: three
"gold" and two "silver" bookies, an auditor process with a fast placement check (HTTP for its
metrics and the under-replication list) and, when a test needs one, a replication worker process.

The tests run in order on the same cluster (each leaves every bookie up): segments land on gold;
a gold bookie SIGKILLed during writes is replaced by gold; its sealed segments are re-replicated
onto gold; moving the namespace to silver makes the auditor count and mark every sealed segment,
the worker moves them, and nothing stays marked; a group without bookies is reported by `cluster
status`, and ledgers that cannot be moved stay marked while the worker backs off."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from autorecovery_helpers import AutoRecoveryProcess, write_autorecovery_conf
from bookie_helpers import wait_until

from ledger_client import ClientConfig, LedgerClient
from metadata import LedgerMetadata
from spark_bookie.local.sandbox import Sandbox
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration

GROUPS = ["gold", "gold", "gold", "silver", "silver"]
NS, STREAM = "iso", "events"
RECORD = b"x" * 400          # with 2 KiB segments: a new segment every few records
METRIC = "AUDITOR_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY"


class Cluster:
    def __init__(self, sb: Sandbox, client: LedgerClient, auditor: AutoRecoveryProcess, http: str,
                 conf: Path, root: Path) -> None:
        self.sb, self.client, self.auditor, self.http, self.conf, self.root = sb, client, auditor, http, conf, root
        self.group = {b.bookie_id: g for b, g in zip(sb.bookies, GROUPS, strict=True)}

    def groups_of(self, md: LedgerMetadata) -> set[str]:
        return {self.group[b] for b in md.bookies()}

    def segment_ledgers(self) -> list[LedgerMetadata]:
        info = self.client.namespace(NS).stream_info(STREAM)
        return [self.client.ledger_metadata(s.ledger_id) for s in info.segments if s.ledger_id is not None]

    def worker(self) -> AutoRecoveryProcess:
        w = AutoRecoveryProcess(self.sb.connect_string, self.conf, f"worker-{uuid.uuid4().hex[:6]}",
                                self.root / "worker.log", "--no-auditor")
        w.wait_ready()
        return w

    def metric(self) -> float | None:
        try:
            with urllib.request.urlopen(f"{self.http}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        lines = [x for x in text.splitlines() if x.startswith(METRIC + " ")]
        return float(lines[0].split()[1]) if lines else None

    def listed(self) -> dict[int, list[str]]:
        url = f"{self.http}/api/v1/autorecovery/list_under_replicated_ledger?printmissingreplica=true"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return {int(k): v for k, v in json.loads(r.read()).items()}
        except urllib.error.HTTPError as e:
            if e.code == 404:   # BookKeeper's answer for "none"
                return {}
            raise


@pytest.fixture(scope="module")
def cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("placement-groups")
    zk = f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers"
    sb = Sandbox(root / "cluster", len(GROUPS), zk_connect=zk, bookie_groups=GROUPS,
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000})
    sb.start()
    conf = write_autorecovery_conf(root / "autorecovery.toml", placement_check_interval_ms=500,
                                   lost_bookie_recovery_delay_s=0)
    port = free_port()
    auditor = AutoRecoveryProcess(zk, conf, "auditor", root / "auditor.log", "--no-worker", "--http-port", str(port))
    client = None
    try:
        auditor.wait_ready()
        client = LedgerClient(zk, config=ClientConfig(zk_session_timeout_ms=4000, add_timeout_ms=5000))
        client.create_namespace(NS, ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                segment_rolling_bytes=2048, bookie_groups=["gold"])
        yield Cluster(sb, client, auditor, f"http://127.0.0.1:{port}", conf, root)
    finally:
        if client is not None:
            client.close()
        auditor.stop()
        sb.stop()


def test_every_segment_is_on_gold_bookies(cluster):
    with cluster.client.namespace(NS).open_writer(STREAM) as w:
        for _ in range(20):
            w.write(RECORD)
    mds = cluster.segment_ledgers()
    assert len(mds) >= 3
    for md in mds:
        assert cluster.groups_of(md) == {"gold"}, (md.ledger_id, md.ensembles)
        assert md.bookie_groups == ("gold",)
    assert cluster.client.namespace(NS).stream_info(STREAM).placement_problems == []


def test_ensemble_change_after_a_gold_bookie_is_killed_stays_gold(cluster):
    ns = cluster.client.namespace(NS)
    ns.update_settings(segment_rolling_bytes=1 << 20)   # one segment: the change happens inside it
    worker = None
    w = ns.open_writer(STREAM)
    w.write(RECORD)
    lid = ns.stream_info(STREAM).segments[-1].ledger_id
    victim = next(b for b in cluster.sb.bookies if b.bookie_id in cluster.client.ledger_metadata(lid).ensembles[0])
    try:
        victim.kill()
        with w:
            for f in [w.write_async(RECORD) for _ in range(19)]:
                f.result(60)
        md = cluster.client.ledger_metadata(lid)
        assert len(md.ensembles) > 1 and victim.bookie_id not in md.ensembles[max(md.ensembles)], md.ensembles
        for md in cluster.segment_ledgers():
            assert cluster.groups_of(md) == {"gold"}, (md.ledger_id, md.ensembles)
        # re-replication of the sealed segments that named the dead bookie: onto gold only
        named = [md.ledger_id for md in cluster.segment_ledgers() if victim.bookie_id in md.bookies()]
        assert named
        t0 = time.monotonic()
        worker = cluster.worker()
        wait_until(lambda: not any(victim.bookie_id in md.bookies() for md in cluster.segment_ledgers())
                   and not cluster.sb.store.underreplication.list_underreplicated(), 60,
                   what="the dead gold bookie's segments re-replicated")
        print(f"re-replicated {len(named)} segments in {time.monotonic() - t0:.1f}s")
        for md in cluster.segment_ledgers():
            assert cluster.groups_of(md) == {"gold"}, (md.ledger_id, md.ensembles)
    finally:
        if worker is not None:
            worker.stop()
        cluster.sb.restart(victim)


def test_auditor_marks_and_worker_moves_segments_after_the_groups_change(cluster):
    ns = cluster.client.namespace(NS)
    sealed = {md.ledger_id for md in cluster.segment_ledgers() if md.is_closed}
    assert sealed
    wait_until(lambda: cluster.metric() == 0, 30, what="the auditor's metric, all in place")
    ns.update_settings(bookie_groups=["silver"])
    wait_until(lambda: cluster.metric() == len(sealed), 30, what=f"the metric to count {len(sealed)} ledgers")
    wait_until(lambda: set(cluster.listed()) == sealed, 30, what="every sealed segment listed")
    assert all(set(cluster.listed()[lid]) <= {b for b, g in cluster.group.items() if g == "gold"} for lid in sealed)
    t0 = time.monotonic()
    worker = cluster.worker()
    try:
        wait_until(lambda: cluster.metric() == 0 and not cluster.listed(), 60,
                   what="the misplaced segments moved and nothing marked")
    finally:
        worker.stop()
    print(f"\nmoved {len(sealed)} segments to silver in {time.monotonic() - t0:.1f}s")
    for md in cluster.segment_ledgers():
        if md.ledger_id in sealed:
            assert cluster.groups_of(md) == {"silver"}, (md.ledger_id, md.ensembles)
    with ns.open_reader(STREAM) as r:   # the moved copies are whole: every record reads back
        assert sum(1 for _ in iter(lambda: r.read_next(timeout_ms=2000), None)) == 40


def test_a_group_without_bookies_is_reported_and_its_ledgers_stay_marked_without_a_hot_loop(cluster):
    ns = cluster.client.namespace(NS)
    sealed = {md.ledger_id for md in cluster.segment_ledgers() if md.is_closed}
    ns.update_settings(bookie_groups=["bronze"])
    status = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "cluster", "status", "--zk",
                             cluster.sb.connect_string], capture_output=True, text=True, timeout=60)
    assert f"placement: namespace {NS}: bookie group 'bronze' has no writable bookies" in status.stdout, status
    problems = cluster.client.namespace(NS).stream_info(STREAM).placement_problems
    assert any("'bronze' has no writable" in p for p in problems), problems
    info = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", cluster.sb.connect_string,
                           "info", f"{NS}/{STREAM}"], capture_output=True, text=True, timeout=60)
    assert "placement: bookie group 'bronze' has no writable bookies" in info.stdout, info
    wait_until(lambda: cluster.metric() == len(sealed) and set(cluster.listed()) == sealed, 30,
               what="every sealed segment counted and listed")
    worker = cluster.worker()
    try:
        t0 = time.monotonic()
        wait_until(lambda: worker.log().count("not re-replicated this time") >= 2 * len(sealed), 30,
                   what="each ledger tried at least twice")
        attempts, elapsed = worker.log().count("not re-replicated this time"), time.monotonic() - t0
    finally:
        worker.stop()
    assert "groups bronze" in worker.log()
    # backing off (first 0.3 s, doubling): a hot loop would have made hundreds of attempts
    assert attempts <= len(sealed) * (elapsed / 0.3 + 2), (attempts, elapsed)
    assert set(cluster.listed()) == sealed
    for md in cluster.segment_ledgers():
        if md.ledger_id in sealed:
            assert cluster.groups_of(md) == {"silver"}, (md.ledger_id, md.ensembles)
