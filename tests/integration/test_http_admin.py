"""BookKeeper's admin API served by live bookie processes: every endpoint of DESIGN.md §4.7 with
its JSON shape, and its error cases (400 bad request, 404 unknown ledger or path, 405 wrong
method, JSON errors, never a traceback)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from bookie_helpers import wait_until
from client_helpers import client
from http_helpers import call, call_json

from spark_bookie.local.sandbox import Sandbox
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, str, int, Any]]:
    """Three bookies with HTTP ports, one ledger of ten entries written E3/Qw3/Qa2: one cluster for
    the read-only calls of the module (a test that deletes creates the ledger it deletes)."""
    sb = Sandbox(tmp_path_factory.mktemp("cluster"), 0, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000})
    sb.start()
    try:
        for _ in range(3):
            sb.add_bookie(http_port=free_port())
        with client(sb) as c:
            w = c.create_ledger(3, 3, 2)
            for i in range(10):
                w.append(f"entry {i}".encode())
            w.close()
            yield sb, f"http://127.0.0.1:{sb.bookies[0].settings['http_port']}", w.ledger_id, c
    finally:
        sb.stop()


def test_health_state_and_info(cluster):
    sb, url, _lid, _c = cluster
    status, ctype, text = call(url + "/heartbeat")
    assert (status, text) == (200, "OK\n")
    assert call(url + "/api/v1/bookie/is_ready")[:1] == (200,)
    assert call_json(url + "/api/v1/bookie/state") == (200, {
        "running": True, "readOnly": False, "shuttingDown": False, "availableForHighPriorityWrites": True})
    status, info = call_json(url + "/api/v1/bookie/info")
    assert status == 200 and set(info) == {"freeSpace", "totalSpace"} and 0 < info["freeSpace"] <= info["totalSpace"]
    status, conf = call_json(url + "/api/v1/config/server_config")
    assert status == 200 and conf["port"] == str(sb.bookies[0].port) and conf["http_port"] != "0"
    status, mark = call_json(url + "/api/v1/bookie/last_log_mark")
    assert status == 200 and len(mark) == 1
    assert next(iter(mark.values())).startswith("LogMark: logFileId - ")


def test_list_bookies(cluster):
    sb, url, _lid, _c = cluster
    status, rw = call_json(url + "/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and set(rw) == {b.bookie_id for b in sb.bookies} and set(rw.values()) == {None}
    status, named = call_json(url + "/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert status == 200 and all(isinstance(v, str) and v for v in named.values())
    assert call_json(url + "/api/v1/bookie/list_bookies?type=ro") == (200, {})
    for bad in ("", "?type=xx", "?type=rw&print_hostnames=maybe", "?type=rw&type=ro"):
        status, err = call_json(url + "/api/v1/bookie/list_bookies" + bad)
        assert status == 400 and "error" in err, bad


def test_gc_needs_put(cluster):
    _sb, url, _lid, _c = cluster
    assert call_json(url + "/api/v1/bookie/gc") == (200, {"is_in_force_gc": "false"})
    status, msg = call_json(url + "/api/v1/bookie/gc", "PUT")
    assert status == 200 and msg.startswith("Triggered GC on BookieServer: ")
    assert call_json(url + "/api/v1/bookie/gc", "DELETE")[0] == 405


def test_ledger_list_metadata_read(cluster):
    sb, url, lid, _c = cluster
    assert call_json(url + "/api/v1/ledger/list") == (200, {str(lid): None})
    status, listed = call_json(url + "/api/v1/ledger/list?print_metadata=true&page=1")
    assert status == 200 and listed[str(lid)]["lastEntryId"] == 9
    status, md = call_json(url + f"/api/v1/ledger/metadata?ledger_id={lid}")
    assert status == 200 and md[str(lid)]["state"] == "CLOSED"
    assert set(md[str(lid)]["allEnsembles"]["0"]) == {b.bookie_id for b in sb.bookies}
    status, entries = call_json(url + f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=2&end_entry_id=4")
    assert (status, entries) == (200, {"2": "entry 2", "3": "entry 3", "4": "entry 4"})
    status, entries = call_json(url + f"/api/v1/ledger/read?ledger_id={lid}")
    assert status == 200 and len(entries) == 10
    assert call_json(url + f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=20") == (200, {})


@pytest.mark.parametrize("path, status", [
    ("/api/v1/ledger/metadata?ledger_id=987654", 404),
    ("/api/v1/ledger/metadata", 400),
    ("/api/v1/ledger/metadata?ledger_id=abc", 400),
    ("/api/v1/ledger/metadata?ledger_id=-1", 400),
    ("/api/v1/ledger/metadata?ledger_id=99999999999999999999999", 400),
    ("/api/v1/ledger/read?ledger_id=987654", 404),
    ("/api/v1/ledger/read?ledger_id={lid}&start_entry_id=5&end_entry_id=2", 400),
    ("/api/v1/ledger/read?ledger_id={lid}&password=wrong", 403),
    ("/api/v1/ledger/list?print_metadata=yes", 400),
    ("/api/v1/no/such/endpoint", 404),
    ("/api/v1/autorecovery/who_is_auditor", 404),                     # no autorecovery runs here
    ("/api/v1/autorecovery/list_under_replicated_ledger", 404),       # BookKeeper's answer for none
])
def test_error_cases_are_json(cluster, path, status):
    _sb, url, lid, _c = cluster
    got, body = call_json(url + path.format(lid=lid))
    assert got == status and isinstance(body.get("error"), str) and "Traceback" not in body["error"]


def test_destructive_calls_need_their_method(cluster):
    _sb, url, _lid, c = cluster
    w = c.create_ledger(3, 3, 2)   # a ledger of its own to delete: the module's stays for the others
    w.append(b"to be deleted")
    w.close()
    lid = w.ledger_id
    assert call_json(url + f"/api/v1/ledger/delete?ledger_id={lid}")[0] == 405
    assert call_json(url + "/api/v1/autorecovery/decommission")[0] == 405
    assert call_json(url + "/metrics", "POST")[0] == 405
    assert call_json(url + "/api/v1/ledger/delete?ledger_id=987654", "DELETE")[0] == 404
    assert call_json(url + "/api/v1/ledger/delete", "DELETE")[0] == 400
    assert call_json(url + f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE") == (200, {"deleted": lid})
    assert call_json(url + f"/api/v1/ledger/metadata?ledger_id={lid}")[0] == 404
    for bad in (b"not json", b"[1]", {"bookie_src": "nohost"}, {"bookie_src": "h:0"}, {}):
        status, err = call_json(url + "/api/v1/autorecovery/decommission", "PUT", bad)
        assert status == 400 and "error" in err, bad


def test_autorecovery_endpoints_and_decommission(cluster_factory, tmp_path):
    """A bookie running autorecovery beside itself is the auditor; under-replicated ledgers are
    listed; a decommission through the API moves a bookie's ledgers and deletes its cookie."""
    from autorecovery_helpers import write_autorecovery_conf

    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    sb = cluster_factory(0)
    for _ in range(4):
        sb.add_bookie(http_port=free_port(), autorecovery_enabled=True, autorecovery_conf=str(conf))
    url = f"http://127.0.0.1:{sb.bookies[0].settings['http_port']}"
    wait_until(lambda: call(url + "/api/v1/autorecovery/who_is_auditor")[0] == 200, 30, "an auditor")
    status, who = call_json(url + "/api/v1/autorecovery/who_is_auditor")
    assert set(who) == {"Auditor"} and who["Auditor"] in {b.bookie_id for b in sb.bookies}
    with client(sb) as c:
        w = c.create_ledger(3, 2, 2)
        for i in range(20):
            w.append(b"%d" % i)
        w.close()
        victim = c.ledger_metadata(w.ledger_id).ensembles[0][0]
        sb.store.underreplication.set_replication_enabled(False)  # keep it queued while we look
        sb.store.underreplication.mark_underreplicated(w.ledger_id, [victim])
        assert call_json(url + "/api/v1/autorecovery/list_under_replicated_ledger") == (200, [w.ledger_id])
        assert call_json(url + "/api/v1/autorecovery/list_under_replicated_ledger?printmissingreplica=true") == (
            200, {str(w.ledger_id): [victim]})
        assert call_json(url + f"/api/v1/autorecovery/list_under_replicated_ledger?missingreplica={victim}"
                         )[1] == [w.ledger_id]
        assert call_json(url + "/api/v1/autorecovery/list_under_replicated_ledger?excludingmissingreplica="
                         + victim)[0] == 404
        sb.store.underreplication.set_replication_enabled(True)
        wait_until(lambda: not sb.store.underreplication.list_underreplicated(), 60, "the queue to empty")
        status, msg = call_json(url + "/api/v1/autorecovery/decommission", "PUT", {"bookie_src": victim})
        assert status == 200 and victim in msg

        def moved_off() -> bool:
            return victim not in c.ledger_metadata(w.ledger_id).bookies() and not _has_cookie(sb, victim)
        wait_until(moved_off, 120, f"{victim} decommissioned")


def _has_cookie(sb, bookie_id: str) -> bool:
    return sb.store.cluster.read_cookie(bookie_id) is not None


def test_read_only_bookie_says_so(cluster_factory):
    """A bookie over its disk-usage threshold (here: any usage) is read-only in /api/v1/bookie/state,
    in list_bookies?type=ro and in bookie_SERVER_STATUS."""
    from http_helpers import sample, scrape

    sb = cluster_factory(1, http_port=free_port(), disk_usage_threshold=1e-6, disk_usage_lwm=1e-6)
    b = sb.bookies[0]
    url = f"http://127.0.0.1:{b.settings['http_port']}"
    status, state = call_json(url + "/api/v1/bookie/state")
    assert status == 200 and state["readOnly"] is True and state["running"] is True
    assert call_json(url + "/api/v1/bookie/list_bookies?type=ro") == (200, {b.bookie_id: None})
    assert call_json(url + "/api/v1/bookie/list_bookies?type=rw") == (200, {})
    assert sample(scrape(url), "bookie_SERVER_STATUS") == 0.0


def test_zookeeper_outage_is_a_503_not_a_traceback():
    """The admin API answers 503 with a JSON error while ZooKeeper cannot be reached."""
    from prometheus_client import CollectorRegistry

    from spark_bookie.http import AdminContext
    from spark_bookie.http.routes import build_routes
    from spark_bookie.http.server import AdminServer

    dead_zk = f"127.0.0.1:{free_port()}"   # nobody listens: the client cannot connect
    ctx = AdminContext(dead_zk, CollectorRegistry())
    server = AdminServer("127.0.0.1", 0, build_routes(ctx), ctx.registry).start()
    try:
        status, err = call_json(server.url + "/api/v1/ledger/list")
        assert status == 503 and "Traceback" not in err["error"], err
    finally:
        server.stop()
        ctx.close()
