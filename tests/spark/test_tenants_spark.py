"""Tenants and grants on the Spark paths (DESIGN §4.6, §4.9, invariant 11), on one secured cluster
(mTLS, tokens, ZooKeeper ACLs) and the shared local-cluster session.

Roles, each with its own client TOML (the cluster's connection settings and its own token):
``root`` (superuser), ``acme-admin`` (admin of tenant acme), ``etl`` (produce and consume on acme's
namespace ``payments``), ``outsider`` (no grant) and ``svc`` (the service identity). The outsider's
reads, writes, compactions and tierings fail with an error naming the role, the namespace and the
missing action, and change nothing; its executors' reads are refused by the bookies themselves,
not only by its own client.

Every role's config here carries the sandbox's own ZooKeeper credentials (the cluster's superuser
there), so ZooKeeper's per-tenant ACLs (metadata.zk.tenant_acl) do not stand in the outsider's way,
as on a cluster secured before them: what keeps it out is the clients' checks and the bookies',
each of which must hold on its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from ledger_client import ClientConfig, LedgerClient

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

PASSWORD = "payments-pw"
ROLES = {"root": "admin", "acme-admin": "client", "etl": "client", "outsider": "client", "svc": "service"}
ORDERS = 300


@dataclass(frozen=True)
class Cluster:
    zk: str
    confs: dict[str, str]        # role -> its client TOML
    sandbox: object

    def client(self, role: str) -> LedgerClient:
        return LedgerClient(self.zk, config=ClientConfig.from_toml(self.confs[role], operation_timeout_ms=30_000))


def order(i: int) -> bytes:
    return b"order-%05d" % i


@pytest.fixture(scope="module")
def cluster(zk_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two secured bookies; tenant acme, namespace payments (etl: produce and consume), and its
    stream orders written by etl across several segments."""
    from spark_bookie.local.roles import write_role_config
    from spark_bookie.local.sandbox import Sandbox
    from spark_bookie.local.secure import make_secure_files
    from spark_bookie.server.auth import mint_token

    root = Path(tmp_path_factory.mktemp("tenants-spark"))
    files = make_secure_files(root / "secure")
    secret = files.token_secret_path.read_bytes().strip()
    sb = Sandbox(root / "cluster", 2, zk_connect=f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers",
                 bookie_settings={"zk_session_timeout_ms": 4000, "gc_interval_ms": 3_600_000,
                                  **files.bookie_settings()})
    sb.start()
    try:
        base = ClientConfig.from_toml(files.client_conf_path)
        confs = {role: str(write_role_config(root / f"{role}.toml", base, mint_token(secret, role, claim, 3600),
                                             tls_cert_path=str(files.client_cert_path),
                                             tls_key_path=str(files.client_key_path)))
                 for role, claim in ROLES.items()}
        c = Cluster(sb.connect_string, confs, sb)
        with c.client("root") as cl:
            cl.create_tenant("acme", admin_roles=["acme-admin"])
        with c.client("acme-admin") as cl:
            ns = cl.create_namespace("payments", tenant="acme", ensemble_size=2, write_quorum_size=2,
                                     ack_quorum_size=2, password=PASSWORD, segment_rolling_bytes=1_500,
                                     output_buffer_bytes=300)
            ns.grant_permission("etl", ["produce", "consume"])
        with c.client("etl") as cl, cl.namespace("payments").open_writer("orders") as w:
            for i in range(ORDERS):
                w.write(order(i))
        yield c
    finally:
        sb.stop()


def stream_state(c: Cluster, stream: str) -> tuple:
    """What a superuser sees of a stream: its segments and every record."""
    with c.client("root") as cl:
        ns = cl.namespace("payments")
        if not ns.stream_exists(stream):
            return (None, [])
        info = ns.stream_info(stream)
        segs = [(s.sequence, s.ledger_id, s.state, s.record_count, s.last_txid) for s in info.segments]
        with ns.open_reader(stream) as r:
            recs: list[tuple[int, bytes]] = []
            while len(recs) < sum(s[3] for s in segs):
                got = r.read_batch(max_records=100_000, timeout_ms=2_000)
                if not got:
                    break
                recs += [(x.txid, x.payload) for x in got]
        return (segs, recs)


def namespace_ledgers(c: Cluster) -> set[int]:
    """Every ledger whose metadata puts it in namespace payments (as a superuser sees them)."""
    with c.client("root") as cl:
        return {lid for lid in cl.list_ledgers() if cl.ledger_metadata(lid).namespace == "payments"}


def refused(excinfo: pytest.ExceptionInfo[BaseException], role: str, action: str) -> str:
    """The text of a Spark failure: it must name the role, the namespace and the missing action."""
    text = str(excinfo.value)
    assert f"'{role}'" in text and "'payments'" in text and f"'{action}'" in text, text[-3000:]
    return text


def read_streams(spark, c: Cluster, role: str, streams: str = "payments/orders"):
    return (spark.read.format("ledger").option("zk", c.zk).option("client_conf", c.confs[role])
            .option("streams", streams).load())


def test_stream_read_returns_every_record_with_a_grant_and_nothing_without(spark, cluster):
    rows = read_streams(spark, cluster, "etl").orderBy("segment", "entry_id", "slot").collect()
    assert [bytes(r.payload) for r in rows] == [order(i) for i in range(ORDERS)]
    assert {r.stream for r in rows} == {"payments/orders"} and len({r.segment for r in rows}) >= 3

    got: list = []
    for streams in ("payments/orders", "payments/*"):
        with pytest.raises(Exception) as e:
            got = read_streams(spark, cluster, "outsider", streams).collect()
        refused(e, "outsider", "consume")
    assert got == []

    with pytest.raises(Exception) as e:   # a streaming read is refused the same way
        q = (spark.readStream.format("ledger").option("zk", cluster.zk).option("client_conf", cluster.confs["outsider"])
             .option("streams", "payments/orders").load().writeStream.format("memory").queryName("outsider_orders")
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
            q.processAllAvailable()
        finally:
            q.stop()
    refused(e, "outsider", "consume")


def test_ledger_id_read_is_refused_on_the_executors_and_by_the_bookies(spark, cluster):
    with cluster.client("root") as cl:
        segs = cl.namespace("payments").stream_info("orders").segments
        lid = next(s.ledger_id for s in segs if s.state == "sealed" and s.ledger_id is not None)
        last = cl.ledger_metadata(lid).last_entry_id

    def read_ledger(role: str):
        return (spark.read.format("ledger").option("zk", cluster.zk).option("client_conf", cluster.confs[role])
                .option("ledgers", str(lid)).option("password", PASSWORD).load())

    assert read_ledger("etl").count() == last + 1
    got: list = []
    with pytest.raises(Exception) as e:
        got = read_ledger("outsider").collect()
    refused(e, "outsider", "consume")
    assert got == []

    # The same read on the executors, past the client's own check (an administrative open asks the
    # bookies without looking at grants): the bookies refuse every entry, naming role and grant.
    def task(zk: str, conf: str, ledger_id: int, last_entry: int):
        def run(_rows):
            from jobs.connect import connect
            from ledger_client import errors

            client = connect(zk, conf, operation_timeout_ms=20_000)
            try:
                entries = client.open_ledger_admin(ledger_id).read(0, last_entry)
                yield ("served", [bytes(x.data) for x in entries])
            except errors.LedgerError as err:
                yield (type(err).__name__, str(err))
            finally:
                client.close()
        return run

    for role, expect_served in (("etl", True), ("outsider", False)):
        [(what, detail)] = spark.sparkContext.parallelize([0], 1).mapPartitions(
            task(cluster.zk, cluster.confs[role], lid, last)).collect()
        if expect_served:
            assert what == "served" and len(detail) == last + 1, (what, detail)
        else:
            assert what == "UnauthorizedAccessError", (what, detail)
            assert "'outsider'" in detail and "'payments'" in detail and "'consume'" in detail, detail


def test_sink_appends_once_for_etl_and_nothing_for_the_outsider(spark, cluster):
    def write(role: str, n: int, first: int) -> None:
        df = spark.range(first, first + n, numPartitions=2).select(F.format_string("sunk-%05d", "id").alias("payload"))
        (df.write.format("ledger").option("zk", cluster.zk).option("client_conf", cluster.confs[role])
         .option("stream", "payments/sunk").mode("append").save())

    write("etl", 200, 0)
    segs, recs = stream_state(cluster, "sunk")
    assert [p for _, p in recs] == [b"sunk-%05d" % i for i in range(200)] and len(segs) == 2

    before, ledgers = stream_state(cluster, "sunk"), namespace_ledgers(cluster)
    with pytest.raises(Exception) as e:
        write("outsider", 50, 200)
    refused(e, "outsider", "produce")
    with pytest.raises(Exception) as e:   # a stream it would create: refused as well
        (spark.range(3).select(F.col("id").cast("string").alias("payload")).write.format("ledger")
         .option("zk", cluster.zk).option("client_conf", cluster.confs["outsider"])
         .option("stream", "payments/new-by-outsider").mode("append").save())
    refused(e, "outsider", "produce")
    assert stream_state(cluster, "sunk") == before
    assert stream_state(cluster, "new-by-outsider") == (None, [])
    assert namespace_ledgers(cluster) == ledgers, "the outsider's refused write left ledgers in payments"


def test_compaction_and_tiering_run_as_service_and_are_refused_to_the_outsider(spark, cluster, tmp_path):
    from deltalake import DeltaTable

    from jobs.delta_compaction import CompactionConfig, compact
    from jobs.stream_tiering import TieringConfig, tier_streams

    with cluster.client("etl") as cl, cl.namespace("payments").open_writer("archive") as w:
        for i in range(120):
            w.write(b"archived-%04d" % i)
    before = stream_state(cluster, "archive")
    sealed = [s for s in before[0] if s[2] == "sealed"]
    ids = tuple(s[1] for s in sealed)
    assert len(sealed) >= 2

    def compaction(role: str, table: str):
        return compact(CompactionConfig(zk=cluster.zk, table_path=table, ledgers=ids, password=PASSWORD.encode(),
                                        tasks_max=2, client_conf=cluster.confs[role]), spark)

    def tiering(role: str, table: str):
        return tier_streams(TieringConfig(zk=cluster.zk, table_path=table, streams="payments/archive", tasks_max=2,
                                          client_conf=cluster.confs[role]), spark)

    def rows(table: str) -> int:
        return DeltaTable(table).to_pyarrow_table().num_rows if (Path(table) / "_delta_log").exists() else 0

    outsider_table = str(tmp_path / "outsider-ledgers")
    with pytest.raises(Exception) as e:
        compaction("outsider", outsider_table)
    refused(e, "outsider", "consume")
    outsider_tier = str(tmp_path / "outsider-tier")
    with pytest.raises(Exception) as e:
        tiering("outsider", outsider_tier)
    refused(e, "outsider", "consume")
    assert rows(outsider_table) == 0 and rows(outsider_tier) == 0
    assert stream_state(cluster, "archive") == before

    done = compaction("svc", str(tmp_path / "ledgers"))
    assert sorted(done.committed) == sorted(ids)
    assert rows(str(tmp_path / "ledgers")) == done.rows > 0
    tiered = tiering("svc", str(tmp_path / "tier"))
    assert sorted(tiered.marked["payments/archive"]) == [s[0] for s in sealed]
    after = stream_state(cluster, "archive")
    assert after[1] == before[1] and {s[2] for s in after[0] if s[0] in tiered.marked["payments/archive"]} == {"tiered"}
