"""A stream's subscriptions seen and changed by operators against a real bookie (DESIGN §4.11):
the CLI (`stream subscriptions`, `stream reset-subscription`), the admin API's stats, reset and
delete, and the auditor's gauge stream_subscription_backlog_records, all agreeing on the exact
backlog of a subscription partway through sealed segments and the segment in progress."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bookie_helpers import module_cluster, wait_until
from client_helpers import client
from http_helpers import call, call_json, sample, scrape

pytestmark = pytest.mark.integration

ONE_BOOKIE = {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1}

sb = module_cluster(1, "One bookie for the module.")


def cli(sb, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", sb.connect_string, *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_admin_api_and_gauge_agree_on_the_backlog(sb):
    from recovery import AutoRecovery
    from recovery.config import AutoRecoveryConfig
    from spark_bookie.http.process import serve_autorecovery

    with client(sb) as c:
        ns = c.create_namespace("ops", segment_rolling_bytes=1_000, **ONE_BOOKIE)
        w = ns.open_writer("s")
        dlsns = [w.write(b"record %03d" % i) for i in range(30)]    # sealed segments and one in progress
        with ns.open_reader("s", subscription="billing") as r:
            got: list = []
            while len(got) < 10:
                got += r.read_batch(10 - len(got), 5_000)
            assert [rec.dlsn for rec in got] == dlsns[:10]
            r.commit(got[-1].dlsn, sync=True)
        assert ns.subscriptions("s")["billing"].backlog_records == 20

        shown = cli(sb, "subscriptions", "ops/s", "--json")
        assert shown.returncode == 0, shown.stderr
        billing = json.loads(shown.stdout)["subscriptions"]["billing"]
        assert billing["backlog_records"] == 20 and billing["position"] == str(dlsns[9])
        moved = cli(sb, "reset-subscription", "ops/s", "billing", "earliest")
        assert moved.returncode == 0 and "reset to 1/0/-1" in moved.stdout, moved.stdout + moved.stderr
        assert ns.subscriptions("s")["billing"].backlog_records == 30
        moved = cli(sb, "reset-subscription", "ops/s", "billing", str(dlsns[4]))
        assert moved.returncode == 0, moved.stderr
        assert ns.subscriptions("s")["billing"].backlog_records == 25

        ar = AutoRecovery(sb.connect_string, AutoRecoveryConfig(stream_maintenance_interval_ms=60_000),
                          candidate_id="subscription-ops-test", run_worker=False)
        ar.start()
        admin = serve_autorecovery(ar, 0)
        try:
            wait_until(lambda: ar.is_auditor, what="the auditor to be elected")
            # the auditor reads the backlogs once when elected, then once per interval
            wait_until(lambda: ("stream_subscription_backlog_records",
                                (("stream", "ops/s"), ("subscription", "billing"))) in scrape(admin.url),
                       what="the backlog gauge")
            assert sample(scrape(admin.url), "stream_subscription_backlog_records", stream="ops/s",
                          subscription="billing") == 25
            stats = f"{admin.url}/admin/v2/persistent/public/ops/s/stats"
            status, body = call_json(stats)
            assert status == 200 and body["subscriptions"]["billing"]["msgBacklog"] == 25, body
            reset = f"{admin.url}/admin/v2/persistent/public/ops/s/subscription/billing/resetcursor"
            assert call(reset, "POST", {"position": str(dlsns[19])})[0] == 204
            assert call_json(stats)[1]["subscriptions"]["billing"]["msgBacklog"] == 10
            assert call_json(reset, "POST", {"position": "99/0/0"})[0] == 400
            delete = f"{admin.url}/admin/v2/persistent/public/ops/s/subscription/billing"
            assert call(delete, "DELETE")[0] == 204
            assert call_json(delete, "DELETE")[0] == 404
            assert call_json(stats) == (200, {"subscriptions": {}})
        finally:
            admin.stop()
            ar.stop()
            w.close()
