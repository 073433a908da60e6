"""Clients that run as processes inside a host (``ip netns exec``), so a partition cuts them too.

Each command prints one line per event, flushed, for the test to collect (host_helpers.Agent):
``ledger <id>``, ``ack <entry id>``, ``fail <error class> <message>``, ``end <last entry id>``,
``verified <count>``, ``open``, ``rec <dlsn> <txid> <payload>``. Payloads are client_helpers.data,
so any reader can check any entry byte for byte without being told what was written.

    python host_agents.py write ZK E QW QA ENTRIES [LINGER_S]
    python host_agents.py read ZK LEDGER [--recover]
    python host_agents.py stream-write ZK NS STREAM TAG RECORDS [LINGER_S]
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future

from client_helpers import FAST, data

from ledger_client import ClientConfig, LedgerClient

_SAY = threading.Lock()


def say(*parts: object) -> None:
    """One event line in one write, under a lock: print() writes its parts one by one, so lines said
    by two threads (acks come on the client's threads) could be cut apart, and a part flushed early
    met a log line on stderr in the middle (the test then read "ack Connection ...")."""
    line = " ".join(map(str, parts)) + "\n"
    with _SAY:
        sys.stdout.write(line)
        sys.stdout.flush()


def write(zk: str, e: int, qw: int, qa: int, entries: int, linger_s: float = 60.0) -> None:
    """Append ``entries`` entries, a few in flight at a time, reporting each ack in order; after the
    first failure keep trying one append every 0.2 s for ``linger_s`` (an ack then is a bug: the
    ledger was fenced or closed by someone else)."""
    c = LedgerClient(zk, config=FAST)
    w = c.create_ledger(e, qw, qa)
    say("ledger", w.ledger_id)
    window: list[tuple[int, Future[int]]] = []
    failed = False
    for i in range(entries):
        try:
            window.append((i, w.append_async(data(w.ledger_id, i))))
            while len(window) >= 4 or (i == entries - 1 and window):
                eid, fut = window.pop(0)
                fut.result(120)
                say("ack", eid)
        except Exception as err:  # noqa: BLE001 (reported to the test, which judges it)
            say("fail", type(err).__name__, str(err).replace("\n", " ")[:200])
            say_ensemble(w)
            failed = True
            break
        time.sleep(0.01)
    deadline = time.monotonic() + linger_s
    next_id = entries
    while failed and time.monotonic() < deadline:
        try:
            eid = w.append(data(w.ledger_id, next_id))
            say("ack", eid)
            next_id += 1
        except Exception as err:  # noqa: BLE001
            say("fail", type(err).__name__, str(err).replace("\n", " ")[:200])
        time.sleep(0.2)
    if not failed:
        say_ensemble(w)
    say("done")


def say_ensemble(w) -> None:
    """The fragment this writer writes to, which the test checks is fenced. The ledger's last
    fragment after a recovery need not be it: a recovery's rewrites may replace a bookie, and that
    fragment, published only by the closing CAS, is one this writer never learns of."""
    md = w.metadata
    key = max(md.ensembles)
    say("ensemble", key, *md.ensembles[key])


def read(zk: str, ledger_id: int, recover: bool) -> None:
    """Open (recovering if asked), report the end, read every entry and check its bytes."""
    c = LedgerClient(zk, config=FAST)
    r = c.open_ledger(ledger_id, recovery=recover)
    say("end", r.last_add_confirmed)
    count = 0
    last = r.last_add_confirmed
    for first in range(0, last + 1, 500):
        for entry in r.read(first, min(first + 499, last)):
            if entry.data != data(ledger_id, entry.entry_id):
                say("fail", "Mismatch", entry.entry_id)
                return
            count += 1
    say("verified", count)


def stream_write(zk: str, ns: str, stream: str, tag: str, records: int, linger_s: float = 60.0) -> None:
    """Open the stream's writer and write ``records`` records ``<tag>-<i>``, reporting each ack; after
    a failure keep trying a write every 0.2 s for ``linger_s`` (an ack then breaks single-writer)."""
    c = LedgerClient(zk, config=ClientConfig(**{**FAST.__dict__}))
    w = c.namespace(ns).open_writer(stream, lock_timeout_ms=60_000)
    say("open")
    i, failed = 0, False
    deadline = float("inf")
    while i < records and time.monotonic() < deadline:
        payload = f"{tag}-{i}".encode()
        try:
            dlsn = w.write(payload)
            say("rec", dlsn, payload.decode())
            i += 1
        except Exception as err:  # noqa: BLE001
            say("fail", type(err).__name__, str(err).replace("\n", " ")[:200])
            if not failed:
                failed, deadline = True, time.monotonic() + linger_s
            time.sleep(0.2)
        time.sleep(0.02)
    say("done")


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "write":
        write(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]),
              float(args[5]) if len(args) > 5 else 60.0)
    elif cmd == "read":
        read(args[0], int(args[1]), "--recover" in args)
    elif cmd == "stream-write":
        stream_write(args[0], args[1], args[2], args[3], int(args[4]), float(args[5]) if len(args) > 5 else 60.0)
    else:
        raise SystemExit(f"unknown command {cmd}")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
