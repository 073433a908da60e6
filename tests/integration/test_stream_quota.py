"""A namespace's storage quota (DESIGN §4.10) against a real ZooKeeper and a real bookie process:
fill a namespace to its quota, the next write is refused and nothing of it is written, space is
freed by truncation, retention and tiering, and the writers (the one refused and one of another
stream) resume by themselves; stream info, the CLI, the admin API and the auditor's gauges show
the usage against the quota."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from bookie_helpers import module_cluster, wait_until
from client_helpers import client
from http_helpers import call_json, sample, scrape
from stream_helpers import read_all, writes

from ledger_client import AsyncLedgerClient, errors
from ledger_client.stream.quota import PUBLISH_MIN_S, REFUSED_REFRESH_S

pytestmark = pytest.mark.integration

QUOTA = 12_000
PAYLOAD = 200
ENTRY = PAYLOAD + 12 + 16   # a record written alone: payload, its 12 bytes and its entry's 16
ONE_BOOKIE = {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1}


sb = module_cluster(1, "One bookie for the module (each test uses namespaces of its own).")


def rec(stream: str, i: int) -> bytes:
    return (b"%s-%06d|" % (stream.encode(), i)).ljust(PAYLOAD, b".")


def fill(w, stream: str, start: int = 0) -> list:
    """Write records until the quota refuses one; the DLSNs of those written."""
    dlsns = []
    for i in range(start, start + 10 * QUOTA // PAYLOAD):
        try:
            dlsns.append(w.write(rec(stream, i)))
        except errors.QuotaExceededError:
            return dlsns
    raise AssertionError(f"{len(dlsns)} records written past a quota of {QUOTA} bytes")


def test_fill_refuse_truncate_resume_and_usage_everywhere(sb):
    with client(sb) as c:
        ns = c.create_namespace("fill", segment_rolling_bytes=2_000, storage_quota_bytes=QUOTA, **ONE_BOOKIE)
        w = ns.open_writer("s")
        dlsns = fill(w, "s")
        n = len(dlsns)
        assert QUOTA - 2 * ENTRY <= n * ENTRY <= QUOTA, n
        with pytest.raises(errors.QuotaExceededError, match="storage quota"):
            w.write(rec("s", 999_999))                           # refused again: nothing of it written
        assert isinstance(w.write_async(rec("s", 999_998)).exception(10), errors.QuotaExceededError)
        w.flush()                                                # the writer is still usable
        got = read_all(ns, "s", n)
        assert [r.payload for r in got] == [rec("s", i) for i in range(n)] and got[-1].txid == n - 1

        info = ns.stream_info("s")
        held = sum(s.bytes for s in info.segments)
        assert info.storage_bytes == held == info.namespace_storage_bytes
        assert QUOTA - 3 * ENTRY <= held <= QUOTA + 32, held   # at most the framing of the entries not yet sent
        assert info.storage_quota_bytes == QUOTA
        usage = ns.storage_usage()
        assert usage.quota_bytes == QUOTA and usage.streams["s"].sealed_bytes == sum(
            s.bytes for s in info.segments if s.state == "sealed")
        live = info.segments[-1]
        assert live.state == "in_progress" and held - live.bytes <= usage.used_bytes <= held   # as last published
        assert usage.free_bytes == QUOTA - usage.used_bytes

        cut = dlsns[n // 2]
        w.truncate(cut)                                          # whole segments before it go: space is free
        assert w.write(rec("s", n)) > dlsns[-1]                  # at once: the writer's own truncation
        assert ns.stream_info("s").storage_bytes < held - QUOTA // 4
        w.close()
        after = read_all(ns, "s", n // 2)
        assert after[0].dlsn == cut and after[-1].payload == rec("s", n)

        p = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", sb.connect_string, "usage",
                            "fill", "--json"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        cli = json.loads(p.stdout)
        final = ns.storage_usage()
        assert cli == final.to_json() and cli["used_bytes"] == ns.stream_info("s").storage_bytes   # sealed: exact


def test_retention_frees_space_and_a_refused_writer_of_another_stream_resumes_by_itself(sb):
    with client(sb) as c:
        ns = c.create_namespace("shared", segment_rolling_bytes=2_000, storage_quota_bytes=QUOTA, **ONE_BOOKIE)
        wa = ns.open_writer("a")
        a = fill(wa, "a")
        held = ns.stream_info("a").storage_bytes
        wait_until(lambda: ns.storage_usage().used_bytes >= held, timeout_s=10 * PUBLISH_MIN_S + 5,
                   what="the idle writer to publish its segment's last bytes")
        wb = ns.open_writer("b")                                  # reads the namespace's usage on opening
        with pytest.raises(errors.QuotaExceededError):
            wb.write(rec("b", 0))
        ns.update_settings(retention_bytes=QUOTA // 3)
        assert ns.apply_retention("a") >= 2                       # what the auditor's maintenance does
        wait_until(lambda: writes(wb, rec("b", 1)), timeout_s=10 * REFUSED_REFRESH_S + 5,
                   what="the refused writer to take records again")
        wb.close()
        wa.close()
        assert [r.payload for r in read_all(ns, "b", 1)] == [rec("b", 1)]
        kept = read_all(ns, "a", 1)
        assert kept and kept[-1].payload == rec("a", len(a) - 1)


def test_tiering_frees_space(sb, tmp_path):
    from jobs.stream_tiering import TieringConfig, tier_streams

    with client(sb) as c:
        ns = c.create_namespace("tiers", segment_rolling_bytes=2_000, storage_quota_bytes=QUOTA, **ONE_BOOKIE)
        w = ns.open_writer("s")
        n = len(fill(w, "s"))
        tier_streams(TieringConfig(sb.connect_string, str(tmp_path / "delta"), "tiers/s"), client=c)
        wait_until(lambda: writes(w, rec("s", n)), timeout_s=10 * REFUSED_REFRESH_S + 5,
                   what="the writer to take records once its sealed segments are tiered")
        info = ns.stream_info("s")
        assert info.storage_bytes == sum(s.bytes for s in info.segments if s.state != "tiered") < QUOTA // 2
        w.close()
        got = read_all(ns, "s", n + 1)                            # tiered or not, every record once
        assert [r.payload for r in got] == [rec("s", i) for i in range(n + 1)]


def test_async_writes_past_the_quota_fail_in_write_order_and_write_nothing(sb):
    async def run() -> tuple[list[str], list[object]]:
        async with AsyncLedgerClient(sb.connect_string) as c:
            ns = await c.create_namespace("aio", segment_rolling_bytes=2_000, storage_quota_bytes=QUOTA,
                                          **ONE_BOOKIE)
            w = await ns.open_writer("s")
            order: list[str] = []
            futs = []
            for i in range(2 * QUOTA // PAYLOAD):                 # pipelined, twice what fits
                f = w.sync.write_async(rec("s", i))
                f.add_done_callback(lambda f, i=i: order.append("ok" if f.exception() is None else "refused"))
                futs.append(f)
            with pytest.raises(errors.QuotaExceededError):
                await w.write(rec("s", 10_000))
            outcomes = [f.exception(30) or f.result() for f in futs]
            await w.close()
            return order, outcomes

    order, outcomes = asyncio.run(run())
    ok = [o for o in outcomes if not isinstance(o, BaseException)]
    assert ok and all(isinstance(o, errors.QuotaExceededError) for o in outcomes[len(ok):])
    assert order == ["ok"] * len(ok) + ["refused"] * (len(outcomes) - len(ok))   # settled in write order
    assert len(ok) * (PAYLOAD + 12) <= QUOTA
    with client(sb) as c:
        got = read_all(c.namespace("aio"), "s", len(ok))
        assert [r.payload for r in got] == [rec("s", i) for i in range(len(ok))]


def test_admin_api_and_auditor_gauges_show_usage_against_the_quota(sb):
    from recovery import AutoRecovery
    from recovery.config import AutoRecoveryConfig
    from spark_bookie.http.process import serve_autorecovery

    with client(sb) as c:
        ns = c.create_namespace("seen", segment_rolling_bytes=2_000, storage_quota_bytes=QUOTA, **ONE_BOOKIE)
        c.create_namespace("free", **ONE_BOOKIE)
        with ns.open_writer("s") as w:
            for i in range(20):
                w.write(rec("s", i))
        usage = ns.storage_usage()
        assert 20 * ENTRY <= usage.used_bytes < QUOTA
        ar = AutoRecovery(sb.connect_string, AutoRecoveryConfig(stream_maintenance_interval_ms=0),
                          candidate_id="quota-test", run_worker=False)
        ar.start()
        admin = serve_autorecovery(ar, 0)
        try:
            wait_until(lambda: ar.is_auditor, what="the auditor to be elected")
            status, body = call_json(f"{admin.url}/admin/v2/namespaces/public/seen/storage")
            assert status == 200, body
            assert body == {"storageSize": usage.used_bytes, "storageQuotaBytes": QUOTA,
                            "freeBytes": QUOTA - usage.used_bytes, "streams": {"s": {"storageSize": usage.used_bytes}}}
            assert call_json(f"{admin.url}/admin/v2/namespaces/acme/seen/storage")[0] == 404
            samples = scrape(admin.url)
            assert sample(samples, "namespace_storage_used_bytes", namespace="seen") == usage.used_bytes
            assert sample(samples, "namespace_storage_quota_bytes", namespace="seen") == QUOTA
            assert sample(samples, "namespace_storage_used_bytes", namespace="free") == 0
            assert ("namespace_storage_quota_bytes", (("namespace", "free"),)) not in samples
        finally:
            admin.stop()
            ar.stop()
