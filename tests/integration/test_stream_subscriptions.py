"""Subscriptions (DESIGN §4.11, invariant 12) against a real ZooKeeper and a real bookie process:
a reader process killed with SIGKILL resumes with nothing skipped; two readers of one subscription
committing at once never move it back; retention waits for a lagging subscription; both backlog
quota policies; reset, delete and the typed errors. One cluster for the module."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading

import pytest
from bookie_helpers import module_cluster, wait_until
from client_helpers import client
from stream_helpers import writes

from ledger_client import DLSN, AsyncLedgerClient, errors

pytestmark = pytest.mark.integration

ONE_BOOKIE = {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1}
PAYLOAD = 100

sb = module_cluster(1, "One bookie for the module (each test uses namespaces of its own).")


def rec(i: int) -> bytes:
    return (b"rec-%06d|" % i).ljust(PAYLOAD, b".")


def write(ns, stream: str, n: int, start: int = 0) -> list[DLSN]:
    with ns.open_writer(stream) as w:
        futs = []
        for i in range(start, start + n):
            futs.append(w.write_async(rec(i)))
            if i % 10 == 9:
                w.flush()     # entries all acknowledged: the writer may roll
        w.flush()
        return [f.result(30) for f in futs]


def drain(r, until: DLSN) -> list:
    """Records from ``r`` up to and including ``until``."""
    out: list = []
    while not out or out[-1].dlsn < until:
        out += r.read_batch(10_000, 2_000)
    return out


SUB_READER = """
import sys
from ledger_client import LedgerClient
zk, ns, stream, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = LedgerClient(zk).namespace(ns).open_reader(stream, subscription="billing", commit_interval_ms=20)
n = 0
while n < stop:
    for rec in r.read_batch(7, 1000):
        print("got", rec.dlsn, flush=True)
        r.commit(rec.dlsn)
        n += 1
print("stopped", flush=True)
sys.stdin.read()
"""


def test_resume_after_kill9_skips_nothing(sb):
    seed = int(os.environ.get("SPARK_BOOKIE_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    stop, settle = rng.randint(40, 200), rng.random() < 0.5
    with client(sb) as c:
        ns = c.create_namespace("kill", segment_rolling_bytes=3_000, **ONE_BOOKIE)
        dlsns = write(ns, "s", 300)
        p = subprocess.Popen([sys.executable, "-c", SUB_READER, sb.connect_string, "kill", "s", str(stop)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        got = []
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("stopped"):
                break
            got.append(DLSN.parse(line.split()[1]))
        if settle:   # one interval later its last commit is written, without a sync or a close
            wait_until(lambda: ns.subscriptions("s")["billing"].position == got[-1], 10, "the batched commit")
        p.kill()                                          # SIGKILL: its last interval's commits may be lost
        p.wait(10)
        assert got == dlsns[:len(got)] and len(got) >= stop
        committed = ns.subscriptions("s")["billing"].position
        assert committed <= got[-1] and (committed == got[-1] or not settle)
        with ns.open_reader("s", subscription="billing") as r:
            rest = drain(r, dlsns[-1])
        first = rest[0].dlsn
        assert first <= dlsns[len(got)] and first > committed, (seed, first, committed)   # nothing skipped
        assert [x.dlsn for x in rest] == [d for d in dlsns if d >= first]
        assert [x.payload for x in rest] == [rec(dlsns.index(x.dlsn)) for x in rest]


def test_two_readers_racing_never_move_it_back(sb):
    seed = int(os.environ.get("SPARK_BOOKIE_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    with client(sb) as c:
        ns = c.create_namespace("race", segment_rolling_bytes=4_000, **ONE_BOOKIE)
        dlsns = write(ns, "s", 200)
        ns.commit_subscription("s", "shared", DLSN(1, 0, 0))
        seen: list[DLSN] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.01):
                seen.append(ns.subscriptions("s")["shared"].position)

        def consume(k: int) -> None:
            rng = random.Random(seed + k)
            with ns.open_reader("s", DLSN.INITIAL, subscription="shared", commit_interval_ms=rng.choice([0, 5])) as r:
                for x in drain(r, dlsns[-1]):
                    if rng.random() < 0.2:
                        r.commit(x.dlsn, sync=True)
                    else:
                        r.commit(x.dlsn)
                r.commit(dlsns[rng.randrange(len(dlsns))], sync=True)   # a late, lower commit is ignored

        watcher = threading.Thread(target=watch)
        watcher.start()
        readers = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
        stop.set()
        watcher.join(10)
        assert seen == sorted(seen), seed                                    # never backwards
        info = ns.subscriptions("s")["shared"]
        assert info.position == dlsns[-1] and info.backlog_records == 0 and info.backlog_bytes == 0


def test_retention_waits_for_a_lagging_subscription_and_backlog_is_exact(sb):
    with client(sb) as c:
        ns = c.create_namespace("lag", segment_rolling_bytes=2_000, retention_ms=0, retain_until_consumed=True,
                                **ONE_BOOKIE)
        ns.create_stream("s")
        ns.open_reader("s", subscription="lag").close()   # a new subscription at the start
        dlsns = write(ns, "s", 150)
        info = ns.stream_info("s")
        assert len(info.segments) >= 6
        lag = ns.subscriptions("s")["lag"]
        assert lag.backlog_records == 150 and lag.backlog_bytes == sum(s.bytes for s in info.segments if s.record_count)
        assert ns.apply_retention("s") == 0                 # nothing consumed: nothing goes
        third = [d for d in dlsns if d.segment == info.segments[2].sequence]
        mid = third[len(third) // 2]
        ns.commit_subscription("s", "lag", mid)
        lag = ns.subscriptions("s")["lag"]
        assert lag.position == mid and lag.backlog_records == 150 - dlsns.index(mid) - 1
        assert ns.apply_retention("s") == 2                 # the two segments it passed, not the one it is in
        assert ns.stream_info("s").segments[0].sequence == mid.segment
        with ns.open_reader("s", subscription="lag") as r:
            got = drain(r, dlsns[-1])
        assert [x.dlsn for x in got] == dlsns[dlsns.index(mid) + 1:]   # every record after it, still there
        ns.delete_subscription("s", "lag")
        assert ns.apply_retention("s") >= 1 and "lag" not in ns.subscriptions("s")


def test_backlog_quota_refusewrites(sb):
    with client(sb) as c:
        ns = c.create_namespace("refuse", segment_rolling_bytes=1_500, backlog_quota_bytes=3_000, **ONE_BOOKIE)
        ns.create_stream("s")
        r = ns.open_reader("s", subscription="slow", commit_interval_ms=0)
        w = ns.open_writer("s")
        written = []
        with pytest.raises(errors.QuotaExceededError, match="backlog quota"):
            for i in range(1_000):
                written.append(w.write(rec(i)))
        assert 2_000 < len(written) * (PAYLOAD + 28) < 4_000
        w.flush()
        got = drain(r, written[-1])
        assert [x.payload for x in got] == [rec(i) for i in range(len(written))]   # nothing of the refused one
        r.commit(got[-1].dlsn, sync=True)                    # consumed: the writer resumes by itself
        wait_until(lambda: writes(w, rec(9_999)), 10, "the writer to resume")
        w.close()
        r.close()


def test_backlog_quota_drop_oldest(sb):
    with client(sb) as c:
        ns = c.create_namespace("drop", segment_rolling_bytes=1_000, backlog_quota_bytes=3_000,
                                backlog_quota_policy="drop_oldest", **ONE_BOOKIE)
        ns.create_stream("s")
        ns.open_reader("s", subscription="slow").close()
        dlsns = write(ns, "s", 120)                         # each roll applies the quota
        ns.apply_retention("s")
        info = ns.stream_info("s")
        slow = ns.subscriptions("s")["slow"]
        first = info.segments[0].sequence
        assert first > 1 and slow.position == DLSN(first, 0, -1)   # moved to the new start
        assert slow.backlog_bytes <= 3_000 + max(s.bytes for s in info.segments)
        with ns.open_reader("s", subscription="slow") as r:
            got = drain(r, dlsns[-1])
        assert got[0].dlsn == DLSN(first, 0, 0) and [x.dlsn for x in got] == [d for d in dlsns if d.segment >= first]


def test_reset_delete_and_errors(sb):
    with client(sb) as c:
        ns = c.create_namespace("errs", segment_rolling_bytes=2_000, **ONE_BOOKIE)
        dlsns = write(ns, "s", 60)
        with ns.open_reader("s", subscription="a") as r:
            got = drain(r, dlsns[29])
            r.commit(got[29].dlsn, sync=True)
            r.commit(got[5].dlsn, sync=True)                # lower: ignored
            with pytest.raises(errors.PositionPastEndError):
                r.commit(DLSN(99, 0, 0))
        assert ns.subscriptions("s")["a"].position == dlsns[29]
        ns.reset_subscription("s", "a", dlsns[9])           # back: the explicit move
        with ns.open_reader("s", subscription="a") as r:
            assert r.read_next(5_000).dlsn == dlsns[10]
        ns.reset_subscription("s", "a", "earliest")
        assert ns.subscriptions("s")["a"].backlog_records == 60
        ns.reset_subscription("s", "a", "latest")
        assert ns.subscriptions("s")["a"].position == dlsns[-1]
        for call in (lambda: ns.reset_subscription("s", "nope", dlsns[0]), lambda: ns.delete_subscription("s", "nope")):
            with pytest.raises(errors.NoSuchSubscriptionError):
                call()
        with pytest.raises(errors.InvalidNameError):
            ns.open_reader("s", subscription="a/b")
        with pytest.raises(errors.InvalidNameError):
            ns.commit_subscription("s", "..", dlsns[0])
        with pytest.raises(errors.PositionPastEndError):
            ns.commit_subscription("s", "a", DLSN(dlsns[-1].segment, dlsns[-1].entry_id + 5, 0))
        with pytest.raises(errors.PositionPastEndError):
            ns.reset_subscription("s", "a", DLSN(dlsns[-1].segment, dlsns[-1].entry_id, dlsns[-1].slot + 1))
        with pytest.raises(errors.NoSuchStreamError):
            ns.subscriptions("nope")
        r = ns.open_reader("s", subscription="b", commit_interval_ms=0)
        first = r.read_next(5_000)
        ns.delete_subscription("s", "b")
        with pytest.raises(errors.NoSuchSubscriptionError):
            r.commit(first.dlsn, sync=True)
        r.close()
        assert sorted(ns.subscriptions("s")) == ["a"]
        ns.open_reader("s", start="latest", subscription="late").close()
        assert ns.subscriptions("s")["late"].backlog_records == 0
        more = write(ns, "s", 5, start=60)
        assert ns.subscriptions("s")["late"].backlog_records == 5
        with ns.open_reader("s", subscription="late") as r:
            assert [x.dlsn for x in drain(r, more[-1])] == more
        ns.delete_subscription("s", "late")
        asyncio.run(_async_surface(sb, dlsns))


async def _async_surface(sb, dlsns: list[DLSN]) -> None:
    c = AsyncLedgerClient(sb.connect_string)
    try:
        ns = await c.namespace("errs")
        r = await ns.open_reader("s", subscription="c", commit_interval_ms=0)
        rec0 = await r.read_next(5_000)
        await r.commit_async(rec0.dlsn)
        assert r.subscription == "c"
        await r.close()
        assert (await ns.subscriptions("s"))["c"].position == dlsns[0]
        await ns.reset_subscription("s", "c", "latest")
        await ns.delete_subscription("s", "c")
        await ns.commit_subscription("s", "d", dlsns[3])
        assert (await ns.subscriptions("s"))["d"].backlog_records == 65 - 4
    finally:
        await c.close()


def test_tiered_segments_count_by_position_and_stay_readable(sb, tmp_path):
    from jobs.stream_tiering import TieringConfig, tier_streams

    with client(sb) as c:
        ns = c.create_namespace("tier", segment_rolling_bytes=2_000, retention_ms=0, retain_until_consumed=True,
                                **ONE_BOOKIE)
        ns.create_stream("s")
        ns.open_reader("s", subscription="lag").close()
        dlsns = write(ns, "s", 80)
        before = ns.subscriptions("s")["lag"]
        tier_streams(TieringConfig(sb.connect_string, str(tmp_path / "t"), "tier/s"), client=c)
        info = ns.stream_info("s")
        tiered = [s for s in info.segments if s.state == "tiered"]
        assert tiered and all(s.ledger_id is None for s in tiered)
        assert ns.subscriptions("s")["lag"].backlog_records == before.backlog_records == 80
        inside = [d for d in dlsns if d.segment == tiered[0].sequence]
        ns.commit_subscription("s", "lag", inside[len(inside) // 2])    # its mark read from Delta
        lag = ns.subscriptions("s")["lag"]
        assert lag.backlog_records == 80 - dlsns.index(inside[len(inside) // 2]) - 1
        ns.apply_retention("s")                                          # waits for it
        assert ns.stream_info("s").segments[0].sequence == tiered[0].sequence
        with ns.open_reader("s", subscription="lag") as r:
            got = drain(r, dlsns[-1])
        assert [x.dlsn for x in got] == dlsns[dlsns.index(inside[len(inside) // 2]) + 1:]
