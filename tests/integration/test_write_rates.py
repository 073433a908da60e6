"""Write rates enforced by real bookies (DESIGN §4.10): a writer above its namespace's rate is
slowed, never failed, on either add transport, and a rate set on a namespace in use reaches the
bookies through their ZooKeeper watch. One cluster of three bookies for the module."""

from __future__ import annotations

import time

import pytest
from bookie_helpers import module_cluster

from ledger_client import ClientConfig, LedgerClient

pytestmark = pytest.mark.integration

SECONDS = 5.0


sb = module_cluster(3, "One cluster of three bookies for the module.")


def _offer(writer: object, per_s: float, seconds: float, size: int, grace_s: float = 0.0) -> tuple[int, list]:
    """write_async at `per_s` for `seconds`, 100 records at a time, open loop; (records
    acknowledged by the end, or `grace_s` after it, their futures)."""
    futs = []
    t0 = time.monotonic()
    for chunk in range(int(per_s * seconds) // 100):
        delay = t0 + chunk * 100 / per_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for i in range(chunk * 100, chunk * 100 + 100):
            futs.append(writer.write_async(i.to_bytes(8, "little") + b"r" * (size - 8)))   # type: ignore[attr-defined]
    end = t0 + seconds + grace_s
    time.sleep(max(0.0, end - time.monotonic()))
    return sum(1 for f in futs if f.done() and f.exception() is None), futs


def _all_written(writer: object, futs: list) -> None:
    writer.flush()   # type: ignore[attr-defined]
    for f in futs:
        f.result(timeout=60)   # slowed, never failed


def test_a_writer_at_twice_the_record_rate_gets_the_rate(sb) -> None:
    rate = 10_000   # an entry holds up to ~2,300 of these records: the rate's granularity is well under 10%
    with LedgerClient(sb.connect_string) as c:
        ns = c.create_namespace("rated-records", write_rate_records_per_s=rate)
        with ns.open_writer("s") as w:
            w.write(b"first")   # the segment's ledger exists and its bookies read its metadata
            got, futs = _offer(w, 2 * rate, SECONDS, 100)
            _all_written(w, futs)
    print(f"records acknowledged in {SECONDS} s at twice the rate: {got} (rate x s = {rate * SECONDS:.0f})")
    assert 0.9 * rate * SECONDS <= got <= 1.1 * rate * SECONDS


def test_a_rate_set_on_a_namespace_in_use_slows_its_writer_over_grpc(sb) -> None:
    rate_bytes = 1_000_000
    cfg = ClientConfig(bookie_add_transport="grpc")
    with LedgerClient(sb.connect_string, config=cfg) as c:
        ns = c.create_namespace("rated-bytes")
        with ns.open_writer("s") as w:
            # Unlimited: all of it. The last records are offered at the end of the second, so their acks
            # get 0.5 s more (on a busy host 10% of them came later than the second itself). A writer
            # wrongly held to the rate set below would have at most 15,000 acked by then.
            free, futs = _offer(w, 20_000, 1.0, 100, grace_s=0.5)
            _all_written(w, futs)
            assert free >= 0.9 * 20_000
            ns.update_settings(write_rate_bytes_per_s=rate_bytes)   # 10,000 records of 100 bytes a second
            time.sleep(0.5)   # the bookies' watch fires within a ZooKeeper round trip
            got, futs = _offer(w, 20_000, SECONDS, 100)
            _all_written(w, futs)
            lifted = ns.update_settings(write_rate_bytes_per_s=None)
            assert lifted.write_rate_bytes_per_s is None
    print(f"100-byte records acknowledged in {SECONDS} s at twice the byte rate: {got}")
    expected = rate_bytes / 100 * SECONDS
    assert 0.9 * expected <= got <= 1.1 * expected
