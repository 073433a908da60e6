"""`spark-bookie sandbox --hosts N --bookie-groups ...` (DESIGN §4.10): each host's bookie joins
its group; a namespace on "gold" writes only to gold hosts, also after a gold host in its
segment's ensemble dies whole (every process of its network namespace SIGKILLed)."""

from __future__ import annotations

import os
import re
import signal

import pytest
from host_helpers import require_namespaces
from sandbox_cli import SandboxRun

from ledger_client import ClientConfig, LedgerClient
from spark_bookie.local.hosts import netns_pids

pytestmark = pytest.mark.integration


def test_sandbox_hosts_with_groups_keeps_a_namespace_on_its_group_when_a_host_dies(tmp_path) -> None:
    require_namespaces()
    run = SandboxRun(tmp_path, "--hosts", "4", "--bookie-groups", "gold,gold,gold,silver", "--root",
                     str(tmp_path / "sb")).start()
    try:
        assert run.up, run.describe()
        hosts = re.findall(r"^host \S+ \S+: bookie (\S+) \(group (\w+)\); ip netns exec (\S+) ", run.stdout, re.M)
        group = {b: g for b, g, _ in hosts}
        netns = {b: ns for b, _, ns in hosts}
        assert sorted(group.values()) == ["gold", "gold", "gold", "silver"], run.describe()
        with LedgerClient(run.zk, config=ClientConfig(zk_session_timeout_ms=4000, add_timeout_ms=5000)) as c:
            ns = c.create_namespace("iso", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                    bookie_groups=["gold"])
            with ns.open_writer("s") as w:
                w.write(b"before")
                lid = ns.stream_info("s").segments[-1].ledger_id
                victim = c.ledger_metadata(lid).ensembles[0][0]
                for pid in netns_pids(netns[victim]):   # the host dies whole
                    os.kill(pid, signal.SIGKILL)
                for f in [w.write_async(b"after %d" % i) for i in range(20)]:
                    f.result(60)
            md = c.ledger_metadata(lid)
            assert victim not in md.ensembles[max(md.ensembles)], md.ensembles
            assert {group[b] for b in md.bookies()} == {"gold"}, md.ensembles
    finally:
        run.interrupt()
