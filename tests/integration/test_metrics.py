"""/metrics of real bookie and autorecovery processes, parsed with prometheus_client's parser:
the counters move as a client writes and reads, and as a killed bookie's ledgers are
re-replicated."""

from __future__ import annotations

import pytest
from autorecovery_helpers import AutoRecoveryProcess, wait_fully_repaired, write_autorecovery_conf, write_ledger
from bookie_helpers import wait_until
from client_helpers import bookie_of, client
from http_helpers import call, sample, scrape

from ledger_client import errors
from spark_bookie.local.zookeeper import free_port

pytestmark = pytest.mark.integration

ENTRY_BYTES = 300


def _bookie_url(b) -> str:
    return f"http://127.0.0.1:{b.settings['http_port']}"


def test_bookie_counters_move_with_writes_and_reads(cluster_factory):
    sb = cluster_factory(1, http_port=free_port())
    url = _bookie_url(sb.bookies[0])
    before = scrape(url)
    assert sample(before, "bookie_SERVER_STATUS") == 1.0
    assert sample(before, "bookie_ledger_dir_free_bytes", dir="0") > 0
    adds0 = sample(before, "bookkeeper_server_ADD_ENTRY_REQUEST_total", success="true")
    with client(sb) as c:
        w = c.create_ledger(1, 1, 1)
        for f in [w.append_async(b"x" * ENTRY_BYTES) for _ in range(100)]:
            f.result(30)
        w.close()
        after_writes = scrape(url)
        assert sample(after_writes, "bookkeeper_server_ADD_ENTRY_REQUEST_total", success="true") - adds0 == 100
        assert sample(after_writes, "bookkeeper_server_ADD_ENTRY_count", success="true") >= 1
        # a frame header per entry comes on top of the payload
        assert sample(after_writes, "bookie_WRITE_BYTES_total") >= 100 * ENTRY_BYTES
        assert sample(after_writes, "bookie_journal_JOURNAL_SYNC_count") >= 1
        assert sample(after_writes, "bookie_journal_JOURNAL_FORCE_WRITE_GROUPING_COUNT_sum") >= 100
        assert sample(after_writes, "bookie_journal_JOURNAL_WRITE_BYTES_total") >= 100 * ENTRY_BYTES
        reads0 = sample(after_writes, "bookkeeper_server_READ_ENTRY_REQUEST_total", success="true")
        r = c.open_ledger(w.ledger_id, recovery=False)
        assert len(r.read(0, 99)) == 100
    after_reads = scrape(url)
    assert sample(after_reads, "bookkeeper_server_READ_ENTRY_REQUEST_total", success="true") - reads0 >= 100
    assert sample(after_reads, "bookie_READ_BYTES_total") >= 100 * ENTRY_BYTES
    assert sample(after_reads, "bookkeeper_server_READ_ENTRY_count", success="true") >= 1
    # a forced GC round is counted (PUT, as BookKeeper's TriggerGCService)
    assert call(url + "/api/v1/bookie/gc", "PUT")[0] == 200
    wait_until(lambda: sample(scrape(url), "bookie_gc_THREAD_RUNTIME_count") >= 1, 30, "a GC round")


def test_failed_adds_are_counted_as_failures(cluster_factory):
    sb = cluster_factory(1, http_port=free_port())
    url = _bookie_url(sb.bookies[0])
    with client(sb) as c:
        w = c.create_ledger(1, 1, 1, password=b"a")
        w.append(b"first")
        # the ledger's fenced by a recovery open: the first writer's next add is refused
        c.open_ledger(w.ledger_id, password=b"a", recovery=True)
        with pytest.raises(errors.LedgerFencedError):
            w.append(b"after the fence")
    wait_until(lambda: sample(scrape(url), "bookkeeper_server_ADD_ENTRY_REQUEST_total", success="false") >= 1,
               30, "a failed add to be counted")


def test_metrics_disabled_bookie_serves_an_empty_registry(cluster_factory):
    sb = cluster_factory(1, http_port=free_port(), metrics_enabled=False)
    url = _bookie_url(sb.bookies[0])
    with client(sb) as c:
        w = c.create_ledger(1, 1, 1)
        w.append(b"x")
        w.close()
    assert not any(name.startswith("bookkeeper_server_") for name, _ in scrape(url))
    assert call(url + "/heartbeat")[0] == 200


def test_autorecovery_metrics_move_as_a_killed_bookie_is_replaced(cluster_factory, tmp_path):
    sb = cluster_factory(4)
    sb.store.underreplication.set_lost_bookie_recovery_delay_s(0)
    conf = write_autorecovery_conf(tmp_path / "autorecovery.toml")
    port = free_port()
    ar = AutoRecoveryProcess(sb.connect_string, conf, "ar-1", tmp_path / "ar.log", "--http-port", str(port))
    try:
        ar.wait_ready()
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: sample(scrape(url), "auditor_IS_AUDITOR") == 1.0, 30, "the process to be elected")
        first = scrape(url)
        assert sample(first, "auditor_ELECTION_ATTEMPTS_total") >= 1
        assert sample(first, "auditor_REPLICAS_CHECK_RUNS_total") == 0   # off in these tests' settings
        assert sample(first, "auditor_NUM_LEDGERS_HAVING_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY") == 0
        with client(sb) as c:
            lid, _ = write_ledger(c, 40, close=True)
            victim = c.ledger_metadata(lid).ensembles[0][0]
        assert sample(scrape(url), "replication_worker_NUM_ENTRIES_WRITTEN_total") == 0
        bookie_of(sb, victim).kill()
        wait_fully_repaired(sb.store, victim, timeout_s=120)
        # The metadata swap comes first; the worker counts the ledger once it has also cleared its
        # under-replication mark, a moment later (this asserted at once and failed now and then).
        wait_until(lambda: sample(scrape(url), "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED_total") >= 1,
                   30, "the worker to count the re-replicated ledger")
        after = scrape(url)
        assert sample(after, "replication_worker_NUM_ENTRIES_WRITTEN_total") > 0
        assert sample(after, "replication_worker_NUM_BYTES_WRITTEN_total") > 0
        wait_until(lambda: sample(scrape(url), "auditor_NUM_UNDER_REPLICATED_LEDGERS") == 0, 30,
                   "the auditor's count of under-replicated ledgers to drop to 0")
        assert call(url + "/api/v1/bookie/is_ready")[0] == 200
    except BaseException:
        print("autorecovery log:\n" + ar.log()[-4000:])  # what the process saw, for a failure's report
        raise
    finally:
        ar.stop()


def test_sandbox_http_prints_each_bookies_admin_url(tmp_path):
    """`spark-bookie sandbox --http`: every bookie serves /metrics on a port of its own, printed."""
    import os
    import re
    import signal
    import subprocess
    import sys

    out = tmp_path / "sandbox.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "spark_bookie.cli", "sandbox", "--bookies", "2", "--http",
                                 "--root", str(tmp_path / "sb")], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_until(lambda: "press Ctrl-C" in out.read_text() or proc.poll() is not None, 90, "the sandbox")
        assert proc.poll() is None, out.read_text()
        urls = re.findall(r"http admin on (http://127\.0\.0\.1:\d+)", out.read_text())
        assert len(urls) == 2 and len(set(urls)) == 2, out.read_text()
        for url in urls:
            assert sample(scrape(url), "bookie_SERVER_STATUS") == 1.0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_client_metrics_count_appends_reads_ensemble_changes_and_speculative_reads(cluster_factory):
    """An application's ClientMetrics registry: appends and reads timed, an ensemble change when a
    bookie of the ensemble is killed mid-write, speculative reads around a stopped (SIGSTOP) bookie."""
    import os
    import signal

    from client_helpers import FAST
    from prometheus_client import CollectorRegistry

    from ledger_client import LedgerClient
    from ledger_client.metrics import ClientMetrics

    sb = cluster_factory(5)
    reg = CollectorRegistry()

    def value(name: str) -> float:
        v = reg.get_sample_value(name)
        return 0.0 if v is None else v

    with LedgerClient(sb.connect_string, config=FAST, metrics=ClientMetrics(reg)) as c:
        w = c.create_ledger(3, 2, 2)
        for i in range(50):
            w.append(b"%d" % i)
        assert value("bookkeeper_client_ADD_ENTRY_count") == 50 and value("bookkeeper_client_LEDGER_CREATE_total") == 1
        assert 0 < value("bookkeeper_client_ADD_ENTRY_sum") < 50 * 5
        first = w.metadata.ensembles[0]
        bookie_of(sb, first[0]).kill()
        for i in range(50, 60):
            w.append(b"%d" % i)
        w.close()
        assert value("bookkeeper_client_NUM_ENSEMBLE_CHANGE_total") >= 1
        b = c.create_ledger(3, 2, 2)   # on the four live bookies
        for i in range(30):
            b.append(b"%d" % i)
        b.close()
        slow = bookie_of(sb, b.metadata.ensembles[0][0])
        os.killpg(slow.proc.pid, signal.SIGSTOP)   # alive but silent: its stripes are speculated elsewhere
        try:
            r = c.open_ledger(b.ledger_id, recovery=False)
            assert [e.data for e in r.read(0, 29)] == [b"%d" % i for i in range(30)]
        finally:
            os.killpg(slow.proc.pid, signal.SIGCONT)
        assert value("bookkeeper_client_READ_ENTRY_count") == 1
        assert value("bookkeeper_client_SPECULATIVE_READ_COUNT_total") >= 1
        assert value("bookkeeper_client_LEDGER_CREATE_total") == 2
        c.open_ledger(w.ledger_id)
        c.delete_ledger(w.ledger_id)
        c.delete_ledger(w.ledger_id)   # idempotent: counted once
        assert value("bookkeeper_client_LEDGER_OPEN_total") == 1
        assert value("bookkeeper_client_LEDGER_RECOVER_total") == 1
        assert value("bookkeeper_client_LEDGER_DELETE_total") == 1


def test_client_metrics_count_stream_records_rolls_and_truncations(cluster_factory):
    """Streams count into the application's registry: records acknowledged to the writer and
    returned to readers, segments rolled, truncations."""
    from client_helpers import FAST
    from prometheus_client import CollectorRegistry

    from ledger_client import LedgerClient
    from ledger_client.metrics import ClientMetrics

    sb = cluster_factory(3)
    reg = CollectorRegistry()

    def value(name: str) -> float:
        return reg.get_sample_value(name) or 0.0

    with LedgerClient(sb.connect_string, config=FAST, metrics=ClientMetrics(reg)) as c:
        ns = c.create_namespace("m", segment_rolling_bytes=500, output_buffer_bytes=100)
        with ns.open_writer("s") as w:
            dlsns = [w.write(b"record %03d" % i) for i in range(100)]
            w.truncate(dlsns[50])
        segments = ns.stream_info("s").segments
        assert value("stream_RECORDS_WRITTEN_total") == 100 and value("stream_TRUNCATIONS_total") == 1
        assert value("stream_SEGMENTS_ROLLED_total") >= 2
        got = []
        with ns.open_reader("s") as r:
            while len(got) < 50:
                got += r.read_batch(1000, 1000)
        assert len(got) == 50 and value("stream_RECORDS_READ_total") == 50
        assert len(segments) >= 2
