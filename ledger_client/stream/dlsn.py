"""Positions and records of a stream (DESIGN §4.5).

Both are NamedTuples, not dataclasses: a reader catching up creates two of them per record
(hundreds of thousands a second), and a tuple is built in one C call; they are immutable and
ordered all the same (a DLSN compares as (segment, entry_id, slot)).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from ..errors import IncorrectParameterError


class _Position(NamedTuple):
    segment: int
    entry_id: int
    slot: int


class DLSN(_Position):
    """A record's position: segment sequence number, entry id in the segment's ledger, slot in
    the entry's record set. Totally ordered; ``str`` is ``"segment/entry/slot"``."""

    __slots__ = ()
    INITIAL: ClassVar[DLSN]

    def __str__(self) -> str:
        return f"{self.segment}/{self.entry_id}/{self.slot}"

    @classmethod
    def parse(cls, text: str) -> DLSN:
        """The inverse of ``str``; IncorrectParameterError on anything else."""
        parts = text.strip().split("/") if isinstance(text, str) else []
        try:
            seg, entry, slot = (int(p) for p in parts)
        except ValueError:
            raise IncorrectParameterError(f"not a DLSN: {text!r} (want segment/entry/slot)") from None
        return cls.of(seg, entry, slot)

    @classmethod
    def of(cls, segment: int, entry_id: int, slot: int) -> DLSN:
        """A checked DLSN: segment >= 1, entry id and slot >= 0."""
        if segment < 1 or entry_id < 0 or slot < 0:
            raise IncorrectParameterError(f"not a DLSN: {segment}/{entry_id}/{slot}")
        return cls(segment, entry_id, slot)


DLSN.INITIAL = DLSN(1, 0, 0)


class LogRecord(NamedTuple):
    """One record as a reader returns it."""

    dlsn: DLSN
    txid: int
    payload: bytes
