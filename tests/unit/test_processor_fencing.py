"""Adds arrive on connection threads while fences arrive on the event loop: the processor's lock
must make "checked unfenced, stored, journaled" one step against "fenced, FENCE journaled", or an
add could be acknowledged after the fencing read was answered (the old writer committing after
recovery started). Real journal and storage; the threads race for real."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from pathlib import Path

import pytest

from ledger_client.protocol import bookkeeper_pb2 as pb
from ledger_client.protocol.framing import HEADER
from spark_bookie.server.config import BookieConfig
from spark_bookie.server.processor import MASTER_KEY_BYTES, RequestProcessor
from spark_bookie.storage.journal import Journal, RecordType
from spark_bookie.storage.ledger_storage import LedgerStorage

pytestmark = pytest.mark.unit
KEY = b"k" * MASTER_KEY_BYTES
WRITERS = 4
LEDGERS = 40


def _add(lid: int, eid: int) -> pb.AddBatch:
    body = HEADER.pack(lid, eid, eid - 1, 0) + b"payload"
    return pb.AddBatch(ledger_adds=[pb.LedgerAdds(ledger_id=lid, master_key=KEY, entry_ids=[eid],
                                                  request_ids=[eid], bodies=[body])])


@pytest.fixture()
def switchy() -> object:
    """Let the interpreter switch threads every few bytecodes, so the race's window is hit."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield None
    sys.setswitchinterval(before)


def test_no_add_is_acknowledged_after_the_fence_of_its_ledger_is_journaled(tmp_path: Path, switchy: object) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    cfg = BookieConfig(journal_dirs=(str(tmp_path / "j"),), ledger_dirs=(str(tmp_path / "l"),))
    storage = LedgerStorage(tmp_path / "l")
    journal = Journal(tmp_path / "j", group_commit_wait_ms=0.0)
    journal.start()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    p = RequestProcessor(cfg, storage, journal, loop, None, lambda: False)  # type: ignore[arg-type]
    acked: set[tuple[int, int]] = set()
    acked_lock = threading.Lock()
    try:
        for lid in range(1, LEDGERS + 1):
            stop = threading.Event()

            def write(w: int, lid: int = lid, stop: threading.Event = stop) -> None:
                for i in range(1_000_000):
                    eid = w * 1_000_000 + i
                    answers: list[tuple[list[int], list[pb.AddResponse]]] = []
                    done = threading.Event()

                    p.process_adds(_add(lid, eid), lambda ok, failed, got=answers: got.append((ok, failed)), done.set)
                    assert done.wait(10), "an add was never answered"
                    ok, failed = answers[0]
                    if ok:
                        with acked_lock:
                            acked.add((lid, eid))
                    elif failed[0].status == pb.EFENCED or stop.is_set():
                        return
                    else:
                        raise AssertionError(f"unexpected answer {failed[0]}")

            writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
            p.process_adds(_add(lid, 999_999_999), lambda ok, failed: None)  # the ledger exists before the race
            for t in writers:
                t.start()
            threading.Event().wait(rnd.uniform(0.001, 0.02))
            asyncio.run_coroutine_threadsafe(p.fence(lid, KEY), loop).result(10)
            stop.set()
            for t in writers:
                t.join(30)
                assert not t.is_alive()
    finally:
        journal.stop()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
        storage.close()
    order: list[tuple[RecordType, int, int]] = []
    Journal(tmp_path / "j").replay(None, lambda r: order.append((r.type, r.ledger_id, r.entry_id)))
    fenced_at = {lid: i for i, (kind, lid, _) in reversed(list(enumerate(order))) if kind == RecordType.FENCE}
    late = [(lid, eid) for i, (kind, lid, eid) in enumerate(order)
            if kind == RecordType.ADD and (lid, eid) in acked and i > fenced_at[lid]]
    assert len(fenced_at) == LEDGERS and len(acked) > LEDGERS
    assert late == [], f"{len(late)} adds acknowledged though journaled after their ledger's fence: {late[:5]}"
