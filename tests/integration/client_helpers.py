"""Fixtures-by-function for client integration tests: a sandbox of real bookies plus clients."""

from __future__ import annotations

from ledger_client import ClientConfig, LedgerClient

FAST = ClientConfig(add_timeout_ms=3_000, read_timeout_ms=3_000, speculative_read_timeout_ms=200,
                    operation_timeout_ms=60_000, zk_session_timeout_ms=4_000)


def data(ledger_id: int, entry_id: int, size: int = 64) -> bytes:
    head = f"L{ledger_id}E{entry_id}|".encode()
    return (head * (size // len(head) + 1))[:size]


def client(sb, **overrides) -> LedgerClient:
    cfg = ClientConfig(**{**FAST.__dict__, **overrides})
    return LedgerClient(sb.connect_string, config=cfg)


def bookie_of(sb, bookie_id: str):
    return next(b for b in sb.bookies if b.bookie_id == bookie_id)
