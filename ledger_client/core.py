"""LedgerCore: create, open (with or without recovery), delete and list ledgers (DESIGN §4.1).

The ledger half of the public client, and all that ledger code (the handles, recovery) holds:
it knows nothing of streams. ``LedgerClient`` (client.py) is this plus namespaces and streams;
streams sit on top of ledgers, never the other way round.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Self

from metadata import LedgerMetadata, LedgerState, MetadataError, MetadataStore, update_ledger
from metadata import connect as connect_metadata
from metadata.tenancy import CONSUME, PRODUCE, Caller, authorize, namespace_refusal

from . import errors
from .bookies import BookiePool, BookieRegistry
from .config import ClientConfig
from .metadata_errors import metadata_errors
from .placement import EnsemblePlacement, PlacementGroups
from .protocol.framing import Digester, DigestType, master_key
from .read_handle import ReadHandle
from .recovery import LedgerRecovery
from .transport import StreamLimits
from .transport.credentials import credentials_of
from .write_handle import WriteHandle

if TYPE_CHECKING:
    from .metrics import ClientMetrics

log = logging.getLogger(__name__)


def _check_create_args(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                       digest_type: DigestType, password: bytes,
                       custom_metadata: Mapping[str, bytes] | None) -> None:
    sizes = (ensemble_size, write_quorum_size, ack_quorum_size)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in sizes):
        raise errors.IncorrectParameterError(f"ensemble and quorum sizes must be integers, got {sizes}")
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise errors.IncorrectParameterError(
            f"need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1, got {sizes}")
    if not isinstance(digest_type, DigestType):
        raise errors.IncorrectParameterError(f"digest_type must be a DigestType, not {digest_type!r}")
    if not isinstance(password, (bytes, bytearray)):
        raise errors.IncorrectParameterError("password must be bytes")
    for k, v in (custom_metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, (bytes, bytearray)):
            raise errors.IncorrectParameterError("custom_metadata must map str to bytes")


class LedgerCore:
    """The synchronous, thread-safe ledger client. `zk` is "host:port[,host:port][/root]" or "zk://...".

    `metadata_store` lets tests and the simulator pass an in-memory twin instead of ZooKeeper.
    """

    def __init__(self, zk: str = "127.0.0.1:2181", *, config: ClientConfig | None = None,
                 metadata_store: MetadataStore | None = None, metrics: ClientMetrics | None = None) -> None:
        """``metrics``: ledger_client.metrics.ClientMetrics to count into (None: not counted)."""
        self.config = config or ClientConfig()
        self.metrics = metrics
        self._owns_store = metadata_store is None
        if metadata_store is None:
            with metadata_errors(f"connect to {zk}"):
                metadata_store = connect_metadata(zk, session_timeout_ms=self.config.zk_session_timeout_ms,
                                                  connect_timeout_ms=self.config.zk_connect_timeout_ms,
                                                  zk_auth=self.config.zk_auth, zk_tls=self.config.zookeeper_tls(),
                                                  zk_member_auth=self.config.zk_member_auth)
        self.store: MetadataStore = metadata_store
        with metadata_errors("watch bookies"):
            self.registry = BookieRegistry(self.store)
        cfg = self.config
        self.credentials = credentials_of(cfg)
        self.pool = BookiePool(cfg.read_timeout_ms, StreamLimits(
            batch_entries_max=cfg.bookie_batch_entries_max, in_flight_adds_max=cfg.bookie_in_flight_adds_max,
            backlog_adds_max=cfg.bookie_backlog_adds_max, messages_in_flight_max=cfg.bookie_messages_in_flight_max,
            window_bypass_adds=cfg.bookie_window_bypass_adds, add_transport=cfg.bookie_add_transport),
            read_transport=cfg.bookie_read_transport, credentials=self.credentials)
        self.placement = EnsemblePlacement(random.Random(self.config.placement_seed))
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ledger-client")
        self._writers: weakref.WeakSet[WriteHandle] = weakref.WeakSet()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="ledger-client-ticker", daemon=True)
        self._ticker.start()
        self._closed = False

    # ------------------------------------------------------------------ plumbing for handles

    def run_soon(self, fn: Callable[[], None]) -> None:
        if not self._closed:
            self._executor.submit(fn)

    def update_metadata(self, ledger_id: int, fn: Callable[[LedgerMetadata], LedgerMetadata]) -> LedgerMetadata:
        """Every metadata change goes through the one CAS loop (metadata.update_ledger)."""
        return self.update_metadata_versioned(ledger_id, fn)[0]

    def update_metadata_versioned(self, ledger_id: int, fn: Callable[[LedgerMetadata], LedgerMetadata],
                                  known: tuple[LedgerMetadata, int] | None = None) -> tuple[LedgerMetadata, int]:
        """``known``: the caller's last ``(metadata, version)``, tried before a read (update_ledger)."""
        with metadata_errors(f"update ledger {ledger_id}", missing_ledger=True):
            return update_ledger(self.store.ledgers, ledger_id, fn, retries_max=self.config.metadata_retries_max,
                                 known=known)

    def replace_metadata(self, md: LedgerMetadata, version: int) -> int:
        """One CAS at exactly `version`, no retry: for changes only valid on that version (a
        recovery's close). BadVersionError surfaces as MetadataVersionError."""
        with metadata_errors(f"write ledger {md.ledger_id}", missing_ledger=True):
            return self.store.ledgers.write_ledger_metadata(md, version)

    def watch_writer(self, w: WriteHandle) -> None:
        self._writers.add(w)

    def forget_writer(self, w: WriteHandle) -> None:
        self._writers.discard(w)

    def _tick(self) -> None:
        last_lac = time.monotonic()
        while not self._stop.wait(0.1):
            now = time.monotonic()
            lac_due = (self.config.explicit_lac_interval_ms > 0
                       and now - last_lac >= self.config.explicit_lac_interval_ms / 1000)
            for w in list(self._writers):
                try:
                    w.check_timeouts(now)
                    if lac_due:
                        w.send_explicit_lac()
                except Exception:
                    log.exception("ledger %d: periodic check failed", w.ledger_id)
            if lac_due:
                last_lac = now

    # ------------------------------------------------------------------ ledgers

    @property
    def caller(self) -> Caller | None:
        """Who this client's token names (None: it has none; nothing is checked then)."""
        return self.credentials.caller()

    def check_ledger_access(self, md: LedgerMetadata, action: str) -> None:
        """UnauthorizedAccessError naming the role, the namespace and the action when this client's
        role may not ``action`` the ledger: the bookies would refuse it too (DESIGN §4.9), but only
        with their own words, and after a metadata change such as a recovery's was begun."""
        caller = self.caller
        if caller is None or caller.privileged:
            return
        got = None
        if md.namespace:
            with metadata_errors(f"read the grants of namespace {md.namespace}"):
                got = self.store.tenants.read_grants(md.namespace)
        access, admins = got if got is not None else (None, frozenset[str]())
        why = authorize(caller, action, ledger_id=md.ledger_id, namespace=md.namespace, owner_role=md.owner_role,
                        access=access, tenant_admins=admins)
        if why is not None:
            raise errors.UnauthorizedAccessError(why)

    def _check_namespace_action(self, caller: Caller, namespace: str, action: str) -> None:
        """UnauthorizedAccessError unless ``caller`` may ``action`` in ``namespace`` (a ledger made
        there that its bookies refuse would be an orphan its maker cannot delete)."""
        denied = f"role {caller.subject!r} has no permission on namespace {namespace!r}"
        with metadata_errors(f"read the grants of namespace {namespace}", denied=denied):
            got = self.store.tenants.read_grants(namespace)
        if got is None:
            raise errors.NoSuchNamespaceError(f"namespace {namespace!r} does not exist")
        why = namespace_refusal(caller, action, namespace, *got)
        if why is not None:
            raise errors.UnauthorizedAccessError(why)

    def create_ledger(self, ensemble_size: int = 3, write_quorum_size: int = 3, ack_quorum_size: int = 2,
                      digest_type: DigestType = DigestType.CRC32C, password: bytes = b"",
                      custom_metadata: Mapping[str, bytes] | None = None, *, namespace: str = "",
                      bookie_groups: Iterable[str] | None = None,
                      bookie_groups_secondary: Iterable[str] | None = None) -> WriteHandle:
        """``namespace``: the namespace whose grants decide who may touch the ledger (streams pass
        their own; "" = this client's role alone), recorded in its metadata for good.
        ``bookie_groups``: its copies only on bookies of these placement groups, of
        ``bookie_groups_secondary`` where those lack bookies (DESIGN §4.10); recorded in the
        metadata, so its ensemble changes and re-replication keep to them."""
        self._check_open()
        caller = self.caller
        if namespace and caller is not None and not caller.privileged:
            self._check_namespace_action(caller, namespace, PRODUCE)
        _check_create_args(ensemble_size, write_quorum_size, ack_quorum_size, digest_type, password,
                           custom_metadata)
        groups = _groups_arg(bookie_groups, bookie_groups_secondary)
        ensemble = self.placement.new_ensemble(ensemble_size, self.registry.writable(), groups=groups)
        key = master_key(bytes(password))
        with metadata_errors("create ledger"):
            lid = self.store.ledgers.generate_ledger_id()
            md = LedgerMetadata(
                ledger_id=lid, state=LedgerState.OPEN, ensemble_size=ensemble_size,
                write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size, last_entry_id=-1,
                length=0, ensembles={0: ensemble}, digest_type=digest_type, password_hash=key,
                ctime=int(time.time() * 1000),
                custom_metadata={k: bytes(v) for k, v in (custom_metadata or {}).items()},
                namespace=namespace, owner_role=caller.subject if caller is not None else "",
                bookie_groups=groups.primary, bookie_groups_secondary=groups.secondary)
            self.store.ledgers.create_ledger_metadata(md)
        w = WriteHandle(self, md, Digester(digest_type, bytes(password)), key, version=0)
        self._writers.add(w)
        if self.metrics is not None:
            self.metrics.creates.inc()
        return w

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """Open for reading; with recovery=True the ledger is fenced, recovered and closed first."""
        self._check_open()
        md = self.ledger_metadata(ledger_id)
        key = master_key(bytes(password))
        if key != md.password_hash:
            raise errors.UnauthorizedAccessError(f"wrong password for ledger {ledger_id}")
        self.check_ledger_access(md, PRODUCE if recovery and md.state is not LedgerState.CLOSED else CONSUME)
        digester = Digester(md.digest_type, bytes(password))
        if self.metrics is not None:
            (self.metrics.recovery_opens if recovery else self.metrics.opens).inc()
        if recovery and md.state is not LedgerState.CLOSED:
            md = LedgerRecovery(self, md, digester, key).run()
        return self._reader(md, digester)

    def open_ledger_admin(self, ledger_id: int) -> ReadHandle:
        """BookKeeper's administrative open (BookKeeperAdmin's openLedgerNoRecovery): no password,
        no fencing, for tools that checked their caller's admin role themselves (the HTTP admin
        API's ledger/read). The metadata keeps the password's hash, never the password, and the
        bookies serve reads without either, so the digests that take no password (CRC32, CRC32C,
        DUMMY) are checked as on any read. An HMAC digest is keyed by the password:
        UnauthorizedAccessError saying so (open_ledger with the password reads it)."""
        self._check_open()
        md = self.ledger_metadata(ledger_id)
        if md.digest_type is DigestType.HMAC:
            raise errors.UnauthorizedAccessError(
                f"ledger {ledger_id} has an HMAC digest, keyed by its password, which the metadata does "
                "not keep: open it with its password")
        if self.metrics is not None:
            self.metrics.opens.inc()
        return self._reader(md, Digester(md.digest_type, b""))

    def _reader(self, md: LedgerMetadata, digester: Digester) -> ReadHandle:
        handle = ReadHandle(self, md, digester)
        if md.state is not LedgerState.CLOSED:
            try:
                handle.read_last_add_confirmed()
            except errors.LedgerError as e:
                log.info("ledger %d opened without a LAC (%s)", md.ledger_id, e)
        return handle

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata (bookies reclaim its space by GC). Idempotent."""
        self._check_open()
        caller = self.caller
        try:
            if caller is not None and not caller.privileged:
                self.check_ledger_access(self.ledger_metadata(ledger_id), PRODUCE)
            with metadata_errors(f"delete ledger {ledger_id}", missing_ledger=True):
                self.store.ledgers.delete_ledger_metadata(ledger_id)
        except errors.NoSuchLedgerError:
            return
        if self.metrics is not None:
            self.metrics.deletes.inc()

    def confirm_admin(self) -> None:
        """Have a bookie confirm that this client's token carries the `admin` role, before an
        operation only admins may run (the shell's deleteledger, recover, decommission, ...).
        UnauthorizedAccessError when it does not (or the token is missing or invalid);
        BookieUnavailableError when no bookie answered. An open cluster has no roles: bookies
        without token checks confirm anyone, and when none answers, a client holding no token
        goes ahead unless a registered bookie says it checks tokens."""
        self._check_open()
        bookies = self.registry.writable_ids() + self.registry.readonly_ids()
        failures: list[str] = []
        for b in bookies:
            try:
                self.pool.get(b).confirm_role("admin")
                return
            except errors.UnauthorizedAccessError:
                raise
            except errors.LedgerError as e:
                failures.append(str(e))
        cfg = self.config
        if not (cfg.auth_token or cfg.auth_token_file) and not any(self._checks_tokens(b) for b in bookies):
            return
        why = "; ".join(failures[:3]) if failures else "no bookie is registered"
        raise errors.BookieUnavailableError(f"cannot confirm the admin role: no bookie answered ({why})")

    def _checks_tokens(self, bookie_id: str) -> bool:
        try:
            return self.store.cluster.bookie_info(bookie_id).get("auth") == "token"
        except MetadataError:
            return True   # cannot tell: assume it does

    def list_ledgers(self) -> Iterator[int]:
        with metadata_errors("list ledgers"):
            ids = self.store.ledgers.list_ledgers()
        return iter(ids)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self.ledger_metadata_versioned(ledger_id)[0]

    def ledger_metadata_versioned(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The ledger's metadata and its znode version (for a CAS that must start from it)."""
        if not isinstance(ledger_id, int) or ledger_id < 0:
            raise errors.IncorrectParameterError(f"ledger id must be a non-negative int, not {ledger_id!r}")
        caller = self.caller
        who = f"role {caller.subject!r}" if caller is not None else "this client (no token)"
        denied = (f"{who} may not read ledger {ledger_id}: it is neither the ledger's creator nor granted "
                  "'consume' or 'produce' on its namespace")
        with metadata_errors(f"read ledger {ledger_id}", missing_ledger=True, denied=denied):
            return self.store.ledgers.read_ledger_metadata(ledger_id)

    # ------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise errors.LedgerError("client is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._ticker.join(timeout=5)
        self._executor.shutdown(wait=True, cancel_futures=False)
        self.pool.close()
        self.registry.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _groups_arg(primary: Iterable[str] | None, secondary: Iterable[str] | None) -> PlacementGroups:
    """IncorrectParameterError for group lists that could never place a copy (namespace settings
    validate theirs the same way before they get here)."""
    if isinstance(primary, str | bytes) or isinstance(secondary, str | bytes):
        raise errors.IncorrectParameterError("bookie_groups and bookie_groups_secondary are lists of group names, "
                                             f"not a string: {primary!r}, {secondary!r}")
    groups = PlacementGroups(tuple(primary or ()), tuple(secondary or ()))
    names = groups.primary + groups.secondary
    if any(not isinstance(g, str) or not g for g in names) or len(set(names)) != len(names):
        raise errors.IncorrectParameterError(f"bad placement groups {groups}: distinct non-empty names")
    if groups.secondary and not groups.primary:
        raise errors.IncorrectParameterError("bookie_groups_secondary is a fallback for bookie_groups, which is empty")
    return groups
