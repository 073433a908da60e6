"""Every option of the ``ledger`` source and sink (DESIGN §4.4, §4.6), parsed here and only here.

Three validated, picklable option sets: ``SourceOptions`` (reads of ledgers, batch and streaming),
``StreamSourceOptions`` (reads of streams, option ``streams``), ``SinkOptions`` (writes into a
stream). They share one reading of Spark's options: names are case-insensitive, integers and
choices go through ``int_option`` / ``choice_option``, the cluster is option ``zk`` (else
``$SPARK_BOOKIE_ZK``), and its credentials are option ``client_conf`` (else
``$SPARK_BOOKIE_CLIENT_CONF``, jobs/connect.py). No I/O: bad input is an IncorrectParameterError
raised on the driver, before any task runs. Light to import (PySpark imports the source, hence
this, when a session starts): the stream modules load only when a read names streams.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import BinaryType, IntegralType, StringType, StructType

from jobs.connect import client_conf_path
from ledger_client.errors import IncorrectParameterError, InvalidNameError

if TYPE_CHECKING:
    from ledger_client.stream.dlsn import DLSN

ZK_ENV = "SPARK_BOOKIE_ZK"
DECODES = ("none", "utf8", "json")
LEDGER_ENTRIES_PER_PARTITION = 100_000   # ~100 MiB of 1 KiB entries: near Spark's 128 MiB split size
STREAM_ENTRIES_PER_PARTITION = 1_000     # an entry is a record set of up to output_buffer_bytes (256 KiB)
_GLOB_RE = re.compile(r"[A-Za-z0-9._*?\[\]!-]+")
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,255}")   # a subscription's name, as a stream's (DESIGN §4.5)


# ---------------------------------------------------------------- one reading of Spark's options


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's option names are case-insensitive (it lowercases them): look them up lowercased."""
    return {str(k).lower(): v for k, v in options.items()}


def int_option(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    """Option ``name`` (looked up lowercased, as ``lowered`` keeps them) as an int >= minimum."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise IncorrectParameterError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise IncorrectParameterError(f"option {name} must be >= {minimum}, not {value}")
    return value


def choice_option(options: Mapping[str, str], name: str, default: str, choices: tuple[str, ...],
                  wanted: str | None = None) -> str:
    """Option ``name`` (looked up lowercased) as one of ``choices``, matched case-insensitively;
    ``wanted`` says the choices in the error."""
    value = str(options.get(name.lower(), default)).strip().lower()
    if value not in choices:
        raise IncorrectParameterError(f"option {name} must be {wanted or f'one of {choices}'}, not {value!r}")
    return value


def zk_option(options: Mapping[str, str], env: Mapping[str, str], missing: str) -> str:
    """Option zk, else $SPARK_BOOKIE_ZK; ``missing`` is the error when there is neither."""
    zk = (options.get("zk") or env.get(ZK_ENV) or "").strip()
    if not zk:
        raise IncorrectParameterError(missing)
    return zk


def decode_options(options: Mapping[str, str]) -> tuple[str, str | None]:
    """(decode, the payload struct's DDL when decode=json) of a read, ledgers or streams."""
    decode = choice_option(options, "decode", "none", DECODES)
    schema = options.get("schema")
    if decode == "json" and not (schema and schema.strip()):
        raise IncorrectParameterError("decode=json needs option schema, e.g. 'id INT, name STRING'")
    return decode, schema.strip() if decode == "json" and schema else None


def payload_ddl(decode: str, json_schema: str | None) -> str:
    if decode == "utf8":
        return "STRING"
    if decode == "json":
        return f"STRUCT<{json_schema}>"
    return "BINARY"


def reads_streams(options: Mapping[str, str]) -> bool:
    """Whether a read's options ask for streams (option ``streams``) rather than ledgers."""
    return any(str(k).lower() == "streams" for k in options)


# ---------------------------------------------------------------- reads of ledgers


def parse_ledger_ids(raw: str) -> tuple[int, ...]:
    """"1,2, 7" → (1, 2, 7); duplicates dropped, order kept; anything else is a clear error."""
    out: list[int] = []
    for part in raw.split(","):
        p = part.strip()
        if not p:
            continue
        if not p.isdigit():
            raise IncorrectParameterError(f"option ledgers: {p!r} is not a ledger id (want e.g. '1,2,7')")
        if int(p) not in out:
            out.append(int(p))
    if not out:
        raise IncorrectParameterError(f"option ledgers names no ledger: {raw!r}")
    return tuple(out)


@dataclass(frozen=True)
class SourceOptions:
    """Validated options of one read of ledgers (batch or streaming). Picklable: executors get a copy."""

    zk: str
    ledgers: tuple[int, ...] | None = None     # None: every ledger the other rules admit
    password: bytes = b""
    metadata_filters: tuple[tuple[str, bytes, bool], ...] = ()   # (key, value, key is case-insensitive)
    decode: str = "none"
    json_schema: str | None = None             # DDL of the payload struct when decode=json
    entries_per_partition: int = LEDGER_ENTRIES_PER_PARTITION
    min_partitions: int = 1
    batch_entries: int = 16_384                # rows per Arrow batch a task yields
    starting_offsets: str = "earliest"         # streaming: earliest | latest
    max_entries_per_trigger: int = 0           # streaming: 0 = no limit
    client_conf: str | None = None             # client TOML (TLS, token, zk_auth; docs/security.md), on every executor

    @staticmethod
    def parse(options: Mapping[str, str], env: Mapping[str, str] | None = None) -> SourceOptions:
        env = os.environ if env is None else env
        filters = _metadata_filters(options)
        options = lowered(options)
        zk = zk_option(options, env, f"the ledger source needs option zk (or ${ZK_ENV}): "
                                     "spark.read.format('ledger').option('zk', 'host:2181')")
        decode, json_schema = decode_options(options)
        starting = choice_option(options, "startingOffsets", "earliest", ("earliest", "latest"), "earliest or latest")
        raw_ledgers = options.get("ledgers")
        return SourceOptions(
            zk=zk,
            ledgers=parse_ledger_ids(raw_ledgers) if raw_ledgers is not None else None,
            password=str(options.get("password", "")).encode(),
            metadata_filters=filters,
            decode=decode,
            json_schema=json_schema,
            entries_per_partition=int_option(options, "entries_per_partition", LEDGER_ENTRIES_PER_PARTITION, 1),
            min_partitions=int_option(options, "min_partitions", 1, 1),
            batch_entries=int_option(options, "batch_entries", 16_384, 1),
            starting_offsets=starting,
            max_entries_per_trigger=int_option(options, "max_entries_per_trigger", 0, 0),
            client_conf=client_conf_path(options.get("client_conf"), env),
        )

    def payload_ddl(self) -> str:
        return payload_ddl(self.decode, self.json_schema)

    def schema_ddl(self) -> str:
        return f"ledger_id BIGINT, entry_id BIGINT, payload {self.payload_ddl()}"

    def admits_metadata(self, custom: Mapping[str, bytes]) -> bool:
        """Every metadata filter matches the ledger's custom metadata."""
        lowered = {k.lower(): v for k, v in custom.items()}
        for key, value, insensitive in self.metadata_filters:
            got = lowered.get(key.lower()) if insensitive else custom.get(key)
            if got != value:
                return False
        return True


def _metadata_filters(options: Mapping[str, str]) -> tuple[tuple[str, bytes, bool], ...]:
    """`metadata.<key>` options (Spark lowercases option names: keys match case-insensitively) and
    `metadata` = a JSON object of exact keys → (key, value bytes, case-insensitive)."""
    out: list[tuple[str, bytes, bool]] = []
    for k, v in sorted(options.items()):
        if k.lower().startswith("metadata.") and len(k) > len("metadata."):
            out.append((k[len("metadata."):], str(v).encode(), True))
    raw = options.get("metadata")
    if raw:
        try:
            obj = json.loads(raw)
        except ValueError:
            raise IncorrectParameterError(f"option metadata must be a JSON object, not {raw!r}") from None
        if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
            raise IncorrectParameterError("option metadata must be a JSON object of strings")
        out += [(str(k), v.encode(), False) for k, v in sorted(obj.items())]
    return tuple(out)


# ---------------------------------------------------------------- reads of streams


def parse_stream_patterns(raw: str) -> tuple[tuple[str, str], ...]:
    """"payments/orders, payments/*" → (("payments", "orders"), ("payments", "*")); each item is
    ``namespace/stream`` where either part may be a glob (``*``, ``?``, ``[...]``)."""
    out: list[tuple[str, str]] = []
    for part in str(raw).split(","):
        p = part.strip()
        if not p:
            continue
        ns, sep, name = p.partition("/")
        if not sep or not _GLOB_RE.fullmatch(ns) or not _GLOB_RE.fullmatch(name):
            raise IncorrectParameterError(f"option streams: {p!r} is not namespace/stream (globs allowed, "
                                          "e.g. 'payments/orders,payments/*')")
        if (ns, name) not in out:
            out.append((ns, name))
    if not out:
        raise IncorrectParameterError(f"option streams names no stream: {raw!r}")
    return tuple(out)


def matches(patterns: Iterable[tuple[str, str]], ns: str, name: str) -> bool:
    return any(fnmatch.fnmatchcase(ns, a) and fnmatch.fnmatchcase(name, b) for a, b in patterns)


def _starting(raw: str) -> tuple[str, tuple[tuple[str, DLSN], ...]]:
    from ledger_client.stream.dlsn import DLSN  # not at import: PySpark imports this module at session start

    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower(), ()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not all(isinstance(v, str) for v in obj.values()):
        raise IncorrectParameterError(f"option startingOffsets must be earliest, latest or a JSON object "
                                      f'{{"ns/stream": "segment/entry/slot"}}, not {raw!r}')
    for k in obj:
        ((a, b),) = parse_stream_patterns(k) if "," not in k else ((k, "*"),)
        if any(c in a + b for c in "*?[!]"):
            raise IncorrectParameterError(f"option startingOffsets: {k!r} must name one stream (ns/name), not a glob")
    return "json", tuple(sorted((str(k), DLSN.parse(v)) for k, v in obj.items()))


SPAN_ROWS_DDL = "stream STRING, span STRING"   # a rows=spans source's columns (jobs/stream_copy.py)


def _rows(raw: str | None) -> str:
    rows = (raw or "records").strip().lower()
    if rows not in ("records", "spans"):
        raise IncorrectParameterError(f"option rows must be records or spans, not {raw!r}")
    return rows


def _subscription(raw: str | None) -> str | None:
    if raw is None:
        return None
    name = str(raw).strip()
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(f"option subscription: bad subscription name {raw!r}: want [A-Za-z0-9._-]+ "
                               "(not '.' or '..'), at most 255 characters")
    return name


@dataclass(frozen=True)
class StreamSourceOptions:
    """Validated options of a read of streams (batch or streaming). Picklable."""

    zk: str
    patterns: tuple[tuple[str, str], ...]
    decode: str = "none"
    json_schema: str | None = None
    entries_per_partition: int = STREAM_ENTRIES_PER_PARTITION
    min_partitions: int = 1
    starting_offsets: str = "earliest"                     # earliest | latest | json
    starting_dlsns: tuple[tuple[str, DLSN], ...] = ()      # with json: stream -> first DLSN to read
    max_records_per_trigger: int = 0                       # streaming: 0 = no limit
    client_conf: str | None = None                         # client TOML (TLS, token, zk_auth), on every executor
    subscription: str | None = None                        # streaming: committed with each batch (stream_subscription)
    rows: str = "records"                                  # streaming: records, or spans (jobs/stream_copy.py)

    @staticmethod
    def parse(options: Mapping[str, str], env: Mapping[str, str] | None = None) -> StreamSourceOptions:
        env = os.environ if env is None else env
        options = lowered(options)
        zk = zk_option(options, env, f"the ledger source needs option zk (or ${ZK_ENV})")
        decode, json_schema = decode_options(options)
        starting, dlsns = _starting(str(options.get("startingoffsets", "earliest")))
        return StreamSourceOptions(
            zk=zk, patterns=parse_stream_patterns(options.get("streams", "")), decode=decode,
            json_schema=json_schema,
            entries_per_partition=int_option(options, "entries_per_partition", STREAM_ENTRIES_PER_PARTITION, 1),
            min_partitions=int_option(options, "min_partitions", 1, 1),
            starting_offsets=starting, starting_dlsns=dlsns,
            max_records_per_trigger=int_option(options, "max_records_per_trigger", 0, 0),
            client_conf=client_conf_path(options.get("client_conf"), env),
            subscription=_subscription(options.get("subscription")), rows=_rows(options.get("rows")))

    def payload_ddl(self) -> str:
        return payload_ddl(self.decode, self.json_schema)

    def schema_ddl(self) -> str:
        if self.rows == "spans":
            return SPAN_ROWS_DDL
        return (f"stream STRING, segment BIGINT, entry_id BIGINT, slot INT, txid BIGINT, "
                f"payload {self.payload_ddl()}")


# ---------------------------------------------------------------- writes into a stream


@dataclass(frozen=True)
class SinkOptions:
    """Validated options of one write. Picklable: executors get a copy."""

    zk: str
    namespace: str
    stream: str
    has_txid: bool
    payload_is_string: bool
    lock_timeout_ms: int = 30_000            # how long a commit waits for a live writer to let the stream go
    orphan_grace_ms: int = 3_600_000         # unlinked task ledgers older than this are deleted by commits
    orphan_sweep_every_batches: int = 100    # streaming: sweep orphans every this many micro-batches
    write_id: str | None = None              # batch writes: a stable id makes a rerun of the same job a no-op
    client_conf: str | None = None           # a client TOML (TLS, token, zk_auth), readable on every executor

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType, env: Mapping[str, str] | None = None) -> SinkOptions:
        env = os.environ if env is None else env
        o = {k: str(v) for k, v in lowered(options).items()}
        zk = zk_option(o, env, f"the ledger sink needs option zk (or ${ZK_ENV})")
        target = o.get("stream", "").strip()
        ns, _, stream = target.partition("/")
        if not ns or not stream or "/" in stream:
            raise IncorrectParameterError(f"option stream must be NAMESPACE/STREAM, not {target!r}")
        has_txid, is_string = sink_columns(schema)
        return SinkOptions(zk, ns, stream, has_txid, is_string,
                           lock_timeout_ms=int_option(o, "lock_timeout_ms", 30_000, 0),
                           orphan_grace_ms=int_option(o, "orphan_grace_ms", 3_600_000, 0),
                           orphan_sweep_every_batches=int_option(o, "orphan_sweep_every_batches", 100, 1),
                           write_id=write_id_option(o), client_conf=client_conf_path(o.get("client_conf"), env))


def sink_columns(schema: StructType) -> tuple[bool, bool]:
    """(whether a txid column comes, whether the payload is a string) of a sink's input."""
    fields = {f.name.lower(): f for f in schema.fields}
    payload = fields.get("payload")
    if payload is None or not isinstance(payload.dataType, BinaryType | StringType):
        raise IncorrectParameterError("the ledger sink writes a `payload` column of type binary or string; "
                                      f"got columns {[f'{f.name} {f.dataType.simpleString()}' for f in schema]}")
    txid = fields.get("txid")
    if txid is not None and not isinstance(txid.dataType, IntegralType):
        raise IncorrectParameterError(f"the txid column must be an integer, not {txid.dataType.simpleString()}")
    return txid is not None, isinstance(payload.dataType, StringType)


def write_id_option(o: Mapping[str, str]) -> str | None:
    write_id = o.get("write_id")
    if write_id is not None and not write_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise IncorrectParameterError(f"option write_id must be [A-Za-z0-9._-]+, not {write_id!r}")
    return write_id


def writes_per_row(options: Mapping[str, str], schema: StructType) -> bool:
    """A write without option ``stream`` whose rows name their stream (a ``stream`` column), as
    Kafka's sink takes a ``topic`` column: jobs/stream_fanout.py."""
    return "stream" not in lowered(options) and any(f.name.lower() == "stream" for f in schema.fields)


SOURCE_POSITION_COLUMNS = ("segment", "entry_id", "slot")


@dataclass(frozen=True)
class FanoutOptions:
    """Validated options of a write whose rows name their stream ("ns/name" in column ``stream``).
    With the columns ``segment``, ``entry_id`` and ``slot`` (what the stream source reads), the
    rows are copies of a source stream's records at those positions: each segment written keeps
    the range it copies, and linking never takes a source record twice (the replicator, §4.12).
    ``source_zk`` (and ``source_client_conf``): a target namespace that does not exist is made
    with that cluster's settings of the same namespace."""

    zk: str
    has_txid: bool
    payload_is_string: bool
    copies_positions: bool
    copies_spans: bool = False               # rows are spans of source_zk's streams (jobs/stream_copy.py)
    lock_timeout_ms: int = 30_000
    orphan_grace_ms: int = 3_600_000
    orphan_sweep_every_batches: int = 100
    write_id: str | None = None
    client_conf: str | None = None
    source_zk: str | None = None
    source_client_conf: str | None = None

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType, env: Mapping[str, str] | None = None) -> FanoutOptions:
        env = os.environ if env is None else env
        o = {k: str(v) for k, v in lowered(options).items()}
        zk = zk_option(o, env, f"the ledger sink needs option zk (or ${ZK_ENV})")
        fields = {f.name.lower(): f for f in schema.fields}
        spans = "span" in fields and "payload" not in fields
        if spans and not isinstance(fields["span"].dataType, StringType):
            raise IncorrectParameterError(f"the span column (of a source with rows=spans) must be a string, "
                                          f"not {fields['span'].dataType.simpleString()}")
        has_txid, is_string = (True, False) if spans else sink_columns(schema)
        if not isinstance(fields["stream"].dataType, StringType):
            raise IncorrectParameterError("the stream column must be a string (NAMESPACE/STREAM), "
                                          f"not {fields['stream'].dataType.simpleString()}")
        have = [c for c in SOURCE_POSITION_COLUMNS if c in fields]
        if have and len(have) < len(SOURCE_POSITION_COLUMNS):
            raise IncorrectParameterError(f"source positions need all of {list(SOURCE_POSITION_COLUMNS)}, "
                                          f"not only {have}")
        if have and not all(isinstance(fields[c].dataType, IntegralType) for c in have):
            raise IncorrectParameterError(f"columns {have} must be integers")
        source_zk = (o.get("source_zk") or "").strip() or None
        source_conf = client_conf_path(o.get("source_client_conf"), {}) if source_zk else None
        if spans and source_zk is None:
            raise IncorrectParameterError("rows of spans are copied from option source_zk's cluster: set it")
        return FanoutOptions(zk, has_txid, is_string, bool(have) or spans, copies_spans=spans,
                             lock_timeout_ms=int_option(o, "lock_timeout_ms", 30_000, 0),
                             orphan_grace_ms=int_option(o, "orphan_grace_ms", 3_600_000, 0),
                             orphan_sweep_every_batches=int_option(o, "orphan_sweep_every_batches", 100, 1),
                             write_id=write_id_option(o), client_conf=client_conf_path(o.get("client_conf"), env),
                             source_zk=source_zk, source_client_conf=source_conf)
