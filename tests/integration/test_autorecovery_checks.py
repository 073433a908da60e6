"""The auditor's periodic check of every ledger: a live bookie that lost a fragment's entries is
found by reading sampled entries, marked, and the fragment moves to another bookie."""

from __future__ import annotations

import dataclasses
import time

import pytest
from autorecovery_helpers import wait_fully_repaired, write_autorecovery_conf
from bookie_helpers import DIGEST, KEY, PASSWORD, add_all, payload

from ledger_client.machines import write_set
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.transport import BookieClient
from metadata import DigestType, LedgerMetadata, LedgerState

pytestmark = pytest.mark.integration

ENTRIES = 20


def test_periodic_check_finds_a_live_bookie_missing_entries(cluster_factory, tmp_path):
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml", check_all_ledgers_interval_ms=2000)
    sb = cluster_factory(4, autorecovery_enabled=True, autorecovery_conf=str(conf))
    store = sb.store
    a, b, c = (x.bookie_id for x in sb.bookies[:3])
    lid = store.ledgers.generate_ledger_id()
    md = LedgerMetadata.new_open(lid, [a, b, c], write_quorum_size=3, ack_quorum_size=2,
                                 digest_type=DigestType.CRC32C, password=PASSWORD)
    store.ledgers.create_ledger_metadata(dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=ENTRIES - 1,
                                                             length=100 * ENTRIES))
    for bookie in (a, b):   # `c` never got them: as if it had lost its copy of the ledger
        with BookieClient(bookie) as client:
            assert {r.status for r in add_all(client, lid, range(ENTRIES))} == {pb.EOK}
    t0 = time.monotonic()
    wait_fully_repaired(store, c, timeout_s=60)
    print(f"\nfound and repaired {time.monotonic() - t0:.1f}s after the ledger appeared")
    assert sb.bookies[2].alive
    fixed, _ = store.ledgers.read_ledger_metadata(lid)
    ensemble = fixed.ensembles[0]
    assert c not in ensemble and a in ensemble and b in ensemble
    for e in range(ENTRIES):
        for i in write_set(e, 3, 3):
            with BookieClient(ensemble[i]) as client:
                r = client.read(lid, e)
                assert r.status == pb.EOK and DIGEST.unframe(r.body, lid, e)[2] == payload(lid, e)
    assert KEY == fixed.password_hash
