"""How every job reaches the cluster: one client TOML for a secured one (DESIGN §4.8).

The ``ledger`` source and sink (option ``client_conf``), compaction and tiering
(``jobs/compact_to_delta.py --client-conf``) all take the path of a ``[client]`` TOML (``zk_auth``,
``auth_token`` / ``auth_token_file``, ``tls_*``; docs/security.md), defaulting to
``$SPARK_BOOKIE_CLIENT_CONF``; without either, the cluster is an open one. The path, not the
settings, travels with the work to the executors (in options and settings objects), so it must be
readable on every executor: it is made absolute where it is given.

No pyspark here: compaction and tiering import this without Spark.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger_client import ClientConfig, LedgerClient

CLIENT_CONF_ENV = "SPARK_BOOKIE_CLIENT_CONF"  # the client TOML of a secured cluster (docs/security.md)
TASK_TIMEOUTS: dict[str, Any] = {"zk_session_timeout_ms": 10_000, "operation_timeout_ms": 60_000}
"""The Spark source's and sink's clients: these timeouts, whatever the client TOML says."""
SHARED_CLIENTS_MAX = 4      # clusters a Python worker keeps a client of between tasks
SHARED_IDLE_S = 120.0       # ... closed when no task used them for this long
_shared: OrderedDict[tuple[str, str | None], tuple[LedgerClient, float]] = OrderedDict()
_shared_lock = threading.Lock()


def client_conf_path(given: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The client TOML of a job: ``given`` (an option or ``--client-conf``) if not blank, else
    $SPARK_BOOKIE_CLIENT_CONF, else None (an open cluster); absolute, for the executors."""
    env = os.environ if env is None else env
    path = (given or "").strip() or (env.get(CLIENT_CONF_ENV) or "").strip()
    return os.path.abspath(path) if path else None


def client_config(path: str | None, **overrides: Any) -> ClientConfig:
    """The ``[client]`` table of ``path`` with ``overrides`` (defaults alone without a path);
    IncorrectParameterError (a LedgerError) naming the file when it is unreadable or bad."""
    from ledger_client import ClientConfig

    return ClientConfig.from_toml(path, **overrides) if path else ClientConfig(**overrides)


def connect(zk: str, client_conf: str | None, **overrides: Any) -> LedgerClient:
    """A client of the cluster at ``zk`` with the credentials of ``client_conf`` (None: none).
    Against a secured cluster without them: UnauthorizedAccessError (ZooKeeper's NoAuth)."""
    from ledger_client import LedgerClient

    return LedgerClient(zk, config=client_config(client_conf, **overrides))


def close_shared() -> None:
    """Close every client task_client keeps: for a process done with its clusters (a test that ran
    a sink's driver steps in its own process, before its clusters stop)."""
    with _shared_lock:
        clients = [c for c, _used in _shared.values()]
        _shared.clear()
    for c in clients:
        c.close()


@contextmanager
def task_client(zk: str, client_conf: str | None) -> Iterator[LedgerClient]:
    """A client of the cluster at ``zk`` (TASK_TIMEOUTS) kept in this process between tasks: Spark
    reuses its Python workers, so a task saves a ZooKeeper session and the bookies' channels, which
    cost more than a small micro-batch's records. Taken out while a task uses it (never shared by
    two at once); a task that fails closes it, so a broken client never serves the next attempt.
    At most SHARED_CLIENTS_MAX are kept, none idle longer than SHARED_IDLE_S."""
    key = (zk, client_conf)
    with _shared_lock:
        got = _shared.pop(key, None)
    client = got[0] if got is not None and not got[0].closed else None
    if client is None:
        client = connect(zk, client_conf, **TASK_TIMEOUTS)
    try:
        yield client
    except BaseException:
        client.close()
        raise
    now = time.monotonic()
    with _shared_lock:
        replaced = _shared.pop(key, None)   # a second client of the cluster, used meanwhile: one stays
        _shared[key] = (client, now)
        doomed = [k for k, (_c, used) in _shared.items() if now - used > SHARED_IDLE_S]
        doomed += list(_shared)[:max(0, len(_shared) - SHARED_CLIENTS_MAX)]
        closing = [_shared.pop(k)[0] for k in dict.fromkeys(doomed) if k in _shared]
        closing += [replaced[0]] if replaced is not None else []
    for c in closing:
        c.close()
