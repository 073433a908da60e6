"""`spark-bookie replicate` and the per-row sink refuse bad input with one line and exit 2, before
any cluster or Spark session is touched (DESIGN §4.12)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from jobs.options import FanoutOptions, writes_per_row
from jobs.stream_fanout import _by_stream, split_key
from ledger_client.errors import IncorrectParameterError
from spark_bookie.cli.main import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("args", "says"), [
    (["--checkpoint", "{ck}"], "needs --from, --to, --streams"),
    (["--from", "a:1/x", "--to", "a:1/x", "--streams", "p/*", "--checkpoint", "{ck}"], "one cluster"),
    (["--from", "a:1/x", "--to", "b:1/x", "--streams", "nope", "--checkpoint", "{ck}"], "is not namespace/stream"),
    (["status", "--checkpoint", "{ck}"], "not a replication's checkpoint"),
])
def test_bad_input_is_one_line_and_status_2(args, says, tmp_path, capsys):
    code = main(["replicate", *[a.replace("{ck}", str(tmp_path)) for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])


def test_per_row_sink_options_are_checked_before_any_task():
    ok = schema(("stream", StringType()), ("payload", BinaryType()), ("txid", LongType()),
                ("segment", LongType()), ("entry_id", LongType()), ("slot", LongType()))
    assert writes_per_row({"zk": "z"}, ok) and not writes_per_row({"zk": "z", "stream": "a/b"}, ok)
    opts = FanoutOptions.parse({"zk": "z", "source_zk": "y"}, ok)
    assert opts.copies_positions and opts.has_txid and opts.source_zk == "y"
    with pytest.raises(IncorrectParameterError, match="need all of"):
        FanoutOptions.parse({"zk": "z"}, schema(("stream", StringType()), ("payload", BinaryType()),
                                                ("segment", LongType())))
    with pytest.raises(IncorrectParameterError, match="must be a string"):
        FanoutOptions.parse({"zk": "z"}, schema(("stream", LongType()), ("payload", BinaryType())))
    with pytest.raises(IncorrectParameterError, match="NAMESPACE/STREAM"):
        split_key("no-slash")


def test_rows_are_split_per_stream_keeping_each_streams_order():
    rb = pa.record_batch({"stream": ["a/x", "b/y", "a/x", "b/y", "a/x"], "payload": [b"1", b"2", b"3", b"4", b"5"]})
    got = {k: v.column(1).to_pylist() for k, v in _by_stream(rb)}
    assert got == {"a/x": [b"1", b"3", b"5"], "b/y": [b"2", b"4"]}
    with pytest.raises(IncorrectParameterError, match="null stream"):
        list(_by_stream(pa.record_batch({"stream": ["a/x", None], "payload": [b"1", b"2"]})))


def test_a_metrics_port_in_use_is_a_clear_error_before_any_query(tmp_path):
    import socket

    from jobs.replication_config import ReplicationConfig
    from jobs.replication_monitor import Monitor

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = ReplicationConfig("a:1/x", "b:1/x", "p/*", str(tmp_path), metrics_port=taken.getsockname()[1])
        with pytest.raises(IncorrectParameterError, match="--metrics-port"):
            Monitor(cfg, None, None, None).serve()


def test_span_rows_round_trip_and_refuse_anything_else():
    from jobs.ledger_planning import IdRange
    from jobs.options import StreamSourceOptions
    from jobs.stream_copy import span_from_json, span_rows, span_to_json
    from jobs.stream_planning import StreamSpan

    spans = [StreamSpan("a/x", 3, 17, 0, 40, (3, 0, 2), (3, 40, 1), None, b"\x00pw", IdRange(lo=-(1 << 63)), 100),
             StreamSpan("a/x", 4, None, 0, 9, (4, 0, 0), None, ("/t/tier", 7), b"", IdRange(lo=-(1 << 63)), 0)]
    rb = span_rows(spans)
    assert rb.column(0).to_pylist() == ["a/x", "a/x"]
    assert [span_from_json(t) for t in rb.column(1).to_pylist()] == spans
    o = StreamSourceOptions.parse({"zk": "z", "streams": "a/*", "rows": "Spans"}, env={})
    assert o.rows == "spans" and o.schema_ddl() == "stream STRING, span STRING"
    with pytest.raises(IncorrectParameterError, match="rows must be"):
        StreamSourceOptions.parse({"zk": "z", "streams": "a/*", "rows": "entries"}, env={})
    good = span_to_json(spans[0])
    for bad in ("not json", "{}", "[1]", good.replace('"first":0', '"first":"0"'),
                good.replace('"last":40', '"last":-1'), good.replace('"lo":[3,0,2]', '"lo":[3,0]'),
                good.replace('"password":"AHB3"', '"password":"%%"'), None):
        with pytest.raises(IncorrectParameterError, match="span"):
            span_from_json(bad)


def test_a_sink_of_spans_needs_the_source_cluster():
    spans = schema(("stream", StringType()), ("span", StringType()))
    opts = FanoutOptions.parse({"zk": "z", "source_zk": "y"}, spans)
    assert opts.copies_spans and opts.copies_positions and opts.has_txid
    with pytest.raises(IncorrectParameterError, match="source_zk"):
        FanoutOptions.parse({"zk": "z"}, spans)
    with pytest.raises(IncorrectParameterError, match="span column"):
        FanoutOptions.parse({"zk": "z", "source_zk": "y"}, schema(("stream", StringType()), ("span", BinaryType())))
