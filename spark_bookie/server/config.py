"""Bookie configuration: one frozen dataclass, units in the names, validated at load.

Every key is documented in conf/bookie.toml. Values come from (lowest to highest precedence) the
defaults below, a TOML file (`--conf`), and explicit overrides (command-line flags).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadata.tls import ZkTls, ZkTlsError
from spark_bookie.errors import ConfigError

COMPRESSION_CHOICES = ("none", "lz4")
GROUP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")   # as namespace settings name groups (ledger_client.stream.settings)


@dataclass(frozen=True)
class BookieConfig:
    # ---- identity and network
    zk_connect: str = "127.0.0.1:2181"          # host:port[,host:port][/root]; root defaults to /ledgers
    zk_session_timeout_ms: int = 10_000
    zk_connect_timeout_ms: int = 15_000
    host: str = "127.0.0.1"                     # address the gRPC server binds
    port: int = 3181
    add_port: int = 0                           # TCP add listener (spark_bookie.server.tcp_listener); 0 = OS picks
    advertised_host: str = ""                   # host part of the bookie id; empty = `host`
    network_location: str = ""                  # rack/zone for placement, e.g. "/zone-a/rack-1"
    bookie_group: str = ""                      # placement group namespaces may ask for (DESIGN §4.10); "" = none
    journal_dirs: tuple[str, ...] = ()
    ledger_dirs: tuple[str, ...] = ()
    registration_wait_ms_max: int = 60_000      # wait this long for a stale znode of ours to expire
    # ---- journal
    group_commit_wait_ms: float = 0.0           # extra wait for more records (0: what queued during an fsync)
    group_commit_bytes_max: int = 4 * 1024 * 1024
    journal_file_size_bytes_max: int = 256 * 1024 * 1024
    journal_preallocate_bytes: int = 16 * 1024 * 1024
    journal_queue_records_max: int = 100_000    # bounded hand-off to the journal thread
    # ---- isolation (DESIGN §4.10)
    # Serve namespaces in turns: each namespace's adds queue apart and every journal group takes a
    # share of each, so one tenant's flood cannot make another's adds wait behind it. Off: one
    # queue, first come first served (how the bookie worked before; kept for the benchmark).
    fair_share_enabled: bool = True
    namespace_queue_bytes_max: int = 1024 * 1024  # a namespace's adds queued for the journal; beyond, its
    #                                               connections stop reading (back-pressure on it alone)
    # ---- ledger storage
    write_cache_bytes_max: int = 64 * 1024 * 1024
    read_cache_bytes_max: int = 32 * 1024 * 1024
    # Checkpoint at least this often. A flush's entry-log and index writes share the disk with the
    # journal and stall its fdatasyncs while they drain; at 1,000 adds/s a 10 s cycle made ~10 MB
    # bursts and 15-40 ms add latencies (p999 9-29 ms), a 2 s one ~2 MB bursts (p999 6-10 ms).
    # Under load the write cache (flushed at half full) decides; an idle checkpoint writes nothing.
    flush_interval_ms: int = 2_000
    entry_log_size_bytes_max: int = 512 * 1024 * 1024
    entry_log_block_bytes: int = 64 * 1024
    compression: str = "none"                   # "none" or "lz4" for entry-log blocks
    # ---- limits
    entry_size_bytes_max: int = 5 * 1024 * 1024
    grpc_message_bytes_max: int = 64 * 1024 * 1024
    in_flight_adds_per_stream_max: int = 20_000
    in_flight_reads_max: int = 1_000
    read_range_bytes_max: int = 4 * 1024 * 1024
    long_poll_timeout_ms_max: int = 60_000
    # ---- disks
    disk_usage_threshold: float = 0.95          # above this fraction used: read-only
    disk_usage_lwm: float = 0.90                # below this fraction used: writable again
    disk_check_interval_ms: int = 1_000
    # Space a full ledger disk must still have (BookKeeper's minUsableSizeForIndexFileCreation and
    # minUsableSizeForEntryLogCreation): entry logs never write into the index's reserve, so the
    # index can flush, compact and be opened after a crash; adds stop while a flush would leave
    # less than both reserves free (read-only), and resume at twice that and below disk_usage_lwm.
    min_usable_index_bytes: int = 8 * 1024 * 1024
    min_usable_entry_log_bytes: int = 4 * 1024 * 1024
    # ---- garbage collection
    gc_interval_ms: int = 60_000
    gc_compaction_ratio_threshold: float = 0.5  # compact entry logs with less than this live fraction
    # ---- autorecovery (BookKeeper's autoRecoveryDaemonEnabled)
    autorecovery_enabled: bool = False          # run an auditor candidate + replication worker beside the bookie
    autorecovery_conf: str = ""                 # its TOML (conf/autorecovery.toml); empty = defaults
    client_conf: str = ""                       # client TOML (credentials) of that autorecovery; empty = defaults
    # ---- operations
    http_port: int = 0                          # HTTP admin API and /metrics (spark_bookie.http); 0 = off
    metrics_enabled: bool = True                # count adds, reads, journal groups, GC (server/metrics.py)
    # ---- security (docs/security.md; all off by default)
    zk_auth: str = ""                           # "user:password": ZooKeeper digest credentials (secured clusters)
    zk_tls: bool = False                        # ZooKeeper over TLS (its secure client port only)
    zk_tls_ca_path: str = ""                    # PEM CA bundle ZooKeeper's certificate must chain to
    zk_tls_cert_path: str = ""                  # a client certificate for ZooKeeper (optional), with its key:
    zk_tls_key_path: str = ""
    auth_enabled: bool = False                  # every client must present a valid token (server/auth.py)
    auth_token_secret_path: str = ""            # HS256: file holding the shared secret
    auth_token_public_key_path: str = ""        # RS256: PEM public key (the bookie cannot mint tokens then)
    auth_token_leeway_ms: int = 0               # clock skew allowed on a token's expiry
    tenant_checks_enabled: bool = True          # with auth: every add/read/fence checked against namespace grants
    tls_enabled: bool = False                   # TLS on the gRPC, TCP and HTTP ports (server/tls.py)
    tls_certificate_path: str = ""              # PEM certificate chain of this bookie (tlsCertificatePath)
    tls_key_path: str = ""                      # its PEM private key (tlsKeyStore)
    tls_trust_store_path: str = ""              # PEM CA bundle that client certificates must chain to (tlsTrustStore)
    tls_client_authentication: bool = False     # require client certificates, mTLS (tlsClientAuthentication)
    tls_cert_files_refresh_duration_s: int = 300  # re-read changed certificate files this often; 0 = never
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def bookie_id(self) -> str:
        return f"{self.advertised_host or self.host}:{self.port}"

    def zookeeper_tls(self) -> ZkTls | None:
        """The TLS of this bookie's ZooKeeper session (``zk_tls``), or None."""
        return zk_tls_from(vars(self))

    def validate(self) -> BookieConfig:
        problems: list[str] = []
        if not (0 < self.port < 65536):
            problems.append(f"port {self.port} is not in 1..65535")
        if not (0 <= self.add_port < 65536) or self.add_port == self.port:
            problems.append(f"add_port {self.add_port} is not 0 (any) or in 1..65535 apart from port")
        if not self.journal_dirs:
            problems.append("journal_dirs is empty: give --journal-dir")
        if self.namespace_queue_bytes_max < 1:
            problems.append(f"namespace_queue_bytes_max {self.namespace_queue_bytes_max} must be positive")
        if not self.ledger_dirs:
            problems.append("ledger_dirs is empty: give --ledger-dir")
        if self.bookie_group and not (isinstance(self.bookie_group, str) and GROUP_NAME.fullmatch(self.bookie_group)):
            problems.append(f"bookie_group {self.bookie_group!r} is not a group name ([A-Za-z0-9._-], 1-64 characters)")
        if self.compression not in COMPRESSION_CHOICES:
            problems.append(f"compression must be one of {COMPRESSION_CHOICES}, not {self.compression!r}")
        if not (0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1.0):
            problems.append("need 0 < disk_usage_lwm <= disk_usage_threshold <= 1")
        if self.min_usable_index_bytes < 0 or self.min_usable_entry_log_bytes < 0:
            problems.append("min_usable_index_bytes and min_usable_entry_log_bytes must be >= 0")
        if not (0 <= self.http_port < 65536) or (self.http_port and self.http_port in (self.port, self.add_port)):
            problems.append(f"http_port {self.http_port} is not 0 (off) or in 1..65535 apart from port and add_port")
        if self.entry_size_bytes_max + 1024 > self.grpc_message_bytes_max:
            problems.append("grpc_message_bytes_max must exceed entry_size_bytes_max")
        if not (0.0 <= self.gc_compaction_ratio_threshold < 1.0):
            problems.append("gc_compaction_ratio_threshold must be in [0, 1)")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                problems.append(f"{f.name} must not be negative")
        problems += self._security_problems()
        if self.extra:
            problems.append(f"unknown configuration keys: {sorted(self.extra)}")
        if problems:
            raise ConfigError("invalid bookie configuration: " + "; ".join(problems))
        return self

    def _security_problems(self) -> list[str]:
        problems: list[str] = []
        if self.zk_auth and (":" not in self.zk_auth or self.zk_auth.startswith(":") or self.zk_auth.endswith(":")):
            problems.append("zk_auth must be 'user:password' with both parts non-empty")
        if self.auth_enabled and bool(self.auth_token_secret_path) == bool(self.auth_token_public_key_path):
            problems.append("auth_enabled needs exactly one of auth_token_secret_path (HS256) and "
                            "auth_token_public_key_path (RS256)")
        if self.tls_enabled and not (self.tls_certificate_path and self.tls_key_path):
            problems.append("tls_enabled needs tls_certificate_path and tls_key_path")
        if self.tls_enabled and self.tls_client_authentication and not self.tls_trust_store_path:
            problems.append("tls_client_authentication needs tls_trust_store_path (the CA of client certificates)")
        return problems + self._zk_tls_problems()

    def _zk_tls_problems(self) -> list[str]:
        if not isinstance(self.zk_tls, bool):
            return ["zk_tls must be true or false"]
        if self.zk_tls and not self.zk_tls_ca_path:
            return ["zk_tls needs zk_tls_ca_path (the CA ZooKeeper's certificate chains to)"]
        try:   # the files now: kazoo would retry a file it cannot load until the connect timeout
            tls = self.zookeeper_tls()
            if tls is not None:
                tls.check()
        except ZkTlsError as e:
            return [f"zk_tls: {e}"]
        if self.zk_tls and (self.autorecovery_enabled or self.http_port) and not self.client_conf:
            return ["zk_tls with autorecovery_enabled or http_port needs client_conf (a client TOML with "
                    "zk_tls = true): their ledger clients open ZooKeeper sessions of their own"]
        return []


def zk_tls_from(settings: Mapping[str, Any]) -> ZkTls | None:
    """The ZooKeeper TLS that bookie settings (``zk_tls``, ``zk_tls_ca_path``, ``zk_tls_cert_path``,
    ``zk_tls_key_path``) describe, or None when ``zk_tls`` is off; the Spark-hosted cluster's driver
    and slots read their sessions' from the same settings."""
    if not settings.get("zk_tls"):
        return None
    return ZkTls(str(settings.get("zk_tls_ca_path") or ""), settings.get("zk_tls_cert_path") or None,
                 settings.get("zk_tls_key_path") or None)


def _coerce(name: str, value: Any) -> Any:
    if name in ("journal_dirs", "ledger_dirs"):
        if isinstance(value, str):
            return tuple(p for p in value.split(",") if p)
        return tuple(str(v) for v in value)
    return value


def read_toml_table(path: str | Path | None, table: str) -> dict[str, Any]:
    """The ``[table]`` of a TOML file (or its top level when there is no such table); {} for no
    file. ConfigError, naming the file, when it is missing or not TOML."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"configuration file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"configuration file {path} is not valid TOML: {e}") from e
    values = data.get(table, data)
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: [{table}] must be a table")
    return values


def load_config(path: str | Path | None = None, **overrides: Any) -> BookieConfig:
    """Defaults < TOML file < overrides (None values in overrides are ignored)."""
    values: dict[str, Any] = dict(read_toml_table(path, "bookie"))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(BookieConfig)} - {"extra"}
    extra = {k: v for k, v in values.items() if k not in known}
    kwargs = {k: _coerce(k, v) for k, v in values.items() if k in known}
    try:
        cfg = BookieConfig(**kwargs, extra=extra)
    except TypeError as e:
        raise ConfigError(str(e)) from e
    return cfg.validate()
