"""What a read returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)
