"""The sandbox demo (README's main command): a replicated ledger surviving a bookie's death, then
a stream surviving its writer's.

Ledger: one client writes a ledger with E3/Qw3/Qa2; halfway through, one bookie of its ensemble is
killed with SIGKILL and the writer keeps going through an ensemble change; a second client then
opens the ledger with recovery (fencing the writer), reads every entry back byte for byte and
prints the ledger's fragments.

Stream: a writer appends records to a stream that rolls into several segments while a reader
tails it; the writer's client then dies without closing; a second writer takes the stream over
(recovering and sealing the first one's segment with fencing) and goes on; the reader sees every
acknowledged record once, in order, and the stream's segments are printed.

On a secured sandbox (`sandbox --secure --demo`) every client of the demo presents the sandbox's
client config (``client_conf``: TLS with a client certificate, the token, zk_auth).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path

from ledger_client import ClientConfig, LedgerClient, LogRecord, errors
from spark_bookie.local.sandbox import Sandbox

ENTRIES = 2000


def _payload(i: int) -> bytes:
    return f"entry {i:05d} of the spark-bookie demo ".encode() * 16


def _config(client_conf: str | Path | None) -> ClientConfig:
    """The demo's client settings, with the credentials of ``client_conf`` on a secured sandbox."""
    if client_conf is not None:
        return ClientConfig.from_toml(client_conf, add_timeout_ms=5_000)
    return ClientConfig(add_timeout_ms=5_000)


def round_trip(sb: Sandbox, entries: int = ENTRIES, client_conf: str | Path | None = None) -> int:
    cfg = _config(client_conf)
    with LedgerClient(sb.connect_string, config=cfg) as writer_client:
        w = writer_client.create_ledger(3, 3, 2, password=b"demo", custom_metadata={"demo": b"yes"})
        print(f"created ledger {w.ledger_id} on {w.metadata.ensembles[0]} (E3/Qw3/Qa2)")
        victim = w.metadata.ensembles[0][1]
        futures: list[Future[int]] = []
        t0 = time.perf_counter()
        for i in range(entries):
            if i == entries // 2:
                for b in futures[-200:]:
                    b.result(timeout=60)
                proc = next(b for b in sb.bookies if b.bookie_id == victim)
                proc.kill()
                print(f"killed bookie {victim} (SIGKILL) after {i} entries; still writing")
            futures.append(w.append_async(_payload(i)))
        acked = [f.result(timeout=120) for f in futures]
        took = time.perf_counter() - t0
        print(f"{len(acked)} entries acknowledged in {took:.2f} s ({len(acked) / took:,.0f}/s), "
              f"last add confirmed {w.last_add_confirmed}")
        with LedgerClient(sb.connect_string, config=cfg) as reader_client:
            r = reader_client.open_ledger(w.ledger_id, b"demo", recovery=True)
            print(f"second client recovered the ledger: closed={r.is_closed}, last entry {r.last_add_confirmed}")
            try:
                w.append(b"one more")
                print("ERROR: the old writer could still append after recovery")
                return 1
            except errors.LedgerFencedError:
                print("the old writer is fenced: its next append fails with LedgerFencedError")
            got = r.read(0, r.last_add_confirmed)
            bad = [e.entry_id for e in got if e.data != _payload(e.entry_id)]
            if len(got) != entries or bad:
                print(f"ERROR: read back {len(got)} entries, {len(bad)} differ")
                return 1
            print(f"read back all {len(got)} entries: every byte matches")
            print("fragments (first entry: bookies):")
            for first, bookies in sorted(r.metadata.ensembles.items()):
                print(f"  {first}: {bookies}")
    if stream_round_trip(sb, client_conf=client_conf) != 0:
        return 1
    print("demo OK")
    return 0


def stream_round_trip(sb: Sandbox, records: int = 3_000, client_conf: str | Path | None = None) -> int:
    cfg = _config(client_conf)
    with LedgerClient(sb.connect_string, config=cfg) as admin:
        ns = admin.create_namespace("demo", segment_rolling_bytes=256 << 10, output_buffer_bytes=16 << 10)
        first = LedgerClient(sb.connect_string, config=cfg)
        w = first.namespace("demo").open_writer("events")   # creates the stream
        reader = ns.open_reader("events")                    # tails it from the start
        acked = [w.write_async(_payload(i)) for i in range(records // 2)]
        w.flush()
        print(f"stream demo/events: {len(acked)} records written by a first writer")
        first.close()   # its process "dies": no close, its lock goes with its ZooKeeper session
        with admin.namespace("demo").open_writer("events") as w2:
            print(f"a second writer took the stream over (last txid it found: {w2.last_txid})")
            acked += [w2.write_async(_payload(i)) for i in range(records // 2, records)]
        got: list[LogRecord] = []
        while len(got) < records:
            batch = reader.read_batch(10_000, 5_000)
            if not batch:
                break
            got += batch
        reader.close()
        if [r.payload for r in got] != [_payload(i) for i in range(records)] or \
                [r.dlsn for r in got] != [f.result(10) for f in acked]:
            print(f"ERROR: the tailing reader got {len(got)} records, not the {records} acknowledged ones in order")
            return 1
        print(f"a tailing reader got all {records} records once, in order, with their DLSNs")
        for seg in ns.stream_info("events").segments:
            print(f"  segment {seg.sequence}: {seg.state}, {seg.record_count} records, txids "
                  f"{seg.first_txid}..{seg.last_txid}, {seg.first_dlsn}..{seg.last_dlsn}")
    return 0
