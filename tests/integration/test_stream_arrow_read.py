"""``StreamReader.read_arrow_batch`` (DESIGN §4.5): the same records, positions, order and end as
``read_batch``, as Arrow columns, against real bookies: from a slot inside an entry, from a txid,
after a truncation inside an entry, mixed with ``read_batch``, at the tail and at the end."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from client_helpers import client

from ledger_client import DLSN, errors

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("segment", pa.int64()), ("entry_id", pa.int64()), ("slot", pa.int32()), ("txid", pa.int64()),
                    ("payload", pa.binary())])


def rows(rb: pa.RecordBatch) -> list[tuple]:
    assert rb.schema == SCHEMA
    d = rb.to_pydict()
    return [(DLSN(s, e, k), t, p) for s, e, k, t, p in zip(d["segment"], d["entry_id"], d["slot"], d["txid"],
                                                           d["payload"], strict=True)]


def arrow_all(ns, stream: str, size: int, **kw) -> list[tuple]:
    out: list = []
    with ns.open_reader(stream, **kw) as r:
        while (rb := r.read_arrow_batch(size, 300)) is not None:
            assert 0 < rb.num_rows <= size
            out += rows(rb)
    return out


def plain_all(ns, stream: str, **kw) -> list[tuple]:
    out: list = []
    with ns.open_reader(stream, **kw) as r:
        while batch := r.read_batch(10_000, 300):
            out += [(x.dlsn, x.txid, x.payload) for x in batch]
    return out


def test_arrow_reads_return_what_read_batch_returns(cluster_factory, seed):
    rng = random.Random(seed)
    sb = cluster_factory(3)
    with client(sb) as c:
        ns = c.create_namespace("pay", segment_rolling_bytes=6_000, output_buffer_bytes=700)
        w = ns.open_writer("orders")
        txid = 0
        for i in range(1_500):
            txid += rng.choice((0, 1, 1, 3))
            w.write_async(b"%d:" % i + rng.randbytes(rng.randrange(0, 90)), txid=txid)
        w.flush()
        every = plain_all(ns, "orders")
        assert len(every) == 1_500 and len({d.segment for d, _, _ in every}) >= 3
        assert arrow_all(ns, "orders", rng.randrange(1, 200)) == every
        at = next(i for i, (d, _, _) in enumerate(every) if i >= 300 and d.slot > 0)   # inside an entry
        assert arrow_all(ns, "orders", 64, start=every[at][0]) == every[at:]
        floor = every[900][1]
        assert arrow_all(ns, "orders", 50, start_txid=floor) == [x for x in every if x[1] >= floor]

        # read_batch and read_arrow_batch by turns: nothing skipped or repeated
        mixed: list = []
        with ns.open_reader("orders") as r:
            while len(mixed) < len(every):
                if rng.random() < 0.5:
                    mixed += [(x.dlsn, x.txid, x.payload) for x in r.read_batch(rng.randrange(1, 40), 300)]
                else:
                    rb = r.read_arrow_batch(rng.randrange(1, 40), 300)
                    mixed += rows(rb) if rb is not None else []
            assert r.position == DLSN(every[-1][0].segment, every[-1][0].entry_id, every[-1][0].slot + 1)
            assert r.read_arrow_batch(10, 200) is None                     # the tail: nothing yet
            w.write(b"late", txid=txid + 1)
            late = r.read_arrow_batch(10, 5_000)
            assert late is not None and rows(late)[0][1:] == (txid + 1, b"late")
        assert mixed == every

        cut = next(d for d, _, _ in every[1_000:] if d.slot > 1)
        w.truncate(cut)
        kept = [x for x in every + [(rows(late)[0][0], txid + 1, b"late")] if x[0] >= cut]
        assert arrow_all(ns, "orders", 77) == kept == plain_all(ns, "orders")
        w.mark_end_of_stream()
        with ns.open_reader("orders", start=kept[-1][0]) as r:
            assert rows(r.read_arrow_batch(10, 2_000)) == kept[-1:]
            with pytest.raises(errors.EndOfStreamError):
                r.read_arrow_batch(10, 2_000)
            with pytest.raises(errors.IncorrectParameterError):
                r.read_arrow_batch(0)


def test_closing_a_tailing_reader_does_not_wait_out_its_long_poll(cluster_factory, monkeypatch):
    """The read-ahead thread's long poll at the tail is cancelled by close(): with an 8 s poll,
    close returns long before it would end (it used to take the whole poll)."""
    import time

    import ledger_client.stream.reader as reader

    monkeypatch.setattr(reader, "LONG_POLL_MS", 8_000)
    sb = cluster_factory(3)
    with client(sb) as c:
        ns = c.create_namespace("tail")
        w = ns.open_writer("s")
        w.write(b"one")
        r = ns.open_reader("s")
        assert [x.payload for x in r.read_batch(10, 5_000)] == [b"one"]
        assert r.read_batch(10, 500) == []          # the read-ahead thread now waits in its long poll
        t = time.monotonic()
        r.close()
        assert time.monotonic() - t < 4.0
        w.close()
