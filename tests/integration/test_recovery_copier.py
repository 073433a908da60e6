"""Listed reads (ReadRange with entry ids) on a real bookie, and the fragment copier built on them:
a striped fragment is copied with one read per source, and entries a source lacks come from the
next one."""

from __future__ import annotations

import pytest
from bookie_helpers import add_all, body
from client_helpers import client, data

from ledger_client.machines import write_set
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType
from ledger_client.transport import BookieClient
from recovery import AutoRecoveryConfig, FragmentCopier
from recovery.plan import CopyRun, copy_runs, plan_repair

pytestmark = pytest.mark.integration


def _listed(c: BookieClient, lid: int, ids: list[int], max_bytes: int = 0) -> pb.ReadRangeResponse:
    return c.read_entries_future(lid, ids, max_bytes).result(timeout=10)


def test_listed_read_returns_held_entries_from_cache_and_disk_and_refuses_bad_lists(cluster_factory):
    sb = cluster_factory(1)
    b = sb.bookies[0]
    with BookieClient(b.bookie_id) as c:
        assert all(r.status == pb.EOK for r in add_all(c, 5, range(0, 60, 3)))   # a striped bookie's share
        for phase in ("write cache", "entry logs after a restart"):
            r = _listed(c, 5, list(range(0, 70)))
            assert r.status == pb.EOK, (phase, r.detail)
            assert list(r.entry_ids) == list(range(0, 60, 3)), phase
            assert list(r.bodies) == [body(5, e) for e in range(0, 60, 3)], phase
            cut = _listed(c, 5, list(range(0, 70)), max_bytes=len(body(5, 0)) * 2)
            assert list(cut.entry_ids) == [0, 3], phase
            none = _listed(c, 5, [1, 2, 4])
            assert none.status == pb.ENOENTRY and not none.bodies, phase
            if phase == "write cache":
                c.close()
                b.stop()
                sb.restart(b)
                c = BookieClient(b.bookie_id)
        assert _listed(c, 404, [0]).status == pb.ENOLEDGER
        assert _listed(c, 5, [6, 3]).status == pb.EBADREQ        # not ascending
        assert _listed(c, 5, [3, 3]).status == pb.EBADREQ        # repeated
        assert _listed(c, 5, [-1, 3]).status == pb.EBADREQ       # negative
        too_many = _listed(c, 5, list(range(70_000)))
        assert too_many.status == pb.EBADREQ and "entry ids" in too_many.detail
        c.close()


def _closed_striped_ledger(sb, c, n: int, size: int):  # type: ignore[no-untyped-def]
    """A closed E3/Qw2 ledger of ``n`` known entries, and a bookie outside its ensemble."""
    w = c.create_ledger(3, 2, 2)
    for f in [w.append_async(data(w.ledger_id, i, size)) for i in range(n)]:
        f.result(30)
    w.close()
    md = c.ledger_metadata(w.ledger_id)
    return md, next(x.bookie_id for x in sb.bookies if x.bookie_id not in md.ensembles[0])


def test_copier_takes_what_a_source_lacks_from_the_next_one(cluster_factory):
    """Sources listed for every entry of an E3/Qw2 ledger include bookies that hold only some of
    them: the copier must still put every entry, digest intact, on the target."""
    sb = cluster_factory(4)
    with client(sb) as c:
        n = 40
        md, target = _closed_striped_ledger(sb, c, n, 300)
        run = CopyRun(tuple(range(n)), tuple(md.ensembles[0]), (target,))   # each source lacks a third
        copier = FragmentCopier(c.pool, AutoRecoveryConfig(copy_range_bytes_max=4096))   # short answers too
        stats = copier.copy(md, [run])
        assert stats.entries == n
        got = _listed(c.pool.get(target), md.ledger_id, list(range(n)), 1 << 30)
        assert list(got.entry_ids) == list(range(n))
        dig = Digester(DigestType.CRC32C, b"")
        assert [dig.unframe(bd, md.ledger_id, e)[2] for e, bd in zip(got.entry_ids, got.bodies, strict=True)] \
            == [data(md.ledger_id, e, 300) for e in range(n)]


def test_striped_fragment_copy_reads_once_per_surviving_source(cluster_factory):
    sb = cluster_factory(4)
    with client(sb) as c:
        n = 60
        md, target = _closed_striped_ledger(sb, c, n, 100)
        lost = md.ensembles[0][1]
        repair = plan_repair(md, {lost})[0]
        runs = copy_runs(md, repair, {1: target}, reachable=set(md.ensembles[0]) - {lost}, max_entries=512)
        assert len(runs) == 2
        FragmentCopier(c.pool, AutoRecoveryConfig()).copy(md, runs)
        held = [e for e in range(n) if 1 in write_set(e, 3, 2)]
        got = _listed(c.pool.get(target), md.ledger_id, list(range(n)), 1 << 30)
        assert list(got.entry_ids) == held
        # the master key travelled with the RECOVERY adds: the target checks it like the others
        assert add_all(c.pool.get(target), md.ledger_id, range(n, n + 1), key=b"x" * 20)[0].status == pb.EUA
