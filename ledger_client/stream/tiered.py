"""Reading a segment tiered into Delta (DESIGN §4.6): the same records, in the same order, with
the same DLSNs and txids as when they lived in the segment's ledger.

A tiered segment's metadata names its table and the Delta version that holds it; the rows are
read at that version (later commits of other segments cannot change what this one returns).
Columns (jobs/stream_tiering.py writes them): stream, segment, entry_id, slot, txid, payload.
"""

from __future__ import annotations

from metadata.streams import SegmentMeta

from .. import errors
from .dlsn import DLSN, LogRecord

COLUMNS = ("stream", "segment", "entry_id", "slot", "txid", "payload")


def read_tiered_segment(seg: SegmentMeta, ns: str, stream: str, start: DLSN) -> list[LogRecord]:
    """The segment's records at or after ``start``, in DLSN order."""
    if seg.tier is None:
        raise errors.MetadataServiceError(f"segment {seg.sequence} of {ns}/{stream} is tiered but names no table")
    try:
        from deltalake import DeltaTable

        table = DeltaTable(seg.tier.table, version=seg.tier.delta_version)
        rows = table.to_pyarrow_table(columns=list(COLUMNS[2:]), filters=[
            ("stream", "=", f"{ns}/{stream}"), ("segment", "=", seg.sequence)])
    except Exception as e:  # deltalake raises its own types (missing table, version vacuumed, I/O)
        raise errors.ReadError(f"segment {seg.sequence} of {ns}/{stream}: cannot read its Delta table "
                               f"{seg.tier.table} at version {seg.tier.delta_version}: {e}") from e
    if rows.num_rows != seg.record_count:
        raise errors.ReadError(f"segment {seg.sequence} of {ns}/{stream}: its Delta table holds {rows.num_rows} "
                               f"records, the metadata says {seg.record_count}")
    rows = rows.sort_by([("entry_id", "ascending"), ("slot", "ascending")])
    seq = seg.sequence
    out = [LogRecord(DLSN(seq, e, s), t, bytes(p)) for e, s, t, p in zip(
        rows.column("entry_id").to_pylist(), rows.column("slot").to_pylist(), rows.column("txid").to_pylist(),
        rows.column("payload").to_pylist(), strict=True)]
    return [r for r in out if r.dlsn >= start]
