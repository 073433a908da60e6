"""The sandbox's round-trip demo: one ledger written to every bookie, read back and checked.

At this stage the demo speaks the bookie protocol directly (the replicated ledger client comes
next): it registers ledger metadata in ZooKeeper, streams framed, CRC32C-digested entries to all
bookies (E = Qw = 3), reads every entry back from every bookie, verifies each digest and byte,
then deletes the ledger's metadata so the bookies' garbage collector reclaims it.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import Future

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import Digester, DigestType, master_key
from ledger_client.transport import BookieClient, status_error

from .sandbox import Sandbox

ENTRIES = 1000


def round_trip(sb: Sandbox, entries: int = ENTRIES) -> int:
    if sb.store is None:
        raise RuntimeError("sandbox is not started")
    ledger_id = secrets.randbits(40)
    password = b"demo"
    key = master_key(password)
    digester = Digester(DigestType.CRC32C, password)
    sb.store.create_ledger_node(ledger_id, b"demo ledger")
    clients = [BookieClient(b.bookie_id) for b in sb.bookies]
    try:
        payloads = [f"entry {i} of the spark-bookie demo".encode() * 8 for i in range(entries)]
        t0 = time.perf_counter()
        futures: list[Future[pb.AddResponse]] = []
        length = 0
        for i, data in enumerate(payloads):
            length += len(data)
            body = digester.frame(ledger_id, i, i - 1, length, data)
            futures += [c.add(ledger_id, i, key, body) for c in clients]
        for f in futures:
            r = f.result(timeout=30)
            if r.status != pb.EOK:
                raise status_error(r.status, r.detail, "add")
        elapsed = time.perf_counter() - t0
        print(f"wrote ledger {ledger_id}: {entries} entries x {len(clients)} bookies, durable, "
              f"in {elapsed * 1000:.0f} ms")
        for c in clients:
            got = 0
            while got < entries:
                resp = c.read_range(ledger_id, got, entries - 1)
                if resp.status != pb.EOK:
                    raise status_error(resp.status, resp.detail, f"read from {c.address}")
                for body in resp.bodies:
                    _lac, _len, data = digester.unframe(body, ledger_id, got)
                    if data != payloads[got]:
                        raise RuntimeError(f"entry {got} from {c.address} differs from what was written")
                    got += 1
            print(f"read back {got} entries from bookie {c.address}: digests and bytes match")
    finally:
        for c in clients:
            c.close()
        sb.store.delete_ledger_node(ledger_id)
    print("round trip OK")
    return 0
