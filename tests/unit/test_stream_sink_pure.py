"""The Spark sink's pure parts: segment-relative txids in record sets, and the sink's options."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, DoubleType, LongType, StringType, StructField, StructType

from jobs.options import SinkOptions
from ledger_client import errors
from ledger_client.stream.records import FLAG_SEGMENT_TXIDS, RecordSet, encode

pytestmark = pytest.mark.unit


def test_relative_txids_need_the_segments_first_txid():
    data = encode([3, 4, 5], [b"a", b"bb", b""], records_before=3, flags=FLAG_SEGMENT_TXIDS)
    with pytest.raises(errors.CorruptRecordSetError, match="first txid"):
        RecordSet(data)
    rs = RecordSet(data, first_txid=100)
    assert rs.txids.tolist() == [103, 104, 105] and rs.payloads == [b"a", b"bb", b""]
    plain = RecordSet(encode([7, 8], [b"x", b"y"], 0), first_txid=100)   # absolute txids stay as written
    assert plain.txids.tolist() == [7, 8]


def schema(*fields: StructField) -> StructType:
    return StructType(list(fields))


def test_sink_options():
    s = schema(StructField("payload", StringType()), StructField("txid", LongType()))
    o = SinkOptions.parse({"zk": "h:1", "stream": "ns/s", "lock_timeout_ms": "5"}, s, env={})
    assert (o.namespace, o.stream, o.has_txid, o.payload_is_string, o.lock_timeout_ms) == ("ns", "s", True, True, 5)
    o = SinkOptions.parse({"Stream": "ns/s"}, schema(StructField("payload", BinaryType())),
                          env={"SPARK_BOOKIE_ZK": "z:2"})
    assert o.zk == "z:2" and not o.has_txid
    bad = [({"stream": "ns/s"}, s, {}),                                  # no zk
           ({"zk": "h", "stream": "nss"}, s, {}),
           ({"zk": "h", "stream": "ns/s/x"}, s, {}),
           ({"zk": "h", "stream": "ns/s"}, schema(StructField("value", BinaryType())), {}),
           ({"zk": "h", "stream": "ns/s"}, schema(StructField("payload", LongType())), {}),
           ({"zk": "h", "stream": "ns/s"}, schema(StructField("payload", BinaryType()),
                                                   StructField("txid", DoubleType())), {}),
           ({"zk": "h", "stream": "ns/s", "lock_timeout_ms": "x"}, s, {}),
           ({"zk": "h", "stream": "ns/s", "write_id": "a b"}, s, {})]
    for opts, sch, env in bad:
        with pytest.raises(errors.IncorrectParameterError):
            SinkOptions.parse(opts, sch, env=env)
