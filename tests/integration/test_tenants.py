"""Tenants and permissions (DESIGN §4.9, invariant 11) on a cluster of real bookies with tokens.

Roles: ``root`` (a superuser token), ``acme-admin`` (admin of tenant acme), ``billing`` (produce and
consume on acme's namespace ``payments``), ``auditor`` (consume only) and ``intruder`` (no grant).
The intruder tries every path, through the client and with raw requests on both bookie ports that
skip the client's own checks, and is refused with UnauthorizedAccessError while nothing changes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from bookie_helpers import body, wait_until

from ledger_client import ClientConfig, LedgerClient, errors
from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import master_key
from ledger_client.transport import BookieClient
from ledger_client.transport.credentials import Credentials
from metadata.streams import decode_settings, encode_settings
from spark_bookie.server.auth import mint_token

pytestmark = pytest.mark.integration

SECRET = b"the-tenants-test-cluster-secret-0123456789"
PASSWORD = "payments-pw"
ROLES = {"root": "admin", "acme-admin": "client", "billing": "client", "auditor": "client",
         "intruder": "client", "svc": "service"}


def token(role: str) -> str:
    return mint_token(SECRET, role, ROLES[role], ttl_s=3600)


def client(sb, role: str, **cfg: object) -> LedgerClient:
    return LedgerClient(sb.connect_string, config=ClientConfig(auth_token=token(role), operation_timeout_ms=15_000,
                                                               **cfg))


@pytest.fixture(scope="module")
def sb(zk_server, tmp_path_factory):
    """Two bookies checking tokens and grants, and tenant acme with namespace payments."""
    from spark_bookie.local.sandbox import Sandbox

    root = tmp_path_factory.mktemp("tenants")
    secret = Path(root) / "secret"
    secret.write_bytes(SECRET)
    s = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000, "auth_enabled": True,
                                 "auth_token_secret_path": str(secret)})
    s.start()
    with client(s, "root") as c:
        c.create_tenant("acme", admin_roles=["acme-admin"])
    with client(s, "acme-admin") as c:
        ns = c.create_namespace("payments", tenant="acme", ensemble_size=2, write_quorum_size=2,
                                ack_quorum_size=2, password=PASSWORD, segment_rolling_bytes=4_000)
        ns.grant_permission("billing", ["produce", "consume"])
        ns.grant_permission("auditor", ["consume"])
    yield s
    s.stop()


def raw(sb, role: str, transport: str = "tcp") -> list[BookieClient]:
    return [BookieClient(b.bookie_id, credentials=Credentials(auth_token=token(role)), read_transport=transport)
            for b in sb.bookies]


def entries_held(sb, ledger_id: int, entry_ids: range) -> list[int]:
    """The entries of ``ledger_id`` any bookie holds, asked as the service identity."""
    held = set()
    for c in raw(sb, "svc"):
        with c:
            for eid in entry_ids:
                if c.read(ledger_id, eid).status == pb.EOK:
                    held.add(eid)
    return sorted(held)


def write_orders(sb, n: int, stream: str = "orders") -> list:
    with client(sb, "billing") as c:
        w = c.namespace("payments").open_writer(stream)
        dlsns = [w.write(b"order-%d" % i) for i in range(n)]
        w.close()
    return dlsns


def test_grants_let_their_roles_in_and_the_client_names_role_namespace_and_action(sb):
    write_orders(sb, 50)
    with client(sb, "auditor") as c:
        r = c.namespace("payments").open_reader("orders")
        got = [r.read_next(timeout_ms=5_000) for _ in range(50)]
        r.close()
        assert [x.payload for x in got] == [b"order-%d" % i for i in range(50)]
        with pytest.raises(errors.UnauthorizedAccessError, match="'auditor'.*'produce'.*'payments'"):
            c.namespace("payments").open_writer("orders")
    with client(sb, "intruder") as c:
        ns = c.namespace("payments")
        for attempt in (lambda: ns.open_reader("orders"), lambda: ns.open_writer("orders"), ns.list_streams,
                        lambda: ns.stream_info("orders"), lambda: ns.delete_stream("orders"),
                        lambda: ns.grant_permission("intruder", ["consume"]), ns.permissions,
                        lambda: ns.update_settings(retention_ms=1), lambda: c.delete_namespace("payments", force=True),
                        lambda: c.create_namespace("mine", tenant="acme"), lambda: c.create_tenant("evil"),
                        lambda: c.delete_tenant("acme"), lambda: c.tenant_info("acme")):
            with pytest.raises(errors.UnauthorizedAccessError, match="intruder"):
                attempt()
    with client(sb, "root") as c:
        info = c.namespace("payments").stream_info("orders")
        assert sum(s.record_count for s in info.segments) >= 50
        assert c.tenant_info("acme").namespaces == ["payments"]
        assert c.namespace("payments").permissions() == {"billing": frozenset({"produce", "consume"}),
                                                         "auditor": frozenset({"consume"})}


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_raw_requests_of_a_role_without_grants_are_refused_by_the_bookies(sb, transport):
    """Past the client: guessed and known ledger ids, reads, long polls, fences, adds and LAC
    writes with the right master key, on both ports; the bookies answer EUA and nothing changes."""
    write_orders(sb, 30, stream=f"raw-{transport}")
    with client(sb, "root") as c:
        segs = c.namespace("payments").stream_info(f"raw-{transport}").segments
    ledgers = [s.ledger_id for s in segs if s.ledger_id is not None]
    key = master_key(PASSWORD.encode())
    for bc in raw(sb, "intruder", transport):
        with bc:
            for lid in [*ledgers, *range(0, 40)]:                      # known and guessed ids
                assert bc.read_range(lid, 0, 3).status in (pb.EUA, pb.ENOLEDGER), lid
                assert bc.read(lid, 0).status in (pb.EUA, pb.ENOLEDGER), lid
                assert bc.held_entries_future(lid, [0, 1, 2]).result(timeout=20).status in (pb.EUA, pb.ENOLEDGER), lid
            lid = ledgers[0]
            assert bc.read_lac(lid).status == pb.EUA
            assert bc.read(lid, 0, previous_lac=-1, long_poll_timeout_ms=100).status == pb.EUA
            assert bc.read(lid, -1, fence=True, master_key=key).status == pb.EUA
            assert bc.write_lac(lid, 99, key, b"").status == pb.EUA
            assert bc.add(lid, 9_999, key, body(lid, 9_999)).result(timeout=20).status == pb.EUA
    assert entries_held(sb, ledgers[0], range(9_999, 10_000)) == []
    with client(sb, "billing") as c:    # nobody fenced the stream: its writer goes on, every record is there
        w = c.namespace("payments").open_writer(f"raw-{transport}")
        w.write(b"after the intruder")
        w.close()
        r = c.namespace("payments").open_reader(f"raw-{transport}")
        got = [r.read_next(timeout_ms=5_000) for _ in range(31)]
        r.close()
    assert [x.payload for x in got] == [b"order-%d" % i for i in range(30)] + [b"after the intruder"]


def test_a_ledger_outside_namespaces_is_its_creators_alone(sb):
    with client(sb, "billing") as c:
        w = c.create_ledger(2, 2, 2, password=b"p")
        for i in range(5):
            w.append(b"private-%d" % i)
        assert c.ledger_metadata(w.ledger_id).owner_role == "billing"
        for role in ("intruder", "acme-admin"):
            with client(sb, role) as other:
                with pytest.raises(errors.UnauthorizedAccessError, match=f"'{role}'.*belongs to role 'billing'"):
                    other.open_ledger(w.ledger_id, b"p", recovery=True)
                with pytest.raises(errors.UnauthorizedAccessError):
                    other.delete_ledger(w.ledger_id)
            for bc in raw(sb, role):
                with bc:
                    assert bc.read_range(w.ledger_id, 0, 4).status == pb.EUA
        w.append(b"still mine")                              # not fenced
        assert [e.data for e in c.open_ledger(w.ledger_id, b"p", recovery=False).read(0, 4)] == \
            [b"private-%d" % i for i in range(5)]
        w.close()
    with client(sb, "root") as c:
        assert c.open_ledger(w.ledger_id, b"p").read(5, 5)[0].data == b"still mine"


def test_revoke_stops_open_readers_and_writers_within_five_seconds(sb):
    """billing writes and tails its own stream; a revoke by the tenant admin stops both."""
    with client(sb, "acme-admin") as c:
        c.namespace("payments").grant_permission("temp", ["produce", "consume"])
    ROLES["temp"] = "client"
    stop = threading.Event()
    errors_seen: dict[str, tuple[float, BaseException]] = {}
    written: list[int] = []

    def writer() -> None:
        with client(sb, "temp") as c:
            w = c.namespace("payments").open_writer("revoked")
            try:
                i = 0
                while not stop.is_set():
                    w.write(b"r-%d" % i)
                    written.append(i)
                    i += 1
                    time.sleep(0.01)
            except errors.LedgerError as e:
                errors_seen["writer"] = (time.monotonic(), e)

    def reader() -> None:
        with client(sb, "temp") as c:
            wait_until(lambda: len(written) > 5, 30, "first records")
            r = c.namespace("payments").open_reader("revoked")
            try:
                while not stop.is_set():
                    r.read_next(timeout_ms=200)
            except errors.LedgerError as e:
                errors_seen["reader"] = (time.monotonic(), e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(written) > 50, 30, "records before the revoke")
        with client(sb, "acme-admin") as c:
            c.namespace("payments").revoke_permission("temp")
        revoked = time.monotonic()
        wait_until(lambda: len(errors_seen) == 2, 30, "writer and reader refused")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    for who, (at, e) in errors_seen.items():
        print(f"{who} refused {at - revoked:.2f}s after the revoke: {type(e).__name__}: {e}")
        assert at - revoked < 5.0, who
        assert errors.UnauthorizedAccessError in (type(e), type(e.__cause__)), e
    with client(sb, "root") as c:                   # what was acknowledged before is all there
        r = c.namespace("payments").open_reader("revoked")
        got: list = []
        while len(got) < len(written) - 1:   # the last write may have been refused before its ack
            more = r.read_batch(max_records=100_000, timeout_ms=3_000)
            if not more:
                break
            got += more
        r.close()
    assert len(got) >= len(written) - 1 and [x.payload for x in got[:50]] == [b"r-%d" % i for i in range(50)]


def test_tenant_lifecycle_and_bad_input(sb):
    with client(sb, "root") as c:
        c.create_tenant("globex", admin_roles=["globex-admin"])
        with pytest.raises(errors.TenantExistsError):
            c.create_tenant("globex")
        with pytest.raises(errors.NoSuchTenantError):
            c.tenant_info("no-such-tenant")
        with pytest.raises(errors.NoSuchTenantError):
            c.create_namespace("x", tenant="no-such-tenant")
        with pytest.raises(errors.InvalidNameError):
            c.create_tenant("bad/name")
        with pytest.raises(errors.IncorrectParameterError):
            c.create_tenant("t2", admin_roles="not-a-list")
        ns = c.create_namespace("globex-ns", tenant="globex")
        with pytest.raises(errors.IncorrectParameterError):
            ns.grant_permission("r", ["read"])
        with pytest.raises(errors.IncorrectParameterError):
            ns.grant_permission("bad:role", ["consume"])
        assert ns.permissions() == {}
        with pytest.raises(errors.TenantNotEmptyError):
            c.delete_tenant("globex")
        c.delete_namespace("globex-ns")
        c.delete_tenant("globex")
        assert "globex" not in c.list_tenants() and "acme" in c.list_tenants()


def test_migration_brings_a_cluster_from_before_tenants_under_them_without_losing_a_record(sb, tmp_path):
    """`shell migrate-tenants` on metadata as it was before tenants: the namespace lands in tenant
    public, its segments' ledgers learn their namespace, an old plain ledger gets --legacy-owner;
    every record is then read by the roles granted, and by no one else."""
    with client(sb, "root") as c:
        ns = c.create_namespace("legacy", ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                                segment_rolling_bytes=300)
        with ns.open_writer("old") as w:
            for i in range(20):
                w.write(b"old-%02d" % i)
        lw = c.create_ledger(2, 2, 2, password=b"l")
        for i in range(3):
            lw.append(b"plain-%d" % i)
        lw.close()
        segments = [s.ledger_id for s in ns.stream_info("old").segments if s.ledger_id is not None]
        assert len(segments) >= 2
        store = c.store                                   # now make the metadata look as it did before tenants
        data, version = store.streams.read_namespace("legacy")
        store.streams.write_namespace("legacy", encode_settings(decode_settings(data)), version)
        for lid in [*segments, lw.ledger_id]:
            md, v = store.ledgers.read_ledger_metadata(lid)
            store.ledgers.write_ledger_metadata(dataclasses.replace(md, namespace="", owner_role=""), v)
    for b in sb.bookies:   # bookies of a cluster from before tenants never knew these ledgers' stamps
        b.stop()
        sb.restart(b)
    with client(sb, "billing") as c, pytest.raises(errors.UnauthorizedAccessError, match="predates tenants"):
        c.open_ledger(lw.ledger_id, b"l")
    conf = tmp_path / "root.toml"
    conf.write_text(f'[client]\nauth_token = "{token("root")}"\n')
    outs = []
    for _ in range(2):                                    # the second run finds nothing left to do
        done = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "--client-conf", str(conf), "shell", "--zk",
                               sb.connect_string, "migrate-tenants", "--legacy-owner", "billing", "--json"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outs.append(json.loads(done.stdout))
    assert outs[0]["namespaces"] == 1 and outs[0]["segment_ledgers"] == len(segments) and outs[0]["legacy_ledgers"] >= 1
    assert outs[1] == {"namespaces": 0, "segment_ledgers": 0, "legacy_ledgers": 0}
    with client(sb, "root") as c:
        ns = c.namespace("legacy")
        assert ns.tenant == "public" and c.ledger_metadata(segments[0]).namespace == "legacy"
        ns.grant_permission("billing", ["consume"])
    with client(sb, "billing") as c:
        r = c.namespace("legacy").open_reader("old")
        assert [r.read_next(timeout_ms=5_000).payload for _ in range(20)] == [b"old-%02d" % i for i in range(20)]
        r.close()
        assert [e.data for e in c.open_ledger(lw.ledger_id, b"l").read(0, 2)] == [b"plain-%d" % i for i in range(3)]
    for bc in raw(sb, "intruder"):
        with bc:
            assert bc.read_range(segments[0], 0, 0).status == pb.EUA
            assert bc.read_range(lw.ledger_id, 0, 0).status == pb.EUA


def test_the_async_client_keeps_the_same_rules(sb):
    import asyncio

    from ledger_client import AsyncLedgerClient, TenantInfo

    async def run() -> None:
        cfg = ClientConfig(auth_token=token("acme-admin"), operation_timeout_ms=15_000)
        async with AsyncLedgerClient(sb.connect_string, config=cfg) as c:
            ns = await c.namespace("payments")
            await ns.grant_permission("async-reader", ["consume"])
            assert (await ns.permissions())["async-reader"] == {"consume"}
            await ns.revoke_permission("async-reader")
            info = await c.tenant_info("acme")
            assert isinstance(info, TenantInfo) and "payments" in info.namespaces
        cfg = ClientConfig(auth_token=token("intruder"), operation_timeout_ms=15_000)
        async with AsyncLedgerClient(sb.connect_string, config=cfg) as c:
            with pytest.raises(errors.UnauthorizedAccessError, match="intruder"):
                await (await c.namespace("payments")).open_reader("orders")
            with pytest.raises(errors.UnauthorizedAccessError, match="intruder"):
                await c.create_tenant("evil")
            with pytest.raises(errors.UnauthorizedAccessError, match="intruder"):
                await c.create_namespace("mine", tenant="acme")

    asyncio.run(run())


def test_a_ledger_is_made_in_a_namespace_only_with_produce_there(sb):
    """The client refuses before anything exists: a ledger its bookies would refuse to fill would
    be an orphan its maker may not delete."""
    with client(sb, "auditor") as c:
        before = set(c.list_ledgers())
        with pytest.raises(errors.UnauthorizedAccessError, match="'auditor'.*'produce'.*'payments'"):
            c.create_ledger(2, 2, 2, password=PASSWORD.encode(), namespace="payments")
        with pytest.raises(errors.NoSuchNamespaceError):
            c.create_ledger(2, 2, 2, namespace="no-such-namespace")
        assert set(c.list_ledgers()) == before
    with client(sb, "billing") as c:
        w = c.create_ledger(2, 2, 2, password=PASSWORD.encode(), namespace="payments")
        w.append(b"in payments")
        w.close()
        assert c.ledger_metadata(w.ledger_id).namespace == "payments"


def test_a_produce_only_role_takes_a_stream_over_from_its_crashed_writer(sb):
    """Taking a stream over recovers the last segment, which reads it: a role with produce alone
    may read a ledger its recovery fenced, and only that."""
    with client(sb, "acme-admin") as c:
        c.namespace("payments").grant_permission("ingest", ["produce"])
    ROLES["ingest"] = "client"
    first = client(sb, "ingest")
    w = first.namespace("payments").open_writer("takeover")
    acked = [w.write(b"t-%d" % i) for i in range(25)]
    first.close()                                     # the writer dies: its segment stays in progress
    with client(sb, "ingest") as c:
        ns = c.namespace("payments")
        with pytest.raises(errors.UnauthorizedAccessError, match="'ingest'.*'consume'"):
            ns.open_reader("takeover")
        with ns.open_writer("takeover") as w2:        # fences and recovers the dead writer's segment
            w2.write(b"after the takeover")
    assert len(acked) == 25
    with client(sb, "billing") as c:
        r = c.namespace("payments").open_reader("takeover")
        got = [r.read_next(timeout_ms=5_000).payload for _ in range(26)]
        r.close()
    assert got == [b"t-%d" % i for i in range(25)] + [b"after the takeover"]
    write_orders(sb, 5, stream="takeover-peer")      # closed cleanly by its writer: never fenced
    with client(sb, "root") as c:
        closed = c.namespace("payments").stream_info("takeover-peer").segments[-1].ledger_id
    for bc in raw(sb, "ingest"):                      # produce alone reads no ledger that was not fenced
        with bc:
            assert bc.read_range(closed, 0, 0).status == pb.EUA
