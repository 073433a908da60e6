"""Option ``decode`` of a read (ledgers or streams): the payload column as bytes, UTF-8 text or
a struct parsed from one JSON object per entry or record. Runs on the executors."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa


def decode_payload(payload: pa.Array, decode: str, want: pa.DataType) -> pa.Array:
    """``payload`` (binary) as ``decode`` says: as is, UTF-8 text, or JSON parsed into ``want``."""
    if decode == "utf8":
        return utf8_column(payload)
    if decode == "json":
        return json_column(payload, want)
    return payload


def utf8_column(payload: pa.Array) -> pa.Array:
    try:
        return payload.cast(pa.string())
    except pa.ArrowInvalid:  # not all valid UTF-8: decode entry by entry, bad bytes become U+FFFD
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in payload.to_pylist()],
                        pa.string())


def json_column(payload: pa.Array, struct_type: pa.DataType) -> pa.Array:
    """One JSON object per entry → the struct; an entry that is not such an object → null."""
    import pyarrow.json as pj

    n = len(payload)
    if n == 0:
        return pa.array([], struct_type)
    values: list[bytes | None] = payload.to_pylist()
    joined = b"\n".join(v or b"" for v in values)
    if joined.count(b"\n") == n - 1 and all(values):  # no entry spans lines: pyarrow parses all at once
        try:
            table = pj.read_json(io.BytesIO(joined), parse_options=pj.ParseOptions(
                explicit_schema=pa.schema(list(struct_type)), unexpected_field_behavior="ignore"))
            if table.num_rows == n:
                cols = [table.column(f.name).combine_chunks() for f in struct_type]
                return pa.StructArray.from_arrays(cols, fields=list(struct_type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
            pass
    return pa.array([_json_one(v, struct_type) for v in values], struct_type)


def _json_one(value: bytes | None, struct_type: pa.DataType) -> dict[str, Any] | None:
    try:
        obj = json.loads(value) if value else None
        if not isinstance(obj, dict):
            return None
        pa.array([obj], struct_type)  # its fields convert: keep it
        return obj
    except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return None
