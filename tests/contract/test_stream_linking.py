"""Linking Spark task ledgers into a stream (metadata/streams/linking.py): the pure transitions,
then the same change committed through both stores (real ZooKeeper and the in-memory twin)."""

from __future__ import annotations

import random

import pytest

from metadata import BadVersionError, InvalidMetadataError, MetadataStore
from metadata.streams import SegmentState, StreamMeta, StreamView
from metadata.streams import linking as ln
from metadata.streams import transitions as tr
from metadata.streams.model import decode_stream, encode_stream


def task(partition: int, ledger: int, n: int, first: int | None = None, last: int | None = None) -> ln.TaskLedger:
    return ln.TaskLedger(partition, ledger, n, last_entry_id=max(0, n // 10), last_slot=0, nbytes=n * 10,
                         first_txid=first, last_txid=last)


def view(meta: StreamMeta | None = None) -> StreamView:
    return StreamView(meta or StreamMeta(), 0)


@pytest.mark.unit
def test_link_assigns_sequences_and_txids_in_partition_order():
    b = ln.SparkBatch.write("0000000000001-abc")
    ch = ln.link_batch(view(StreamMeta(next_sequence=4, max_txid=9)), b, [task(1, 71, 5), task(0, 70, 3)], 123)
    assert ch is not None
    assert [(s.sequence, s.ledger_id, s.first_txid, s.last_txid) for s in ch.create] == \
        [(4, 70, 10, 12), (5, 71, 13, 17)]
    assert all(s.state is SegmentState.SEALED and s.sealed_ms == 123 for s in ch.create)
    assert ch.meta.next_sequence == 6 and ch.meta.max_txid == 17
    assert ch.meta.spark_batches == {b.key: 0}
    assert decode_stream(encode_stream(ch.meta)) == ch.meta


@pytest.mark.unit
def test_a_replayed_batch_links_nothing():
    q = ln.SparkBatch.query("qid", 3)
    ch = ln.link_batch(view(), q, [task(0, 1, 2)], 0)
    assert ch is not None
    after = view(ch.meta)
    assert ln.link_batch(after, q, [task(0, 2, 2)], 0) is None           # the same batch again
    assert ln.link_batch(after, ln.SparkBatch.query("qid", 2), [task(0, 3, 1)], 0) is None  # an older one
    nxt = ln.link_batch(after, ln.SparkBatch.query("qid", 4), [task(0, 4, 1)], 0)
    assert nxt is not None and nxt.meta.spark_batches == {"q:qid": 4}


@pytest.mark.unit
def test_txids_from_a_column_must_not_go_back():
    meta = StreamMeta(max_txid=100)
    b = ln.SparkBatch.write("w1")
    ok = ln.link_batch(view(meta), b, [task(0, 1, 2, 100, 105), task(1, 2, 2, 105, 200)], 0)
    assert ok is not None and ok.meta.max_txid == 200
    with pytest.raises(ln.TxidOrderError):
        ln.link_batch(view(meta), b, [task(0, 1, 2, 99, 120)], 0)
    with pytest.raises(ln.TxidOrderError):
        ln.link_batch(view(meta), b, [task(0, 1, 2, 110, 120), task(1, 2, 2, 115, 130)], 0)
    with pytest.raises(ln.TxidOrderError):
        ln.link_batch(view(meta), b, [task(0, 1, 2, 120, 110)], 0)


@pytest.mark.unit
def test_bad_batches_are_refused():
    b = ln.SparkBatch.write("w")
    with pytest.raises(InvalidMetadataError, match="partition"):
        ln.link_batch(view(), b, [task(0, 1, 1), task(0, 2, 1)], 0)
    with pytest.raises(InvalidMetadataError, match="repeat"):
        ln.link_batch(view(), b, [task(0, 1, 1), task(1, 1, 1)], 0)
    with pytest.raises(InvalidMetadataError, match="non-empty"):
        ln.link_batch(view(), b, [task(0, 1, 0)], 0)
    with pytest.raises(InvalidMetadataError, match="ended"):
        ln.link_batch(view(StreamMeta(end_of_stream=True)), b, [task(0, 1, 1)], 0)
    started = tr.start_segment(view(), 9, 0, 0)
    with pytest.raises(InvalidMetadataError, match="in progress"):
        ln.link_batch(StreamView(started.meta, 1, {1: (started.create[0], 0)}), b, [task(0, 1, 1)], 0)
    existing = ln.link_batch(view(), ln.SparkBatch.write("a"), [task(0, 5, 1)], 0)
    assert existing is not None
    with pytest.raises(InvalidMetadataError, match="already segments"):
        ln.link_batch(StreamView(existing.meta, 1, {1: (existing.create[0], 0)}), b, [task(0, 5, 1)], 0)
    for bad in ("x:1", "q:", "w:a/b", "q:" + "x" * 300):
        with pytest.raises(InvalidMetadataError):
            ln.SparkBatch(bad, 0)
    with pytest.raises(InvalidMetadataError):
        ln.SparkBatch.query("q", -1)


@pytest.mark.unit
def test_batch_write_records_are_pruned_oldest_first(seed):
    rng = random.Random(seed)
    meta = StreamMeta(spark_batches={"q:keep": 7})
    ids = [f"{t:013d}-{rng.randrange(1 << 30):x}" for t in rng.sample(range(10**12), ln.BATCH_WRITES_KEPT + 5)]
    for i, wid in enumerate(ids):
        ch = ln.link_batch(view(meta), ln.SparkBatch.write(wid), [task(0, 1000 + i, 1)], 0)
        assert ch is not None
        meta = ch.meta
    writes = sorted(k for k in meta.spark_batches if k.startswith("w:"))
    assert len(writes) == ln.BATCH_WRITES_KEPT
    assert writes == sorted("w:" + w for w in ids)[-ln.BATCH_WRITES_KEPT:]
    assert meta.spark_batches["q:keep"] == 7


# ------------------------------------------------------------------ through both stores


@pytest.fixture
def stream_store(store: MetadataStore) -> MetadataStore:
    """An initialised cluster with stream ``ns/s`` (the ``store`` fixture: both backends)."""
    store.streams.create_namespace("ns", b'{"v":1,"settings":{}}')
    store.streams.create_stream("ns", "s", StreamMeta(ctime_ms=1))
    return store


def test_linking_commits_segments_and_the_batch_in_one_change(stream_store: MetadataStore) -> None:
    store = stream_store
    v0 = store.streams.read_stream("ns", "s")
    b = ln.SparkBatch.query("q1", 0)
    ch = ln.link_batch(v0, b, [task(0, 11, 4), task(1, 12, 6)], 5)
    store.streams.commit_stream("ns", "s", v0.version, ch)
    v1 = store.streams.read_stream("ns", "s")
    assert [(s.sequence, s.ledger_id, s.state, s.first_txid, s.last_txid) for s in v1.ordered()] == \
        [(1, 11, SegmentState.SEALED, 0, 3), (2, 12, SegmentState.SEALED, 4, 9)]
    assert v1.meta.spark_batches == {"q:q1": 0} and v1.meta.max_txid == 9
    assert ln.link_batch(v1, b, [task(0, 13, 1)], 6) is None
    # a commit decided on the old view loses its CAS: nothing is linked twice
    with pytest.raises(BadVersionError):
        store.streams.commit_stream("ns", "s", v0.version, ln.link_batch(v0, b, [task(0, 14, 1)], 7))
    assert store.streams.read_stream("ns", "s") == v1
    assert ln.linked_ledgers(v1) == {11, 12}
