"""A real bookie's GC on a real ZooKeeper, round after round, in a cluster of many more ledgers
than the bookie holds: the data of a deleted ledger and of a role's tombstoned one is reclaimed,
a live ledger's never is, and a round with nothing changed asks the metadata store a request per
bucket of the bookie's ledgers, however many ledgers the cluster has."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from bookie_helpers import add_all, check_entry, dir_bytes, wait_until
from http_helpers import scrape

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.transport import BookieClient
from metadata.layout import DELETED
from metadata.model import TOMBSTONE
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration

SIZE = 8 * 1024
DOOMED, LIVE, FAR, ROLE_DELETED = 11, 12, 10_000_013, 14
OTHERS = [20_000_000 + k * 10_000 + 7 for k in range(1500)]   # 1,500 buckets of other bookies' ledgers


def _gc(url: str) -> tuple[float, float]:
    """(rounds, metadata requests in all of them) from the bookie's /metrics."""
    got = scrape(url)
    return got[("bookie_gc_metadata_requests_count", ())], got[("bookie_gc_metadata_requests_sum", ())]


def test_gc_rounds_reclaim_deleted_ledgers_and_cost_what_changed(cluster_factory):
    http_port = free_port()
    sb = cluster_factory(1, entry_log_size_bytes_max=1 << 20, gc_interval_ms=300, flush_interval_ms=200,
                         http_port=http_port)
    url = f"http://127.0.0.1:{http_port}"
    ledgers = sb.store.ledgers
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda lid: ledgers.create_ledger_node(lid, b"m"), [DOOMED, LIVE, FAR, ROLE_DELETED, *OTHERS]))
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        add_all(c, DOOMED, range(1200), size=SIZE)   # ~10 MB in many entry logs
        add_all(c, ROLE_DELETED, range(600), size=SIZE)
        for lid in (LIVE, FAR):
            add_all(c, lid, range(50), size=SIZE)
        wait_until(lambda: dir_bytes(b.ledger_dir) > 14e6, what="entries flushed to entry logs")
        wait_until(lambda: _gc(url)[0] >= 3, what="GC rounds on the bookie's ledgers")
        rounds, requests = _gc(url)
        wait_until(lambda: _gc(url)[0] >= rounds + 3, what="more GC rounds")
        more_rounds, more_requests = _gc(url)
        # nothing changed: the deleted markers' listing and a stat of each of our 2 buckets
        assert (more_requests - requests) / (more_rounds - rounds) <= 3
        before = dir_bytes(b.ledger_dir)
        ledgers.delete_ledger_node(DOOMED)
        wait_until(lambda: dir_bytes(b.ledger_dir) < before - 7e6, timeout_s=60, what="GC to reclaim the ledger")
        assert c.read(DOOMED, 0).status == pb.ENOLEDGER
        ledgers.write_ledger_node(ROLE_DELETED, TOMBSTONE, 0)   # as a role deletes (metadata.ledgers)
        sb.store.nodes.create(f"{sb.store.paths.root}/{DELETED}/{ROLE_DELETED}", makepath=True)
        wait_until(lambda: c.read(ROLE_DELETED, 0).status == pb.ENOLEDGER, timeout_s=60,
                   what="GC to reap the tombstone and delete the ledger")
        assert sb.store.nodes.get(sb.store.paths.ledger(ROLE_DELETED)) is None
        for lid in (LIVE, FAR):
            for e in range(50):
                check_entry(c, lid, e, size=SIZE)
