"""The bookie as an importable object: start(), stop(), nothing process-global.

A Spark task can host one (no signal handlers, no global state, every thread stopped in stop());
`spark-bookie bookie` runs one in the foreground. Start-up order follows BookKeeper's Bookie:
check directories and the port, check cookies, open ledger storage, replay the journal from the
last checkpoint mark, serve, then register in ZooKeeper (so clients only see a bookie that can
answer). Stop is the reverse: unregister first, drain, then close storage.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import grpc

from ledger_client.protocol import bookkeeper_pb2_grpc as pb_grpc
from metadata import MetadataError, MetadataStore
from metadata import connect as connect_metadata
from metadata.ledgers import LedgerPresence
from spark_bookie.errors import ConfigError, StartupError
from spark_bookie.server.access_gate import AccessGate
from spark_bookie.server.admission import Admission
from spark_bookie.server.auth import TokenInterceptor, TokenVerifier
from spark_bookie.server.checkpoint import Checkpointer
from spark_bookie.server.config import BookieConfig
from spark_bookie.server.cookie import Cookie, normalize_dirs, verify_or_create
from spark_bookie.server.disk import DiskMonitor, DiskState, LedgerDiskRoom
from spark_bookie.server.metrics import BookieMetrics, BookieProbes
from spark_bookie.server.namespace_view import NamespaceView
from spark_bookie.server.process_identity import this_process, written_by_dead_process
from spark_bookie.server.processor import RequestProcessor
from spark_bookie.server.service import BookieServicer, grpc_options
from spark_bookie.server.tcp_listener import TcpListener, start_tcp_listener
from spark_bookie.server.tls import server_credentials, socket_context
from spark_bookie.storage.gc import GarbageCollector
from spark_bookie.storage.journal import Journal
from spark_bookie.storage.ledger_storage import LedgerStorage

log = logging.getLogger(__name__)

#: A GC round reads every local ledger's node this often (and after a start or a new session);
#: between, bucket stamps only see nodes created or deleted, so a tombstone whose deletion marker
#: was never written (its role's client died between the two writes) waits at most this long.
GC_FULL_CHECK_INTERVAL_S = 3600.0
REGISTRATION_RETRY_S = 1.0   # a registration move that failed (ZooKeeper slow or away) is tried again after this


def _check_dir(d: str, what: str) -> None:
    p = Path(d)
    if p.exists() and not p.is_dir():
        raise StartupError(f"{what} {d} is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StartupError(f"{what} {d} cannot be created: {e.strerror}") from e
    if not p.is_dir():
        raise StartupError(f"{what} {d} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise StartupError(f"{what} {d} is not writable by this user")


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As gRPC does: connections of a killed predecessor in TIME_WAIT must not block a restart,
        # while a live listener still makes bind fail.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is already in use") from e
            raise StartupError(f"cannot bind {host}:{port}: {e.strerror}") from e


class Bookie:
    """One storage server. `start()` returns once it serves and is registered; raises StartupError."""

    def __init__(self, config: BookieConfig, metadata: MetadataStore | None = None) -> None:
        self.config = config
        self._metadata = metadata
        self._owns_metadata = metadata is None
        self.journal_dirs = normalize_dirs(config.journal_dirs)
        self.ledger_dirs = normalize_dirs(config.ledger_dirs)
        self.bookie_id = config.bookie_id
        self._locks: list[IO[bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._add_server: TcpListener | None = None
        self.token_verifier: TokenVerifier | None = None  # set at start when auth_enabled (the admin API uses it)
        self.add_port = 0  # the TCP add listener's port once started (config.add_port 0 = OS-picked)
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bookie-read")
        self.storage = LedgerStorage(
            self.ledger_dirs[0], write_cache_bytes_max=config.write_cache_bytes_max,
            read_cache_bytes_max=config.read_cache_bytes_max,
            entry_log_size_bytes_max=config.entry_log_size_bytes_max,
            entry_log_block_bytes=config.entry_log_block_bytes, compression=config.compression,
            index_reserve_bytes=config.min_usable_index_bytes)
        reserve = config.min_usable_index_bytes + config.min_usable_entry_log_bytes
        storage = self.storage
        self._disk = DiskMonitor(self.ledger_dirs + self.journal_dirs,
                                 DiskState(config.disk_usage_threshold, config.disk_usage_lwm, reserve),
                                 config.disk_check_interval_ms, self._on_disk_change,
                                 room=LedgerDiskRoom(tuple(self.ledger_dirs), reserve, storage.unflushed_bytes,
                                                     lambda: storage.flushed_bytes_total))
        self.journal = Journal(
            self.journal_dirs[0], group_commit_wait_ms=config.group_commit_wait_ms,
            group_commit_bytes_max=config.group_commit_bytes_max,
            file_size_bytes_max=config.journal_file_size_bytes_max,
            preallocate_bytes=config.journal_preallocate_bytes,
            queue_records_max=config.journal_queue_records_max, fair=config.fair_share_enabled,
            flow_bytes_max=config.namespace_queue_bytes_max)
        self._checkpointer: Checkpointer | None = None
        # Its own registry even with metrics off, so /metrics always has something to serve.
        self.metrics = BookieMetrics() if config.metrics_enabled else None
        self.registry = self.metrics.registry if self.metrics is not None else BookieMetrics.empty_registry()
        if self.metrics is not None:
            self.journal.on_sync = self.metrics.journal_synced
        self._gc: GarbageCollector | None = None
        self._gc_presence = LedgerPresence()  # the GC's memory of the metadata it asked last round
        self._gc_full_check_at = time.monotonic() + GC_FULL_CHECK_INTERVAL_S
        self._gc_stop = threading.Event()
        self._gc_wake = threading.Event()  # a forced GC round (the admin API's PUT /api/v1/bookie/gc)
        self.gc_running = False
        self._gc_thread: threading.Thread | None = None
        self._registered_read_only: bool | None = None
        self._reg_lock = threading.Lock()
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ properties

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    @property
    def read_only(self) -> bool:
        return self._disk.read_only

    @property
    def is_ready(self) -> bool:
        """Serving and registered (BookKeeper's is_ready): what health checks ask."""
        return self._registered_read_only is not None and not self._stopped

    @property
    def stopping(self) -> bool:
        return self._stopped

    @property
    def metadata(self) -> MetadataStore:
        if self._metadata is None:
            raise StartupError("bookie is not started")
        return self._metadata

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info("bookie %s is up (journal %s, ledgers %s)", self.bookie_id, self.journal_dirs,
                 self.ledger_dirs)

    def _start(self) -> None:
        for d in self.journal_dirs:
            _check_dir(d, "journal directory")
        for d in self.ledger_dirs:
            _check_dir(d, "ledger directory")
        self._lock_dirs()
        _check_port_free(self.config.host, self.config.port)
        if self.config.add_port:
            _check_port_free(self.config.host, self.config.add_port)
        if self._metadata is None:
            try:
                self._metadata = connect_metadata(self.config.zk_connect,
                                                  session_timeout_ms=self.config.zk_session_timeout_ms,
                                                  connect_timeout_ms=self.config.zk_connect_timeout_ms,
                                                  zk_auth=self.config.zk_auth or None,
                                                  zk_tls=self.config.zookeeper_tls())
            except MetadataError as e:
                raise StartupError(f"cannot reach ZooKeeper at {self.config.zk_connect}: {e}") from e
        try:
            instance = self.metadata.cluster.instance_id()
        except MetadataError as e:
            raise StartupError(f"cluster not initialised in ZooKeeper at {self.config.zk_connect} "
                               f"(run `spark-bookie init`): {e}") from e
        cookie = Cookie(self.bookie_id, self.journal_dirs, self.ledger_dirs, instance)
        if verify_or_create(self.metadata.cluster, cookie):
            log.info("new bookie %s: cookies written", self.bookie_id)
        self.storage.open()
        self._checkpointer = Checkpointer(self.storage, self.journal, self.ledger_dirs[0],
                                          self.config.flush_interval_ms, self._disk.check_soon)
        replayed = self._checkpointer.replay()
        log.info("replayed %d journal records", replayed)
        self.journal.start()
        self._checkpointer.try_checkpoint()  # a full disk defers it: start read-only, serving reads
        self._checkpointer.start()
        self._disk.start()
        self._bind_metrics()
        self._start_server()
        self._register(self._disk.read_only)
        self.metadata.add_session_listener(self._on_session)
        self._start_gc()

    def _lock_dirs(self) -> None:
        for d in dict.fromkeys(self.journal_dirs + self.ledger_dirs):
            f = open(Path(d) / ".bookie.lock", "ab")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                f.close()
                raise StartupError(f"directory {d} is in use by another bookie process") from e
            self._locks.append(f)

    def _start_server(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        verifier = self.token_verifier = self._token_verifier()
        interceptors = [TokenInterceptor(verifier)] if verifier is not None else []
        tls = server_credentials(self.config)[0] if self.config.tls_enabled else None
        tcp_tls = socket_context(self.config)

        async def serve() -> None:
            try:
                server = grpc.aio.server(options=grpc_options(self.config.grpc_message_bytes_max),
                                         interceptors=interceptors)
                view = NamespaceView(self.metadata, self._executor)
                gate = AccessGate(self.metadata, view) \
                    if verifier is not None and self.config.tenant_checks_enabled else None
                admission = Admission(view, on_hold=self.metrics.write_held if self.metrics is not None else None)
                processor = RequestProcessor(self.config, self.storage, self.journal, loop,
                                             self._executor, lambda: self._disk.read_only,
                                             self._disk.has_room, self.metrics, gate, admission)
                pb_grpc.add_BookieServicer_to_server(BookieServicer(
                    processor, self.bookie_id, list(self.ledger_dirs),
                    self.config.in_flight_adds_per_stream_max, lambda: self._disk.read_only,
                    lambda: self.add_port, verifier), server)
                try:
                    if tls is not None:
                        server.add_secure_port(self.address, tls)
                    else:
                        server.add_insecure_port(self.address)
                except RuntimeError as e:
                    raise StartupError(f"cannot listen on {self.address}: {e}") from e
                try:
                    self._add_server = await start_tcp_listener(
                        processor, self.bookie_id, self.config.host, self.config.add_port,
                        self.config.in_flight_adds_per_stream_max, self.config.grpc_message_bytes_max, verifier,
                        tcp_tls)
                except OSError as e:
                    raise StartupError(f"cannot listen for adds on {self.config.host}:{self.config.add_port}: "
                                       f"{e.strerror or e}") from e
                self.add_port = self._add_server.port
                await server.start()
                self._server = server
            except BaseException as e:
                failure.append(e)
                if self._add_server is not None:
                    self._add_server.close()
            finally:
                ready.set()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(serve())
            if not failure:
                loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop_thread = threading.Thread(target=run, name=f"bookie-{self.bookie_id}", daemon=True)
        self._loop_thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def _token_verifier(self) -> TokenVerifier | None:
        """The verifier of clients' tokens when auth_enabled (StartupError for an unreadable key)."""
        cfg = self.config
        if not cfg.auth_enabled:
            return None
        try:
            return TokenVerifier.from_files(cfg.auth_token_secret_path, cfg.auth_token_public_key_path,
                                            cfg.auth_token_leeway_ms / 1000.0)
        except ConfigError as e:
            raise StartupError(str(e)) from e

    # ------------------------------------------------------------------ registration

    def _registration_data(self) -> bytes:
        # "auth": clients learn that this cluster checks tokens even when they cannot reach the
        # bookie (LedgerClient.confirm_admin must then not take silence for an open cluster).
        return json.dumps({"id": self.bookie_id, "address": self.address, "add_port": self.add_port,
                           "network_location": self.config.network_location, "bookie_group": self.config.bookie_group,
                           "auth": "token" if self.config.auth_enabled else "none", **this_process()}).encode()

    def _register(self, read_only: bool) -> None:
        with self._reg_lock:
            prev = self._registered_read_only
            if prev == read_only:
                return
            # The new node first, then the old one goes (BookKeeper's doRegisterReadOnlyBookie):
            # at no moment is the bookie in neither list, so an auditor never sees it lost.
            self.metadata.cluster.register_bookie(self.bookie_id, readonly=read_only,
                                                  data=self._registration_data(),
                                                  wait_ms_max=self.config.registration_wait_ms_max,
                                                  left_by_dead=written_by_dead_process)
            if prev is not None:
                self.metadata.cluster.unregister_bookie(self.bookie_id, readonly=prev)
            self._registered_read_only = read_only

    def _on_disk_change(self, read_only: bool) -> None:
        if read_only and not self._stopped:
            # BookKeeper's forced GC when the disks fill: an entry log orphaned by a crash in the
            # middle of a flush (the journal replays its entries into a new one) is dead space that
            # would otherwise keep a nearly full bookie read-only until the next GC interval.
            self.trigger_gc()
        self._on_read_only_change(read_only)

    def _on_read_only_change(self, read_only: bool) -> None:
        if self._registered_read_only is None or self._stopped:
            return  # not registered yet: start() registers in the right place
        try:
            self._register(read_only)
        except MetadataError:
            # The disk's state has moved and will not move again by itself: without another try the
            # registration would stay where it was (a bookie with room left listed read-only).
            log.exception("could not move registration (read_only=%s): trying again in %.0f s", read_only,
                          REGISTRATION_RETRY_S)
            retry = threading.Timer(REGISTRATION_RETRY_S, lambda: self._on_read_only_change(self.read_only))
            retry.daemon = True
            retry.start()

    def _on_session(self, state: str) -> None:
        log.info("ZooKeeper session %s", state)

    # ------------------------------------------------------------------ GC

    def _missing_ledgers(self, local: set[int]) -> set[int] | None:
        """Which local ledgers the metadata store says are gone: asked about these only, with the
        last round's bucket stamps, so a round costs what changed (metadata.ledgers.missing_ledgers),
        not a listing of every ledger in the cluster. Reaping first turns the tombstones roles left
        into deleted nodes, which the buckets' stamps show."""
        try:
            reaped = self.metadata.ledgers.reap_deleted()   # ledgers roles deleted (tenants' tombstones)
            if reaped:
                log.info("removed the metadata of %d ledgers deleted by their roles", reaped)
            if time.monotonic() >= self._gc_full_check_at:   # forget the stamps: read every local ledger
                self._gc_presence = LedgerPresence()
                self._gc_full_check_at = time.monotonic() + GC_FULL_CHECK_INTERVAL_S
            return self.metadata.ledgers.missing_ledgers(local, since=self._gc_presence)
        except MetadataError as e:
            log.warning("GC skipped: ledger metadata unavailable (%s)", e)
            return None

    def _start_gc(self) -> None:
        self._gc = GarbageCollector(self.storage, missing_ledgers=self._missing_ledgers,
                                    compaction_ratio_threshold=self.config.gc_compaction_ratio_threshold)

        def run() -> None:
            while True:
                self._gc_wake.wait(self.config.gc_interval_ms / 1000.0)
                self._gc_wake.clear()
                if self._gc_stop.is_set():
                    return
                self._gc_round()

        self._gc_thread = threading.Thread(target=run, name="bookie-gc", daemon=True)
        self._gc_thread.start()

    def _gc_round(self) -> None:
        if self._gc is None:
            return
        self.gc_running = True
        started = time.perf_counter()
        try:
            stats = self._gc.run_once()
            if stats.ledgers_deleted or stats.logs_deleted or stats.logs_compacted:
                log.info("GC: %s", stats)
            presence = self._gc_presence
            log.debug("GC asked the metadata %d requests, %d nodes (full check: %s)", presence.requests,
                      presence.nodes_read, presence.full)
            if self.metrics is not None:
                self.metrics.gc_round(time.perf_counter() - started, stats.ledgers_deleted,
                                      stats.bytes_reclaimed, stats.logs_compacted,
                                      metadata_requests=presence.requests, metadata_nodes=presence.nodes_read)
        except Exception:
            log.exception("GC round failed")
        finally:
            self.gc_running = False

    def trigger_gc(self) -> None:
        """Run a GC round now rather than at the next interval (BookKeeper's forceGC)."""
        self._gc_wake.set()

    def last_log_mark(self) -> tuple[int, int]:
        """(journal file id, offset) of the last journal record handed to the OS."""
        pos = self.journal.last_written_position()
        return pos.file_id, pos.offset

    # ------------------------------------------------------------------ metrics

    def _bind_metrics(self) -> None:
        if self.metrics is None:
            return
        storage, journal, checkpointer = self.storage, self.journal, self._checkpointer
        rc = storage.cache_stats
        self.metrics.bind(BookieProbes(
            journal_queue_records=lambda: journal.queued_records,
            write_cache_bytes=storage.unflushed_bytes,
            read_cache_bytes=lambda: rc()["read_cache_bytes"],
            read_cache_hits=lambda: rc()["read_cache_hits"],
            read_cache_misses=lambda: rc()["read_cache_misses"],
            flushed_bytes_total=lambda: storage.flushed_bytes_total,
            flushes_total=lambda: storage.flushes_total,
            checkpoint_lag_bytes=checkpointer.lag_bytes if checkpointer is not None else (lambda: 0),
            read_only=lambda: self._disk.read_only,
            ledger_dirs=tuple(self.ledger_dirs), journal_dirs=tuple(self.journal_dirs)))

    # ------------------------------------------------------------------ stop

    def stop(self, grace_s: float = 2.0) -> None:
        """Unregister, stop serving, drain the journal, checkpoint, close. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._registered_read_only is not None and self._metadata is not None:
            try:
                self._metadata.cluster.unregister_bookie(self.bookie_id, readonly=self._registered_read_only)
            except MetadataError:
                pass
        self._gc_stop.set()
        self._gc_wake.set()
        self._disk.stop()
        self._stop_server(grace_s)
        if self._gc_thread is not None:
            self._gc_thread.join(timeout=30)
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.journal.stop()
        if self._checkpointer is not None:
            self._checkpointer.checkpoint()
        self.storage.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_metadata and self._metadata is not None:
            self._metadata.close()
        for f in self._locks:
            f.close()
        self._locks.clear()

    def _stop_server(self, grace_s: float) -> None:
        loop, server = self._loop, self._server
        if loop is None or loop.is_closed():
            return
        add_server = self._add_server
        if add_server is not None:  # no new add connections; open ones close after the grace
            add_server.stop_accepting()
        if server is not None:
            fut = asyncio.run_coroutine_threadsafe(server.stop(grace_s), loop)
            try:
                fut.result(timeout=grace_s + 5)
            except Exception:
                log.exception("server stop failed")
        if add_server is not None:  # before the loop stops: it serves the read connections
            add_server.close()
        loop.call_soon_threadsafe(loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=10)

    def __enter__(self) -> Bookie:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
