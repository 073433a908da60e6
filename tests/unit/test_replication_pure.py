"""The pure parts of replication (DESIGN §4.12, invariant 13): segments that remember the source
range they copy, linking that never takes a source record twice, where a source truncation cuts
the replica, the lag clock, and the replication's configuration bound to its checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from jobs.replication_config import CONFIG_FILE, ReplicationConfig, prepared, saved_config
from jobs.replication_monitor import LagClock
from ledger_client import DLSN
from ledger_client.errors import IncorrectParameterError
from metadata import InvalidMetadataError
from metadata.streams import SegmentMeta, SegmentState, StreamMeta, StreamView
from metadata.streams.linking import SparkBatch, TaskLedger, link_batch, replica_cut, replicated_through
from metadata.streams.model import decode_segment, encode_segment

pytestmark = pytest.mark.unit

BATCH = SparkBatch.query("q1", 0)


def task(partition: int, lid: int, source: tuple | None, records: int = 10) -> TaskLedger:
    return TaskLedger(partition, lid, records, 0, records - 1, 100 * records, 100 * lid, 100 * lid + records - 1,
                      source)   # txids grow with the ledger id


def applied(view: StreamView, change) -> StreamView:
    segs = {**view.segments, **{s.sequence: (s, 0) for s in change.create}}
    return StreamView(change.meta, view.version + 1, segs)


def test_a_segment_keeps_its_source_range_and_one_without_writes_no_key():
    seg = SegmentMeta(3, 17, SegmentState.SEALED, 1, 10, 0, 9, 10, 1000, source=((2, 0, 0), (2, 4, 1)))
    assert decode_segment(encode_segment(seg)) == seg
    plain = replace(seg, source=None)
    assert "source" not in json.loads(encode_segment(plain))   # older clients read the rest unchanged
    assert decode_segment(encode_segment(plain)) == plain
    with pytest.raises(InvalidMetadataError):
        decode_segment(encode_segment(seg).replace(b"[[2,0,0],[2,4,1]]", b"[[2,4,1],[2,0,0]]"))


def test_linking_copies_keeps_ranges_skips_what_it_holds_and_refuses_a_partial_overlap():
    view = StreamView(StreamMeta(), 0)
    view = applied(view, link_batch(view, BATCH, [task(0, 11, ((1, 0, 0), (1, 9, 0))),
                                                  task(1, 12, ((1, 10, 0), (2, 3, 4)))], 5))
    assert [s.source for s in view.ordered()] == [((1, 0, 0), (1, 9, 0)), ((1, 10, 0), (2, 3, 4))]
    assert replicated_through(view) == (2, 3, 4)
    # another query (a replicator started without its checkpoint) copying the same records adds nothing
    again = link_batch(view, SparkBatch.query("q2", 0), [task(0, 21, ((1, 0, 0), (2, 3, 4)))], 6)
    assert again is not None and again.create == ()
    # ... nor the part of a batch it holds already, while the rest goes on
    more = link_batch(view, SparkBatch.query("q2", 1), [task(0, 22, ((1, 0, 0), (1, 9, 0))),
                                                        task(1, 23, ((2, 3, 5), (3, 0, 0)))], 7)
    assert [s.ledger_id for s in more.create] == [23]
    with pytest.raises(InvalidMetadataError, match="part of them twice"):
        link_batch(view, SparkBatch.query("q3", 0), [task(0, 31, ((2, 0, 0), (2, 9, 0)))], 8)


def test_a_replica_copies_one_source_stream_and_refuses_one_created_again_under_its_name():
    from metadata.streams.model import decode_stream, encode_stream

    view = StreamView(StreamMeta(), 0)
    first = replace(task(0, 11, ((1, 0, 0), (1, 9, 0))), source_ctime_ms=1000)
    view = applied(view, link_batch(view, BATCH, [first], 5))
    assert view.meta.source_ctime_ms == 1000
    assert decode_stream(encode_stream(view.meta)) == view.meta
    assert "source_ctime_ms" not in json.loads(encode_stream(StreamMeta()))   # older clients read the rest
    same = replace(task(0, 12, ((1, 10, 0), (1, 19, 0))), source_ctime_ms=1000)
    view = applied(view, link_batch(view, SparkBatch.query("q1", 1), [same], 6))
    # the source stream deleted and created again: its positions start again below what the replica holds
    other = replace(task(0, 13, ((1, 0, 0), (1, 4, 0))), source_ctime_ms=2000)
    with pytest.raises(InvalidMetadataError, match="created again"):
        link_batch(view, SparkBatch.query("q1", 2), [other], 7)
    with pytest.raises(InvalidMetadataError, match="one source stream"):
        link_batch(StreamView(StreamMeta(), 0), BATCH, [first, replace(other, partition=1)], 7)
    # copies that do not say (rows without spans) keep what the replica holds
    assert link_batch(view, SparkBatch.query("q1", 3), [task(0, 14, ((1, 20, 0), (1, 21, 0)))],
                      8).meta.source_ctime_ms == 1000


def test_stream_offsets_carry_the_streams_ctime_and_read_those_without():
    from jobs.stream_planning import offset_ctimes, offsets_from_json, offsets_to_json

    js = offsets_to_json({"a/x": (2, 3, 4), "a/y": (1, 0, 0)}, {"a/x": 1795758751027})
    assert js == {"a/x": "2/3/4@1795758751027", "a/y": "1/0/0"}
    assert offsets_from_json(js) == {"a/x": DLSN(2, 3, 4), "a/y": DLSN(1, 0, 0)}
    assert offset_ctimes(js) == {"a/x": 1795758751027}
    for bad in ({"a/x": "2/3/4@soon"}, {"a/x": "2/3@5"}, {"ax": "1/0/0"}):
        with pytest.raises(IncorrectParameterError):
            offsets_from_json(bad)


def test_a_source_truncation_cuts_the_replica_at_a_segment_or_inside_the_one_that_straddles_it():
    view = StreamView(StreamMeta(), 0)
    view = applied(view, link_batch(view, BATCH, [task(0, 11, ((1, 0, 0), (1, 9, 0))),
                                                  task(1, 12, ((2, 0, 0), (2, 9, 0)))], 5))
    assert replica_cut(view, (1, 0, 0)) == ((1, 0, 0), None)
    assert replica_cut(view, (2, 0, 0)) == ((2, 0, 0), None)      # exactly at a copied segment's start
    assert replica_cut(view, (1, 9, 1)) == ((2, 0, 0), None)      # past segment 1's last copy
    pos, seg = replica_cut(view, (2, 5, 0))                       # inside segment 2: the caller counts
    assert pos == (2, 0, 0) and seg is not None and seg.ledger_id == 12
    assert replica_cut(view, (9, 0, 0)) == ((3, 0, 0), None)      # past everything: the replica's end
    own = StreamView(view.meta, view.version, {**view.segments, 1: (replace(view.segments[1][0], source=None), 0)})
    assert replica_cut(own, (2, 5, 0)) == ((1, 0, 0), None)       # never past a segment that is not a copy


def test_lag_clock_is_an_upper_bound_from_the_last_pass_that_found_everything_copied():
    clock = LagClock()
    assert clock.lag("s", 100.0, DLSN(1, 5, 0), 6, None) == 0.0              # a backlog found at start
    assert clock.lag("s", 101.0, DLSN(1, 9, 0), 10, DLSN(1, 2, 0)) == 1.0    # counted from the start
    # (1,5,0) is copied: what is not was written after the last pass that saw the end there (100).
    assert clock.lag("s", 103.5, DLSN(1, 9, 0), 4, DLSN(1, 5, 0)) == 3.5
    assert clock.lag("s", 104.0, DLSN(1, 9, 0), 0, DLSN(1, 9, 0)) == 0.0
    assert clock.lag("s", 105.0, DLSN(1, 9, 0), 0, DLSN(1, 9, 0)) == 0.0
    assert clock.lag("s", 106.0, DLSN(2, 0, 0), 1, DLSN(1, 9, 0)) == 1.0     # written after the pass at 105
    assert clock.lag("s", 107.0, DLSN(2, 3, 0), 4, DLSN(1, 9, 0)) == 2.0
    assert clock.lag("s", 108.0, DLSN(2, 5, 0), 2, DLSN(2, 0, 0)) == 2.0     # (2,0,0) copied: seen last at 106
    # The subscription may trail the replica: records not consumed yet, but all copied.
    assert clock.lag("s", 109.0, DLSN(2, 5, 0), 5, DLSN(2, 5, 0)) == 0.0


def test_configuration_is_validated_and_bound_to_its_checkpoint(tmp_path):
    base = dict(from_zk="a:2181/ledgers", to_zk="b:2181/ledgers", streams="pay/*", checkpoint=str(tmp_path / "ck"))
    with pytest.raises(IncorrectParameterError, match="one cluster"):
        ReplicationConfig(**{**base, "to_zk": base["from_zk"]})
    with pytest.raises(IncorrectParameterError):
        ReplicationConfig(**{**base, "streams": "no-namespace"})
    with pytest.raises(IncorrectParameterError):
        ReplicationConfig(**{**base, "trigger_interval_ms": -1})
    first = prepared(ReplicationConfig(**base))
    assert first.subscription.startswith("replicate-")
    assert prepared(ReplicationConfig(**base)).subscription == first.subscription   # a restart: the same one
    with pytest.raises(IncorrectParameterError, match="another replication"):
        prepared(ReplicationConfig(**{**base, "streams": "other/*"}))
    assert saved_config(tmp_path / "ck").streams == "pay/*"
    (tmp_path / "ck" / CONFIG_FILE).write_text("{")
    with pytest.raises(IncorrectParameterError, match="unreadable"):
        saved_config(tmp_path / "ck")
    with pytest.raises(IncorrectParameterError, match="not a replication"):
        saved_config(tmp_path)


def test_only_errors_a_restart_cannot_cure_stop_the_replicator():
    from jobs.replicate import permanent

    cut = ("[STREAM_FAILED] Query replicate terminated\nTraceback (most recent call last):\n"
           "    raise errors.IncorrectParameterError(f'...')\n"   # a source line, not the error
           "ledger_client.errors.MetadataServiceError: connect to 198.18.0.1:28066: ZooKeeper unavailable")
    assert not permanent(RuntimeError(cut))
    assert permanent(RuntimeError("Traceback ...\nledger_client.errors.UnauthorizedAccessError: role r may not"))
    assert permanent(RuntimeError("x\nTransactionIdOutOfOrderError: stream a/b: txid 0 is below 9"))
