"""Client configuration: one frozen dataclass, units in the names, validated at construction."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from metadata.tls import ZkTls, ZkTlsError

from .errors import IncorrectParameterError


@dataclass(frozen=True)
class ClientConfig:
    zk_session_timeout_ms: int = 10_000
    zk_connect_timeout_ms: int = 10_000
    add_timeout_ms: int = 10_000              # a bookie that has not acknowledged an add this long is replaced (any Qw)
    read_timeout_ms: int = 10_000             # deadline of one read RPC
    speculative_read_timeout_ms: int = 400    # ask the next replica too when one is this slow
    outstanding_adds_max: int = 20_000        # appends waiting for acks per ledger (back-pressure beyond)
    ensemble_changes_max: int = 32            # per write handle; beyond, the ledger is closed
    delay_ensemble_change: bool = True        # no spare for a failed bookie: keep writing on Qa (see conf/client.toml)
    entry_size_bytes_max: int = 5 * 1024 * 1024 - 1024   # payload; the bookie's limit covers the frame
    read_batch_entries_max: int = 2_000       # entries per range read
    read_batch_bytes_max: int = 4 * 1024 * 1024
    explicit_lac_interval_ms: int = 0         # 0 = off; else idle writers send their LAC this often
    metadata_retries_max: int = 30            # CAS retries of one metadata change
    operation_timeout_ms: int = 60_000        # an append, open, recovery or close never waits longer
    recovery_read_window_entries: int = 64    # a recovery open reads this many entries ahead at once
    bookie_batch_entries_max: int = 512       # adds per stream message to one bookie
    bookie_in_flight_adds_max: int = 10_000   # sent to one bookie, not yet answered (< its per-stream limit)
    bookie_backlog_adds_max: int = 200_000    # waiting for one bookie; beyond, it is too slow and is replaced
    bookie_messages_in_flight_max: int = 1    # unanswered small messages per bookie before adds gather (0 = off)
    bookie_window_bypass_adds: int = 16       # a message with this many adds is not small: no wait after it
    bookie_add_transport: str = "tcp"         # "tcp" (the bookie's add listener) or "grpc" (its AddStream call)
    bookie_read_transport: str = "tcp"        # range and listed reads: "tcp" (the same port) or "grpc" (ReadRange)
    placement_seed: int | None = None         # seed of the placement randomness (tests, simulation)
    zk_auth: str | None = None                # "user:password": ZooKeeper digest credentials (secured clusters)
    zk_member_auth: str | None = None         # "members:password": a role's shared ZooKeeper credentials (tenants)
    auth_token: str | None = None             # a signed JWT the bookies accept (docs/security.md)
    auth_token_file: str | None = None        # or a file holding it, re-read when it changes (rotation)
    tls_ca_path: str | None = None            # PEM CA bundle the bookies' certificates must chain to: TLS on
    tls_cert_path: str | None = None          # this client's certificate (mTLS), with tls_key_path
    tls_key_path: str | None = None
    zk_tls: bool = False                      # ZooKeeper over TLS too (its secure port), checked against tls_ca_path

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise IncorrectParameterError(f"client config {f.name} must not be negative")
        if min(self.outstanding_adds_max, self.bookie_batch_entries_max, self.bookie_in_flight_adds_max,
               self.bookie_backlog_adds_max, self.bookie_window_bypass_adds, self.recovery_read_window_entries) < 1:
            raise IncorrectParameterError("outstanding_adds_max, recovery_read_window_entries and the bookie_* add "
                                          "limits must be >= 1")
        if self.zk_auth is not None and (not isinstance(self.zk_auth, str) or ":" not in self.zk_auth
                                         or self.zk_auth.startswith(":") or self.zk_auth.endswith(":")):
            raise IncorrectParameterError("zk_auth must be 'user:password' with both parts non-empty")
        if self.zk_member_auth is not None and (
                not isinstance(self.zk_member_auth, str) or ":" not in self.zk_member_auth
                or self.zk_member_auth.startswith(":") or self.zk_member_auth.endswith(":") or self.zk_auth is None):
            raise IncorrectParameterError("zk_member_auth must be 'user:password' with both parts non-empty, "
                                          "beside a zk_auth of the role's own")
        if self.auth_token is not None and self.auth_token_file is not None:
            raise IncorrectParameterError("give auth_token or auth_token_file, not both")
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise IncorrectParameterError("tls_cert_path and tls_key_path go together (a client certificate, its key)")
        if self.tls_cert_path is not None and self.tls_ca_path is None:
            raise IncorrectParameterError("a client certificate (tls_cert_path) needs tls_ca_path (TLS)")
        self._check_zk_tls()
        if not isinstance(self.delay_ensemble_change, bool):
            raise IncorrectParameterError("delay_ensemble_change must be true or false")
        for key in ("bookie_add_transport", "bookie_read_transport"):
            if getattr(self, key) not in ("tcp", "grpc"):
                raise IncorrectParameterError(f"{key} must be 'tcp' or 'grpc', not {getattr(self, key)!r}")

    def _check_zk_tls(self) -> None:
        if not isinstance(self.zk_tls, bool):
            raise IncorrectParameterError("zk_tls must be true or false")
        if self.zk_tls and self.tls_ca_path is None:
            raise IncorrectParameterError("zk_tls needs tls_ca_path (the CA ZooKeeper's certificate chains to)")
        try:   # the files now, not as a connect timeout later (kazoo retries a file it cannot load)
            tls = self.zookeeper_tls()
            if tls is not None:
                tls.check()
        except ZkTlsError as e:
            raise IncorrectParameterError(f"zk_tls: {e}") from e

    def zookeeper_tls(self) -> ZkTls | None:
        """The TLS of this client's ZooKeeper session (``zk_tls``), or None: one cluster CA, so the
        bookies' (``tls_ca_path``) checks ZooKeeper's certificate, and the client certificate, if
        any, is shown to ZooKeeper too."""
        if not self.zk_tls:
            return None
        return ZkTls(self.tls_ca_path or "", self.tls_cert_path, self.tls_key_path)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> ClientConfig:
        """The ``[client]`` table of a TOML file (as ``conf/client.toml``); an unknown key, a bad
        value or an unreadable file is an IncorrectParameterError naming it."""
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f).get("client", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise IncorrectParameterError(f"cannot read client config {path}: {e}") from e
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise IncorrectParameterError(f"client config {path}: unknown key(s) {', '.join(unknown)}")
        return cls(**{**table, **overrides})
