"""The ``ledger`` Spark data source (DESIGN §4.4, §4.6): ledgers and streams as DataFrames, batch
and streaming, and the sink into streams.

    spark.read.format("ledger").option("zk", Z).option("ledgers", "1,2").load()
    CREATE TEMPORARY VIEW v USING ledger OPTIONS (zk 'host:2181/ledgers', ledgers '1,2')

Columns: ``ledger_id`` BIGINT, ``entry_id`` BIGINT, ``payload`` (BINARY; STRING with
decode=utf8; STRUCT<schema> with decode=json); with option ``streams``, the stream columns
(jobs/stream_source.py). Options: jobs/options.py.

This module only picks the reader or writer; they live in modules of their own, none of which
imports this one: jobs/ledger_read.py (batch reads of ledgers), jobs/ledger_stream.py (readStream
of ledgers), jobs/stream_source.py and jobs/stream_tail.py (the same over streams),
jobs/stream_sink.py (writes). pyspark_ledger.DefaultSource is this class.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ledger_client.errors import IncorrectParameterError

from .ledger_read import LedgerPushdownReader, LedgerReader
from .options import SourceOptions, StreamSourceOptions, reads_streams, writes_per_row
from .pyspark_compat import pushdown_refused


class LedgerDataSource(DataSource):
    """``format("ledger")``: BookKeeper-style ledgers as rows (ledger_id, entry_id, payload)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # option streams: records of streams (jobs/stream_source.py), not entries of ledgers
        self.stream_opts = StreamSourceOptions.parse(options) if reads_streams(options) else None
        self.opts = SourceOptions.parse({k: v for k, v in options.items() if k.lower() != "startingoffsets"}
                                        if self.stream_opts else options)

    @classmethod
    def name(cls) -> str:
        return "ledger"

    def schema(self) -> str:
        return self.stream_opts.schema_ddl() if self.stream_opts else self.opts.schema_ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.stream_opts is not None:
            from .stream_source import StreamBatchReader, StreamPushdownReader

            if self.stream_opts.subscription is not None:
                raise IncorrectParameterError("option subscription is for spark.readStream: a batch read commits "
                                              "no position")
            if self.stream_opts.rows != "records":
                raise IncorrectParameterError("option rows=spans is for spark.readStream (the replicator's copies)")

            refused = pushdown_refused()
            return (StreamBatchReader if refused else StreamPushdownReader)(self.stream_opts, schema)
        if pushdown_refused():
            return LedgerReader(self.opts, schema)
        return LedgerPushdownReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.stream_opts is not None:
            from .stream_tail import StreamTailReader

            return StreamTailReader(self.stream_opts, schema)
        from .ledger_stream import LedgerStreamReader

        return LedgerStreamReader(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("ledger").option("stream", "ns/s")``: exactly once (jobs/stream_sink.py);
        without option stream, into the stream each row names (jobs/stream_fanout.py)."""
        if writes_per_row(self.options, schema):
            from .stream_fanout import FanoutWriter

            return FanoutWriter.build(self.options, schema, overwrite)
        from .stream_sink import StreamSinkWriter

        return StreamSinkWriter.build(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("ledger").option("stream", "ns/s")``: each micro-batch exactly once."""
        if writes_per_row(self.options, schema):
            from .stream_fanout import FanoutStreamWriter

            return FanoutStreamWriter.build(self.options, schema, overwrite)
        from .stream_sink import StreamSinkStreamWriter

        return StreamSinkStreamWriter.build(self.options, schema, overwrite)
