"""Copies by span: the ``ledger`` source plans, the ``ledger`` sink's task reads and writes.

    spark.readStream.format("ledger").option("streams", "pay/*").option("rows", "spans")   # stream, span
    ... .writeStream.format("ledger").option("zk", B).option("source_zk", A)                # copies them

With ``rows=spans`` the streaming source emits, per planned span (jobs/stream_planning.StreamSpan:
entries of one segment, cut to [lo, hi) by DLSN), one row instead of its records: the stream's
name and the span as JSON. The fan-out sink (jobs/stream_fanout.py), given such rows and
``source_zk``, reads each span from the source cluster inside its own task and writes the records
as it writes copied rows. The records then cross no JVM and no second Python worker: for the
replicator (§4.12) that was ~13 us of CPU per record, against ~2 to read a record and ~3 to write
one. Exactly-once is unchanged: a span names the same records on every replay, because records
below a LAC never change and tiering keeps their DLSNs (invariant 8), and linking records the
source positions each task ledger copies.

A span carries its ledger's password, as the source's partitions already do on their way to the
executors; JSON, not pickle, so a row that is not a span is a typed error, never code run.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ledger_client.errors import IncorrectParameterError

from .ledger_planning import IdRange
from .options import SPAN_ROWS_DDL
from .stream_planning import StreamSpan

if TYPE_CHECKING:
    from ledger_client import LedgerClient

SPAN_ROWS_SCHEMA = pa.schema([("stream", pa.string()), ("span", pa.string())])   # as SPAN_ROWS_DDL
__all__ = ["SPAN_ROWS_DDL", "SPAN_ROWS_SCHEMA", "copied_records", "span_from_json", "span_rows", "span_to_json"]


def span_to_json(span: StreamSpan) -> str:
    if span.txid.values is not None:
        raise IncorrectParameterError("a span with a txid set cannot be copied (the source pushes no filter)")
    return json.dumps({
        "stream": span.stream, "sequence": span.sequence, "ledger_id": span.ledger_id, "first": span.first,
        "last": span.last, "lo": list(span.lo), "hi": None if span.hi is None else list(span.hi),
        "tier": None if span.tier is None else list(span.tier),
        "password": base64.b64encode(span.password).decode("ascii"),
        "txid": [span.txid.lo, span.txid.hi], "first_txid": span.first_txid,
        "stream_ctime_ms": span.stream_ctime_ms}, separators=(",", ":"))


def span_from_json(text: Any) -> StreamSpan:
    """The span a ``rows=spans`` source wrote; IncorrectParameterError for anything else."""
    try:
        d = json.loads(text)
        hi, tier = d["hi"], d["tier"]
        span = StreamSpan(
            stream=str(d["stream"]), sequence=_int(d["sequence"]),
            ledger_id=None if d["ledger_id"] is None else _int(d["ledger_id"]),
            first=_int(d["first"]), last=_int(d["last"]), lo=_position(d["lo"]),
            hi=None if hi is None else _position(hi),
            tier=None if tier is None else (str(tier[0]), _int(tier[1])),
            password=base64.b64decode(d["password"], validate=True),
            txid=IdRange(_int(d["txid"][0]), _int(d["txid"][1])), first_txid=_int(d["first_txid"]),
            stream_ctime_ms=_int(d["stream_ctime_ms"]))
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise IncorrectParameterError(f"column span holds no span of a ledger source with rows=spans: "
                                      f"{str(text)[:80]!r} ({e})") from e
    if span.first < 0 or span.last < span.first:
        raise IncorrectParameterError(f"span of {span.stream} segment {span.sequence}: entries "
                                      f"{span.first}..{span.last} are no range")
    return span


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{v!r} is not an integer")
    return v


def _position(v: Any) -> tuple[int, int, int]:
    if not isinstance(v, list) or len(v) != 3:
        raise TypeError(f"{v!r} is not a position")
    return (_int(v[0]), _int(v[1]), _int(v[2]))


def span_rows(spans: list[StreamSpan]) -> pa.RecordBatch:
    """What a ``rows=spans`` source's task yields: one row per span, in the partition's order."""
    return pa.RecordBatch.from_arrays([pa.array([s.stream for s in spans], pa.string()),
                                       pa.array([span_to_json(s) for s in spans], pa.string())],
                                      schema=SPAN_ROWS_SCHEMA)


def copied_records(source: LedgerClient, rows: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch, int]]:
    """Each span row's records read from the source, as (stream, rows with the source's columns,
    the source stream's ctime_ms), in the rows' order (jobs/stream_source.read_span)."""
    from .stream_source import read_span

    names = {n.lower(): i for i, n in enumerate(rows.schema.names)}
    streams, spans = rows.column(names["stream"]), rows.column(names["span"])
    if streams.null_count or spans.null_count:
        raise IncorrectParameterError("a null stream or span: every span row names both")
    for key, text in zip(streams.to_pylist(), spans.to_pylist(), strict=True):
        span = span_from_json(text)
        if span.stream != key:
            raise IncorrectParameterError(f"a span of {span.stream} in a row of stream {key}")
        for table in read_span(source, span):
            for batch in table.to_batches():
                if batch.num_rows:
                    yield key, batch, span.stream_ctime_ms
