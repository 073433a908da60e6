"""Executor loss with no spare bookie, on the Spark-hosted cluster (jobs/bookie_cluster.py).

`spark-submit --master local-cluster[3,1,1024] jobs/bookie_cluster.py --bookies 3`: three bookies,
one per executor JVM, the auditor in the driver and a replication worker beside each bookie. A
client writes a ledger E3/Qw3/Qa2 (every bookie of the cluster is in its ensemble: no spare) while
one executor JVM is SIGKILLed. Every append is acknowledged on the two live bookies (delayed
ensemble change); Spark brings the slot back on a new executor with the same bookie id and disk;
the writer takes it back; the replication worker copies back what it missed. At the end every
entry is read from every bookie of its write set.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hosting_helpers import COMEBACK_S, hosting_cluster, wait_until

from ledger_client import ClientConfig, LedgerClient
from ledger_client.machines.quorum import write_set
from ledger_client.protocol.framing import Digester, DigestType
from spark_bookie.hosting.slots import SERVING, read_slot_statuses
from spark_bookie.local.sandbox import SparkSandbox

pytestmark = pytest.mark.spark

NAME = "bookie-cluster"
PW = b"pw"
CLIENT = ClientConfig(add_timeout_ms=3_000, read_timeout_ms=5_000, speculative_read_timeout_ms=300,
                      operation_timeout_ms=120_000, zk_session_timeout_ms=4_000)


def payload(i: int) -> bytes:
    return f"no-spare-{i:06d}|".encode() * 8


class Writer(threading.Thread):
    """Appends to one E3/Qw3/Qa2 ledger until told to stop; remembers every acknowledged entry
    and the first error (there must be none)."""

    def __init__(self, client: LedgerClient) -> None:
        super().__init__(name="writer-no-spare", daemon=True)
        self.handle = client.create_ledger(3, 3, 2, password=PW)
        self.acked: list[int] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                assert self.handle.append(payload(i)) == i
                self.acked.append(i)
                i += 1
                time.sleep(0.01)
        except BaseException as e:  # the test reports it
            self.error = e


@pytest.fixture(scope="module")
def cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSandbox]:
    # lostBookieRecoveryDelay 0: the auditor marks the dead bookie's ledgers at once
    with hosting_cluster(tmp_path_factory.mktemp("no-spare-cluster"), zk_server, lost_bookie_delay_s=0,
                         autorecovery={"worker_backoff_ms": 500, "worker_backoff_max_ms": 3_000}) as sb:
        yield sb


def slot_of(sb: SparkSandbox, bookie_id: str) -> dict[str, Any]:
    assert sb.store is not None
    return next(s for s in read_slot_statuses(sb.store, NAME).values() if s["bookie_id"] == bookie_id)


def missing_copies(client: LedgerClient, ledger_id: int, last: int) -> list[tuple[int, str]]:
    """(entry, bookie) for every entry up to `last` that a bookie of its write set does not return
    intact: each bookie is asked for its own entries (listed reads), digests checked."""
    md = client.ledger_metadata(ledger_id)
    digester = Digester(DigestType.CRC32C, PW)
    wanted: dict[str, list[int]] = {}
    for e in range(last + 1):
        ensemble = md.ensemble_at(e)
        for i in write_set(e, md.ensemble_size, md.write_quorum_size):
            wanted.setdefault(ensemble[i], []).append(e)
    missing: list[tuple[int, str]] = []
    for bookie, ids in wanted.items():
        got: dict[int, bytes] = {}
        for k in range(0, len(ids), 500):
            chunk = ids[k:k + 500]
            while chunk:
                try:
                    resp = client.pool.get(bookie).read_entries_future(ledger_id, chunk).result(timeout=30)
                except Exception:   # unreachable: counts as missing below
                    break
                got.update(zip(resp.entry_ids, resp.bodies, strict=True))
                if not resp.entry_ids:
                    break
                chunk = [e for e in chunk if e > resp.entry_ids[-1]]   # the answer may stop at max bytes
        for e in ids:
            body = got.get(e)
            if body is None or digester.unframe(body, ledger_id, e)[2] != payload(e):
                missing.append((e, bookie))
    return missing


@pytest.mark.timeout(900)
def test_writer_keeps_writing_through_executor_loss_without_a_spare(cluster: SparkSandbox) -> None:
    store = cluster.store
    assert store is not None
    with LedgerClient(cluster.connect_string, config=CLIENT) as client:
        writer = Writer(client)
        lid = writer.handle.ledger_id
        writer.start()
        try:
            wait_until(lambda: len(writer.acked) >= 50 or writer.error is not None, 60, "first acknowledged entries")
            victim = writer.handle.metadata.ensembles[0][1]
            before = slot_of(cluster, victim)
            os.kill(before["executor_pid"], signal.SIGKILL)
            at_kill = len(writer.acked)

            def diag() -> str:
                return f"writer error: {writer.error!r}\nslots: {read_slot_statuses(store, NAME)}\n{cluster.log_tail()}"

            # No spare: appends go on with the two live bookies, the dead one still in the ensemble.
            wait_until(lambda: len(writer.acked) >= at_kill + 200 or writer.error is not None, 120,
                       "appends to go on after the kill", diag)
            assert writer.error is None, writer.error
            assert victim in writer.handle.metadata.ensembles[max(writer.handle.metadata.ensembles)]

            # Spark retries the slot on a new executor: the same bookie id, the same disk.
            wait_until(lambda: slot_of(cluster, victim)["executor_pid"] not in (None, before["executor_pid"])
                       and slot_of(cluster, victim)["state"] == SERVING and victim in store.cluster.list_bookies(),
                       COMEBACK_S, f"bookie {victim} back in its slot", diag)
            wait_until(lambda: len(client.ledger_metadata(lid).ensembles) >= 2 or writer.error is not None, 120,
                       "the writer to take the bookie back", diag)
            at_back = len(writer.acked)
            wait_until(lambda: len(writer.acked) >= at_back + 100 or writer.error is not None, 120,
                       "appends after the bookie came back", diag)
            assert writer.error is None, writer.error
        finally:
            writer.stop.set()
            writer.join(60)
        assert writer.error is None, writer.error
        assert writer.acked == list(range(len(writer.acked)))   # every append acknowledged, in order
        writer.handle.close()
        md = client.ledger_metadata(lid)
        assert md.last_entry_id == writer.acked[-1]
        assert all(ens == md.ensembles[0] for ens in md.ensembles.values())   # never another bookie

        # The entries the bookie missed while it was down were marked and copied back to it.
        last = md.last_entry_id
        wait_until(lambda: not missing_copies(client, lid, last), 240, "every entry on every bookie of its write set",
                   lambda: f"missing (first 20): {missing_copies(client, lid, last)[:20]}\n"
                           f"under-replicated: {store.underreplication.list_underreplicated()}\n{cluster.log_tail()}")
        wait_until(lambda: lid not in store.underreplication.list_underreplicated(), 60,
                   "the under-replication mark to clear")
        r = client.open_ledger(lid, password=PW, recovery=False)
        assert [e.data for e in r.read(0, last)] == [payload(i) for i in range(last + 1)]
