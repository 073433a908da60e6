"""AutoRecovery: the auditor candidate and the replication worker of one process, behind one facade
(BookKeeper's AutoRecoveryMain). Used beside a bookie (``autorecovery_enabled``), by
``spark-bookie autorecovery``, and by the Spark hosting job::

    ar = AutoRecovery("zk:2181", config, candidate_id="host:3181")
    ar.start()        # returns at once; connects, stands for auditor and works in the background
    ar.is_auditor     # True while this process is the elected auditor
    ar.stop()         # idempotent: withdraws, releases locks, closes the session

Everything runs on one ZooKeeper session: the auditor vote and the workers' ledger locks are its
ephemerals, so a process that dies (or loses its session) gives up both at once and the others
take over. Start-up retries the connection until it works or ``stop()`` is called, so a process
started before ZooKeeper is reachable still joins in once it is.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from ledger_client import ClientConfig, LedgerClient
from metadata import MetadataError, MetadataStore, parse_connect_string
from metadata import connect as connect_metadata

from .auditor import Auditor, AuditorStats
from .config import AutoRecoveryConfig
from .stream_maintenance import StreamMaintenance, TierStep
from .subscription_backlog import SubscriptionBacklog
from .worker import ReplicationWorker

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 2.0


class AutoRecovery:
    def __init__(self, zk_connect: str, config: AutoRecoveryConfig | None = None, *, candidate_id: str,
                 run_auditor: bool = True, run_worker: bool = True, tier_step: TierStep | None = None,
                 client_config: ClientConfig | None = None) -> None:
        """``tier_step``: how old sealed segments of namespaces with ``tier_after_ms`` are tiered
        into Delta by the auditor's stream maintenance (the Spark jobs provide one).
        ``client_config``: the credentials (zk_auth, auth token, TLS) the worker's client and the
        metadata session present on a secured cluster, as every other client's (docs/security.md);
        its timeouts are replaced by this config's."""
        if not candidate_id:
            raise ValueError("candidate_id must be a non-empty string (e.g. the bookie id)")
        if not zk_connect.startswith("memory://"):
            parse_connect_string(zk_connect)   # a malformed string fails here, not in a thread
        self.zk_connect = zk_connect
        self.config = config or AutoRecoveryConfig()
        self.client_config = client_config or ClientConfig()
        self.candidate_id = candidate_id
        self.run_auditor = run_auditor
        self.run_worker = run_worker
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._started = False
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.store: MetadataStore | None = None
        self.client: LedgerClient | None = None
        self.worker: ReplicationWorker | None = None
        self._auditor: Auditor | None = None
        self._withdraw: Any = None
        self._is_auditor = False
        self.elections_won = 0  # times this candidate became the auditor (recovery/metrics.py)
        self._maintenance: StreamMaintenance | None = None
        self._backlog: SubscriptionBacklog | None = None
        self._tier_step: TierStep | None = tier_step

    # ------------------------------------------------------------------ public surface

    def start(self) -> None:
        """Non-blocking: connect, start the worker and stand for auditor on a background thread."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self._thread = threading.Thread(target=self._bring_up, name=f"autorecovery-{self.candidate_id}",
                                        daemon=True)
        self._thread.start()

    @property
    def is_auditor(self) -> bool:
        with self._lock:
            return self._is_auditor

    @property
    def auditor_stats(self) -> AuditorStats | None:
        with self._lock:
            return self._auditor.stats if self._auditor is not None else None

    @property
    def subscription_backlogs(self) -> dict[tuple[str, str], tuple[int, int]]:
        """("ns/stream", subscription) -> (backlog records, bytes) as the auditor last read them
        (recovery/subscription_backlog.py); empty on a process that is not the auditor."""
        with self._lock:
            backlog = self._backlog
        return backlog.snapshot() if backlog is not None else {}

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until connected and running (tests, the CLI's first message)."""
        return self._ready.wait(timeout_s)

    def stop(self) -> None:
        """Withdraw from the election, stop auditing and working (releasing locks), close the
        session. Idempotent; safe before start() and from any thread but the store's."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.config.zk_connect_timeout_ms / 1000 + 5)
        with self._lock:
            withdraw, self._withdraw = self._withdraw, None
            auditor, self._auditor = self._auditor, None
            maintenance, self._maintenance = self._maintenance, None
            backlog, self._backlog = self._backlog, None
            worker, self.worker = self.worker, None
            client, self.client = self.client, None
            store, self.store = self.store, None
            self._is_auditor = False
        if withdraw is not None:
            try:
                withdraw()
            except MetadataError as e:
                log.info("autorecovery: withdrawing from the election: %s", e)
        if auditor is not None:
            auditor.stop()
        if maintenance is not None:
            maintenance.stop()
        if backlog is not None:
            backlog.stop()
        if worker is not None:
            worker.stop()
        if client is not None:
            client.close()
        if store is not None:
            store.close()

    # ------------------------------------------------------------------ background start

    def _bring_up(self) -> None:
        cfg = self.config
        while not self._stopped.is_set():
            try:
                store = connect_metadata(self.zk_connect, session_timeout_ms=cfg.zk_session_timeout_ms,
                                         connect_timeout_ms=cfg.zk_connect_timeout_ms,
                                         zk_auth=self.client_config.zk_auth,
                                         zk_tls=self.client_config.zookeeper_tls())
            except MetadataError as e:
                log.warning("autorecovery: cannot reach ZooKeeper at %s yet: %s", self.zk_connect, e)
                self._stopped.wait(CONNECT_RETRY_S)
                continue
            try:
                self._run_on(store)
            except MetadataError as e:
                log.warning("autorecovery: start-up failed: %s; retrying", e)
                self._teardown_partial(store)
                self._stopped.wait(CONNECT_RETRY_S)
                continue
            self._ready.set()
            return

    def _run_on(self, store: MetadataStore) -> None:
        cfg = self.config
        client_cfg = dataclasses.replace(self.client_config, zk_session_timeout_ms=cfg.zk_session_timeout_ms,
                                         zk_connect_timeout_ms=cfg.zk_connect_timeout_ms,
                                         read_timeout_ms=cfg.bookie_timeout_ms, add_timeout_ms=cfg.bookie_timeout_ms,
                                         operation_timeout_ms=cfg.recovery_operation_timeout_ms)
        client = LedgerClient(self.zk_connect, config=client_cfg, metadata_store=store)
        with self._lock:
            self.store, self.client = store, client
            if self._stopped.is_set():
                return
        if self.run_worker:
            worker = ReplicationWorker(store, client, cfg, name=f"replication-worker[{self.candidate_id}]")
            with self._lock:
                self.worker = worker
            worker.start()
        if self.run_auditor:
            withdraw = store.underreplication.elect_auditor(self.candidate_id, self._on_election)
            with self._lock:
                self._withdraw = withdraw
        log.info("autorecovery %s: running (auditor candidate: %s, worker: %s)", self.candidate_id,
                 self.run_auditor, self.run_worker)

    def _teardown_partial(self, store: MetadataStore) -> None:
        with self._lock:
            worker, self.worker = self.worker, None
            client, self.client = self.client, None
            self.store = None
        if worker is not None:
            worker.stop()
        if client is not None:
            client.close()
        store.close()

    def _on_election(self, elected: bool) -> None:
        """On the store's election thread: start or stop auditing (never waits for the auditor)."""
        with self._lock:
            store, client = self.store, self.client
            if self._stopped.is_set() or store is None or client is None:
                elected = False
            self._is_auditor = elected
            old, self._auditor = self._auditor, None
            old_maintenance, self._maintenance = self._maintenance, None
            old_backlog, self._backlog = self._backlog, None
            if elected and store is not None and client is not None:
                self.elections_won += 1
                self._auditor = Auditor(store, self.config, client.pool)
                self._auditor.start()
                self._maintenance = StreamMaintenance(client, self.config.stream_maintenance_interval_ms,
                                                      self._tier_step)
                self._maintenance.start()
                self._backlog = SubscriptionBacklog(client, self.config.stream_maintenance_interval_ms)
                self._backlog.start()
        if old is not None:
            old.stop(timeout_s=None)
        if old_maintenance is not None:
            old_maintenance.stop()
        if old_backlog is not None:
            old_backlog.stop()
        log.info("autorecovery %s: %s the auditor", self.candidate_id, "now" if elected else "no longer")
