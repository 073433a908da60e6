"""Stream info while a writer is open (DistributedLog's getLastDLSN / getLastTxId /
getLogRecordCount), and what a writer sees after another one took its stream over."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bookie_helpers import module_cluster
from client_helpers import client
from stream_helpers import WriterProcess, payload

from ledger_client import DLSN, errors
from ledger_client.stream.meta import now_ms
from ledger_client.stream.records import FLAG_CONTROL, encode
from ledger_client.stream.segments import commit
from metadata import LedgerState
from metadata.streams import transitions as tr
from metadata.zk.testing import expire_session

pytestmark = pytest.mark.integration


sb = module_cluster(3, "One cluster of three bookies for the module (each test uses namespaces of its own).")


def cli_info(zk: str, stream: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "spark_bookie.cli", "stream", "--zk", zk, "info", stream, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def confirmed_bytes(c, ledger_id: int, password: bytes) -> tuple[int, int]:
    """(LAC, bytes of entries 0..LAC) of a ledger, read without fencing it."""
    h = c.open_ledger(ledger_id, password, recovery=False)
    lac = h.read_last_add_confirmed()
    return lac, sum(len(e.data) for e in h.read(0, lac)) if lac >= 0 else 0


def test_info_from_another_client_and_process_counts_a_live_writers_acknowledged_records(sb):
    zk = sb.connect_string
    with client(sb) as cw, client(sb) as cr:
        ns = cw.create_namespace("live", segment_rolling_bytes=1_000)   # ~40 records a segment
        w = ns.open_writer("s")
        dlsns = [w.write(payload(i), txid=1_000 + i) for i in range(600)]   # each acknowledged
        w.flush()   # the idle writer announces its LAC, which brings the bookies' LAC to the last write
        live = dlsns[-1].segment
        assert live >= 10 and dlsns[-1].entry_id > 0

        info = cr.namespace("live").stream_info("s")
        assert info.last_txid == 1_599 and info.last_dlsn == dlsns[-1]
        assert sum(s.record_count for s in info.segments) == 600
        seg = info.segments[-1]
        assert seg.sequence == live and seg.state == "in_progress"
        assert seg.record_count == sum(1 for d in dlsns if d.segment == live)
        assert seg.last_dlsn == dlsns[-1] and seg.last_txid == 1_599
        assert seg.first_txid == 1_600 - seg.record_count
        _lac, nbytes = confirmed_bytes(cr, seg.ledger_id, ns.settings.ledger_password)
        assert seg.bytes == nbytes > seg.record_count * (12 + len(payload(0)))

        out = cli_info(zk, "live/s")           # another process, the writer still open
        assert out["last_txid"] == 1_599 and out["last_dlsn"] == str(dlsns[-1])
        assert sum(s["record_count"] for s in out["segments"]) == 600
        assert out["segments"][-1]["state"] == "in_progress" and out["segments"][-1]["bytes"] == nbytes

        w.close()
        sealed = cr.namespace("live").stream_info("s").segments[-1]
        assert (sealed.state, sealed.record_count, sealed.last_dlsn, sealed.last_txid) == \
            ("sealed", seg.record_count, seg.last_dlsn, seg.last_txid)
        assert sealed.bytes >= seg.bytes


def test_info_of_a_writer_in_another_process_alive_then_dead_and_never_fenced(sb):
    with client(sb) as c:
        ns = c.create_namespace("child", segment_rolling_bytes=1_000)
        p = WriterProcess(sb.connect_string, "child", "s", 300, start=5_000)
        try:
            assert p.done.wait(120), p.lines[-5:]       # 300 acknowledged and flushed; the writer stays open
            last = DLSN.parse(p.acked[5_299])
            alive = ns.stream_info("s")
            assert alive.last_txid == 5_299 and alive.last_dlsn == last
            assert sum(s.record_count for s in alive.segments) == 300
        finally:
            p.kill()                                    # dead, its segment not recovered
        dead = ns.stream_info("s")
        assert dead == alive
        seg = dead.segments[-1]
        assert seg.state == "in_progress"
        assert c.ledger_metadata(seg.ledger_id).state is LedgerState.OPEN   # stream_info did not recover it
        with ns.open_writer("s", lock_timeout_ms=20_000):   # the next writer recovers (fences) and seals it
            pass
        sealed = next(s for s in ns.stream_info("s").segments if s.sequence == seg.sequence)
        assert (sealed.state, sealed.record_count, sealed.last_dlsn, sealed.last_txid) == \
            ("sealed", seg.record_count, seg.last_dlsn, seg.last_txid)


def _start_segment_by_hand(c, ns, stream: str, first_txid: int):
    """A segment in progress whose ledger this test writes itself (a writer that is, or looks, dead)."""
    s = ns.settings
    h = c.create_ledger(s.ensemble_size, s.write_quorum_size, s.ack_quorum_size, s.digest, s.ledger_password)
    _view, change = commit(ns, stream, lambda v: tr.start_segment(v, h.ledger_id, first_txid, now_ms()), None)
    return h, change.create[0].sequence


def test_info_of_empty_and_hand_written_striped_segments_without_fencing(sb):
    """A striped namespace (E3/Qw2): the entry at the LAC is read from its write set."""
    with client(sb) as c, client(sb) as other:
        ns = c.create_namespace("hand", ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
        with ns.open_writer("s") as w:
            before = [w.write(payload(i), txid=i) for i in range(3)]
        h, seq = _start_segment_by_hand(c, ns, "s", 3)   # a writer that just rolled: no entry yet
        info = other.namespace("hand").stream_info("s")
        seg = info.segments[-1]
        assert (seg.sequence, seg.state, seg.record_count, seg.bytes, seg.last_dlsn, seg.last_txid) == \
            (seq, "in_progress", 0, 0, None, -1)
        assert info.last_dlsn == before[-1] and info.last_txid == 2

        # Entries of a writer that is not this client's, then an idle control record, as writers
        # wrote before they announced their LAC instead (old segments still hold them).
        e0 = encode([3, 4, 5], [b"a", b"bb", b"ccc"], 0)
        e1 = encode([6], [b"dddd"], 3)
        for body in (e0, e1, encode([], [], 4, FLAG_CONTROL)):
            h.append(body)
        info = other.namespace("hand").stream_info("s")   # the bookies' LAC is entry 1 (the control carried it)
        seg = info.segments[-1]
        assert (seg.record_count, seg.bytes, seg.last_dlsn, seg.last_txid) == (4, len(e0) + len(e1), DLSN(seq, 1, 0), 6)
        assert info.last_dlsn == DLSN(seq, 1, 0) and info.last_txid == 6
        h.append(encode([7], [b"e"], 4))          # not fenced: the writer still gets acks
        h.close()


def test_a_taken_over_writer_gets_ledger_fenced_errors_naming_the_new_writer(sb):
    with client(sb) as ca, client(sb) as cb:
        ns_a = ca.create_namespace("takeover")
        wa, wa2 = ns_a.open_writer("s"), ns_a.open_writer("s2")
        for i in range(5):
            wa.write(payload(i), txid=i)
            wa2.write(payload(i), txid=i)
        expire_session(ca.store, timeout_s=4)              # A's locks go with its session ...
        ns_b = cb.namespace("takeover")
        wb = ns_b.open_writer("s", lock_timeout_ms=20_000)   # ... B takes "s" over, fencing A's segment
        holder = cb.store.streams.stream_lock_holder("takeover", "s")
        assert holder
        with pytest.raises(errors.LedgerFencedError, match="taken over"):   # the write in flight when A learns it
            wa.write(payload(5), txid=5)
        for _ in range(3):                                # and every later one, sync and async
            with pytest.raises(errors.LedgerFencedError, match="taken over") as sync:
                wa.write(payload(6), txid=6)
            assert f"writer {holder}" in str(sync.value) and sync.value.code == errors.LedgerFencedError.code
            with pytest.raises(errors.LedgerFencedError, match="taken over") as asyn:
                wa.write_async(payload(7), txid=7).result(10)
            assert f"writer {holder}" in str(asyn.value)
        with pytest.raises(errors.LedgerFencedError):
            wa.flush()
        with pytest.raises(errors.LedgerFencedError):
            wa.truncate(DLSN(1, 0, 0))
        assert isinstance(sync.value, errors.StreamClosedError)   # still that too: the writer is closed
        wb.write(b"b's", txid=100)
        wb.close()
        with pytest.raises(errors.LedgerFencedError, match=f"taken over by writer {holder}"):   # who took it over
            wa.write(payload(8), txid=8)
        wa.close()                                        # quiet

        ns_b.open_writer("s2", lock_timeout_ms=20_000).close()   # took "s2" over and let it go again
        with pytest.raises(errors.LedgerFencedError):
            wa2.write(payload(5), txid=5)
        with pytest.raises(errors.LedgerFencedError, match="taken over by another writer"):   # nobody holds it
            wa2.write(payload(6), txid=6)
        wa2.close()
