"""`spark-bookie replicate` between two clusters of real bookies (DESIGN §4.12, invariant 13): the
replicator runs as a process of its own (a Spark query in local mode), is killed with SIGKILL in
the middle of a stream and restarted on its checkpoint, meets a new stream, a truncation, an end
of stream, a bookie of each cluster killed with SIGKILL and a source stream deleted and created
again; B ends with exactly A's records (order, txids, payloads), and the lag shows on /metrics and
in `replicate status`."""

from __future__ import annotations

import random
import threading

import pytest
from hosting_helpers import wait_until
from replicate_helpers import Replicator, records, status, two_clusters, wait_replicated

from ledger_client import DLSN, LedgerClient

pytestmark = pytest.mark.spark

SMALL = {"segment_rolling_bytes": 20_000, "output_buffer_bytes": 2_000}


def payload(stream: str, i: int, rng: random.Random) -> bytes:
    return f"{stream}-{i}-".encode() + rng.randbytes(rng.randrange(0, 200))


class Feeder:
    """A writer of one stream in a thread: distinct records with txids that jump now and then."""

    def __init__(self, ns, stream: str, seed: int) -> None:
        self.w = ns.open_writer(stream)
        self.rng = random.Random(seed)
        self.stream, self.n, self.txid = stream, 0, 0

    def write(self, count: int) -> DLSN:
        futs = []
        for _ in range(count):
            self.txid += self.rng.choice((1, 1, 1, 5))
            futs.append(self.w.write_async(payload(self.stream, self.n, self.rng), txid=self.txid))
            self.n += 1
        return [f.result(60) for f in futs][-1]

    def in_background(self, count: int, chunk: int = 50) -> threading.Thread:
        t = threading.Thread(target=lambda: [self.write(chunk) for _ in range(count // chunk)], daemon=True)
        t.start()
        return t


def test_replicate_survives_kill9_new_streams_truncation_end_and_lost_bookies(zk_server, tmp_path, seed):
    a, b = two_clusters(zk_server, tmp_path)
    ck = tmp_path / "ck"
    rep = Replicator(a.connect_string, b.connect_string, "pay/*", ck)
    try:
        with LedgerClient(a.connect_string) as ca, LedgerClient(b.connect_string) as cb:
            pay = ca.create_namespace("pay", retention_ms=None, **SMALL)
            orders, refunds = Feeder(pay, "orders", seed), Feeder(pay, "refunds", seed + 1)
            orders.write(1_500)
            refunds.write(300)
            rep.start()
            pay_b = wait_namespace(cb, "pay")
            assert pay_b.settings.segment_rolling_bytes == SMALL["segment_rolling_bytes"]   # A's settings
            wait_replicated(pay, pay_b, "orders", 120, rep)

            # SIGKILL mid-stream: records keep coming while the replicator dies and comes back
            feeding = orders.in_background(3_000)
            wait_until(lambda: len(records(pay_b, "orders")) > 1_600, 60, "the replicator to copy more")
            rep.kill9()
            feeding.join(120)
            rep.start()
            wait_replicated(pay, pay_b, "orders", 180, rep)

            chargebacks = Feeder(pay, "chargebacks", seed + 2)   # a stream created while it runs
            chargebacks.write(200)
            wait_replicated(pay, pay_b, "chargebacks", 120, rep)

            # truncation inside a segment, and an end of stream, carried over
            src = records(pay, "orders")
            cut = read_dlsns(pay, "orders")[2_000]
            orders.w.truncate(cut)
            refunds.w.mark_end_of_stream()
            wait_until(lambda: records(pay_b, "orders") == records(pay, "orders"), 60, "B's orders to be truncated")
            assert records(pay_b, "orders") == src[2_000:]
            wait_until(lambda: pay_b.stream_info("refunds").end_of_stream, 60, "B's refunds to end")
            assert records(pay_b, "refunds") == records(pay, "refunds")

            # a bookie of each cluster dies while records come: the source is read from the other
            # copies, B's task ledgers change ensembles; nothing lost or doubled
            a.bookies[1].kill()
            b.bookies[0].kill()
            a.add_bookie(wait=False)
            b.add_bookie()
            orders.write(1_000)
            wait_replicated(pay, pay_b, "orders", 180, rep)

            m = rep.metrics()
            for s in ("orders", "refunds", "chargebacks"):
                wait_until(lambda s=s: rep.metrics().get(f'replication_lag_records{{stream="pay/{s}"}}') == 0.0, 30,
                           f"pay/{s}'s lag to be 0 on /metrics", lambda: str(rep.metrics()))
            assert m["replication_streams"] == 3.0
            st = status(ck)
            assert st["running"] and {s["stream"]: s["lag_records"] for s in st["states"]} == {
                "pay/orders": 0, "pay/refunds": 0, "pay/chargebacks": 0}
            assert records(pay_b, "orders") == records(pay, "orders")
            orders.w.close()
            chargebacks.w.close()

            # A source stream deleted and created again under its name, with fewer records than the
            # old one: its positions start again. Its replica holds the old one's copies, so the
            # replicator stops and says what to do; with the replica deleted, it copies the new one
            # whole (before, records below the old position were left out without a word).
            pay.delete_stream("chargebacks")
            again = Feeder(pay, "chargebacks", seed + 3)
            again.write(120)
            assert rep.proc is not None and rep.proc.wait(120) == 1, rep.tail()
            said = [line for line in rep.tail(10).splitlines() if line.startswith("spark-bookie: error:")]
            assert said and "created again" in said[-1] and "delete the replica" in said[-1], rep.tail()
            pay_b.delete_stream("chargebacks")
            rep.start()
            assert wait_replicated(pay, pay_b, "chargebacks", 120, rep) == records(pay, "chargebacks")
            assert len(records(pay_b, "chargebacks")) == 120
            again.w.close()
    finally:
        rep.stop()
        a.stop()
        b.stop()


def wait_namespace(client, name: str):
    from ledger_client import errors

    def get():
        try:
            return client.namespace(name)
        except errors.NoSuchNamespaceError:
            return None

    wait_until(lambda: get() is not None, 120, f"namespace {name} on B")
    return get()


def read_dlsns(ns, stream: str) -> list[DLSN]:
    out: list = []
    with ns.open_reader(stream) as r:
        while batch := r.read_batch(100_000, 300):
            out += [rec.dlsn for rec in batch]
    return out
