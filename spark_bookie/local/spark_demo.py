"""The Spark-first demo (the README's main command): the mission end to end on the embedded default.

1. Bookies live inside Spark executors (`local-cluster[4,1,1024]`, the bookie-cluster application).
2. A Python application writes events into the stream ``demo/events`` (E3/Qw3/Qa2, small segments
   so that it rolls).
3. A Structured Streaming query (another Spark application, ``local[2]``) reads ``demo/events``
   with the ``ledger`` source and writes a transformation of it into ``demo/results`` with the
   ``ledger`` sink, exactly once, checkpointed.
4. Halfway through the writes, the executor JVM hosting a bookie of the events' ensemble is killed
   with SIGKILL: the writer goes on through an ensemble change, the slot's bookie comes back.
5. The sealed segments of ``demo/events`` are tiered into a Delta table (`jobs/compact_to_delta.py
   --stream --tier`, run as a user runs it), their ledgers deleted.
6. Spark SQL over both streams, the tiered segments read back from Delta by the same source, and
   the Delta table itself.
Each step prints its result; the last line is ``demo OK`` only if every check held: every event
acknowledged to the writer is read back once, and every one has its result exactly once.

With ``secure`` (`sandbox --spark --demo --secure`) the executors' bookies run with mTLS, tokens
and ZooKeeper ACLs (spark_bookie/local/secure.py), and everything of the demo presents the
sandbox's client config: the Python app's client, the query's source and sink (option
``client_conf``), the tiering job (``--client-conf``) and the SQL read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

from ledger_client import DLSN, ClientConfig, LedgerClient
from ledger_client.stream import Namespace
from spark_bookie.hosting.slots import SERVING, read_slot_statuses
from spark_bookie.local.sandbox import SparkSandbox

EVENTS = 6_000
APP_NAME = "bookie-cluster"   # SparkSandbox's application name
WAIT_S = 300.0


def _event(i: int) -> bytes:
    return f"event {i:06d} from the python app".encode()


def _result(i: int) -> bytes:
    return _event(i).upper()


class _App(threading.Thread):
    """The Python application: writes EVENTS events, steadily, and remembers what was acknowledged."""

    def __init__(self, ns: Namespace, half: threading.Event, resume: threading.Event) -> None:
        super().__init__(name="demo-app", daemon=True)
        self.ns, self.half, self.resume = ns, half, resume
        self.acked: dict[int, str] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.ns.open_writer("events") as w:
                for i in range(EVENTS):
                    if i == EVENTS // 2:
                        w.flush()
                        self.half.set()
                        self.resume.wait(WAIT_S)
                    w.write_async(_event(i), txid=i).add_done_callback(partial(self._acked, i))
                    if i % 200 == 199:
                        w.flush()
                        time.sleep(0.05)
                w.flush()
        except BaseException as e:  # reported by the demo, which fails
            self.error = e


    def _acked(self, i: int, fut: Future[DLSN]) -> None:
        if fut.exception() is None:
            self.acked[i] = str(fut.result())


def _wait(pred: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.5)


def _store(sb: SparkSandbox) -> Any:
    if sb.store is None:
        raise RuntimeError("the Spark sandbox is not started")
    return sb.store


def _kill_an_ensemble_bookie(sb: SparkSandbox, client: LedgerClient, ns: Namespace) -> tuple[str, int]:
    """SIGKILL the executor JVM hosting a bookie of the events' current segment: (bookie, pid)."""
    seg = ns.stream_info("events").segments[-1]
    if seg.ledger_id is None:
        raise RuntimeError("the events' last segment has no ledger")
    md = client.ledger_metadata(seg.ledger_id)
    ensemble = md.ensembles[max(md.ensembles)]
    slots = read_slot_statuses(_store(sb), APP_NAME)
    slot = next(s for s in slots.values() if s.get("bookie_id") in ensemble and s.get("executor_pid"))
    pid = int(slot["executor_pid"])
    os.kill(pid, signal.SIGKILL)
    return str(slot["bookie_id"]), pid


def _back(sb: SparkSandbox, bookie_id: str, killed_pid: int) -> bool:
    """The killed slot serves again from another executor (its old znode may outlive the kill by a
    session timeout, so registration alone says nothing)."""
    store = _store(sb)
    slot = next((s for s in read_slot_statuses(store, APP_NAME).values() if s.get("bookie_id") == bookie_id), {})
    return (slot.get("state") == SERVING and slot.get("executor_pid") not in (None, killed_pid)
            and bookie_id in store.cluster.list_bookies())


def _spark_session(workdir: Path) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.master("local[2]").appName("spark-bookie-demo")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.streaming.checkpointLocation", str(workdir / "checkpoints"))
            .config("spark.driver.memory", "1g").getOrCreate())


def _ledger(rw: Any, zk: str, client_conf: str | None) -> Any:
    """``rw.format("ledger")`` with the cluster's options: zk, and client_conf when secured."""
    rw = rw.format("ledger").option("zk", zk)
    return rw.option("client_conf", client_conf) if client_conf else rw


def _start_query(spark: Any, zk: str, workdir: Path, client_conf: str | None) -> Any:
    events = (_ledger(spark.readStream, zk, client_conf).option("streams", "demo/events")
              .option("max_records_per_trigger", "2000").load())
    return (_ledger(events.selectExpr("upper(cast(payload as string)) AS payload").writeStream, zk, client_conf)
            .option("stream", "demo/results")
            .option("checkpointLocation", str(workdir / "checkpoints" / "results"))
            .trigger(processingTime="1 second").queryName("events-to-results").start())


def _records(ns: Namespace, stream: str) -> int:
    return sum(s.record_count for s in ns.stream_info(stream).segments)


def _read_all(ns: Namespace, stream: str, expect: int) -> list[Any]:
    out: list[Any] = []
    with ns.open_reader(stream) as r:
        deadline = time.monotonic() + 120
        while len(out) < expect and time.monotonic() < deadline:
            out += r.read_batch(100_000, 500)
    return out


def _tier(zk: str, table: Path, client_conf: str | None) -> str:
    job = Path(__file__).resolve().parents[2] / "jobs" / "compact_to_delta.py"
    secured = ["--client-conf", client_conf] if client_conf else []
    r = subprocess.run([sys.executable, str(job), "--zk", zk, "--stream", "demo/events", "--table", str(table),
                        "--tier", "--engine", "local", *secured], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"tiering failed ({r.returncode}): {r.stdout[-1500:]}{r.stderr[-1500:]}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def _sql(spark: Any, zk: str, table: Path, client_conf: str | None) -> dict[str, int]:
    from deltalake import DeltaTable

    _ledger(spark.read, zk, client_conf).option("streams", "demo/*").load().createOrReplaceTempView("demo")
    rows = spark.sql("SELECT stream, count(*) AS records, count(DISTINCT txid) AS txids, min(txid) AS first_txid, "
                     "max(txid) AS last_txid FROM demo GROUP BY stream ORDER BY stream").collect()
    print("Spark SQL over both streams (tiered segments read from Delta by the same source):")
    for row in rows:
        print(f"  {row['stream']}: {row['records']} records, {row['txids']} distinct txids, "
              f"txids {row['first_txid']}..{row['last_txid']}")
    files = DeltaTable(str(table)).file_uris()
    delta_rows = spark.read.parquet(*files).count() if files else 0
    print(f"the Delta table {table.name} itself: {delta_rows} rows in {len(files)} files")
    return {"delta": delta_rows, **{row["stream"]: row["records"] for row in rows}}


def run_spark_demo(root: str | Path, bookies: int = 4, zk_port: int | None = None, secure: bool = False) -> int:
    root = Path(root)
    t0 = time.monotonic()
    files = None
    if secure:
        from spark_bookie.local.secure import sandbox_secure_files

        files = sandbox_secure_files(root)
    client_conf = str(files.client_conf_path) if files is not None else None
    with SparkSandbox(root, bookies, zk_port=zk_port,
                      bookie_settings=files.bookie_settings() if files is not None else None,
                      zk_tls=files.zookeeper_tls() if files is not None else None) as sb:
        print(f"1. bookies inside Spark executors (local-cluster[{bookies},1,1024]{', secure' if files else ''}): "
              f"{', '.join(sb.bookie_ids)} registered in {time.monotonic() - t0:.0f} s; ZooKeeper at "
              f"{sb.connect_string}", flush=True)
        if files is not None:
            files.announce()
        config = (ClientConfig.from_toml(client_conf, add_timeout_ms=5_000) if client_conf
                  else ClientConfig(add_timeout_ms=5_000))
        with LedgerClient(sb.connect_string, config=config) as client:
            return _demo(sb, client, root, client_conf)


def _demo(sb: SparkSandbox, client: LedgerClient, workdir: Path, client_conf: str | None = None) -> int:
    zk = sb.connect_string
    ns = client.create_namespace("demo", ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                 segment_rolling_bytes=32 << 10)
    ns.create_stream("results")
    half, resume = threading.Event(), threading.Event()
    app = _App(ns, half, resume)
    app.start()
    spark = _spark_session(workdir)
    try:
        query = _start_query(spark, zk, workdir, client_conf)
        print("2-3. a Python app writes demo/events; a Structured Streaming query turns them into "
              "demo/results through the ledger source and sink", flush=True)
        _wait(lambda: half.is_set() or app.error is not None, "the app to write half of its events")
        victim, pid = _kill_an_ensemble_bookie(sb, client, ns)
        print(f"4. killed the executor JVM hosting bookie {victim} (SIGKILL) after {len(app.acked)} events; "
              "the app keeps writing", flush=True)
        resume.set()
        t_kill = time.monotonic()
        _wait(lambda: _back(sb, victim, pid), "the killed slot's bookie to come back")
        print(f"   bookie {victim} is serving again after {time.monotonic() - t_kill:.0f} s "
              "(its slot restarted in a new executor)", flush=True)
        app.join(WAIT_S)
        if app.error is not None or len(app.acked) != EVENTS:
            print(f"ERROR: the app stopped after {len(app.acked)} acknowledged events: {app.error!r}")
            return 1
        _wait(lambda: _records(ns, "results") >= EVENTS, "the query to process every event")
        query.stop()
        print(f"   the app's {EVENTS} events were all acknowledged; the query wrote "
              f"{_records(ns, 'results')} results", flush=True)
        if not _check(ns):
            return 1
        table = workdir / "delta" / "events"
        print(f"5. tiering: {_tier(zk, table, client_conf)}", flush=True)
        states = [s.state for s in ns.stream_info("events").segments]
        print(f"   demo/events segments: {states.count('tiered')} tiered into Delta, {states.count('sealed')} sealed",
              flush=True)
        counts = _sql(spark, zk, table, client_conf)
        if counts.get("demo/events") != EVENTS or counts.get("demo/results") != EVENTS or counts["delta"] <= 0:
            print(f"ERROR: Spark SQL counted {counts}")
            return 1
        if not _check(ns):   # the Python reader too, now across tiered segments
            return 1
    finally:
        spark.stop()
    print("summary: every acknowledged event read back once (Python and Spark, ledgers and Delta), "
          "every result exactly once, through an executor kill")
    print("demo OK")
    return 0


def _check(ns: Namespace) -> bool:
    events = _read_all(ns, "events", EVENTS)
    if [r.payload for r in events] != [_event(i) for i in range(EVENTS)] or \
            [r.txid for r in events] != list(range(EVENTS)):
        print(f"ERROR: demo/events read back {len(events)} records, not the {EVENTS} events in order")
        return False
    results = _read_all(ns, "results", EVENTS)
    got = sorted(r.payload for r in results)
    if got != sorted(_result(i) for i in range(EVENTS)):
        print(f"ERROR: demo/results holds {len(results)} records ({len(set(got))} distinct), "
              f"not each of the {EVENTS} results once")
        return False
    print(f"   checked: demo/events holds the {EVENTS} events in order with their txids; demo/results holds "
          f"each of the {EVENTS} results exactly once", flush=True)
    return True
