"""What every command group of the CLI shares: the default ZooKeeper, logging, the one-line error,
and waiting for Ctrl-C / SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger_client import ClientConfig

DEFAULT_ZK = "127.0.0.1:2181"


def zk_default() -> str:
    return os.environ.get("SPARK_BOOKIE_ZK", DEFAULT_ZK)


def client_conf_default() -> str | None:
    return os.environ.get("SPARK_BOOKIE_CLIENT_CONF") or None


def client_config(path: str | None, **overrides: Any) -> ClientConfig:
    """The client settings of a command: the ``[client]`` table of ``--client-conf`` /
    $SPARK_BOOKIE_CLIENT_CONF (credentials of a secured cluster: zk_auth, token, TLS) with the
    command's own `overrides`; IncorrectParameterError (a LedgerError) for a bad file."""
    from ledger_client import ClientConfig

    if path:
        return ClientConfig.from_toml(path, **overrides)
    return ClientConfig(**overrides)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kazoo logs every failed reconnect attempt; our own error says what went wrong once.
    logging.getLogger("kazoo").setLevel(logging.DEBUG if verbose else logging.ERROR)


def wait_for_signal(ready: str | None = None) -> int:
    """Block until SIGTERM or SIGINT; returns the signal number. ``ready`` is printed once the
    handlers are in place, so a signal sent as soon as it appears is caught, not a KeyboardInterrupt.

    The handler stays installed afterwards: a second Ctrl-C (or a wrapper forwarding the same
    signal) must not interrupt the clean shutdown that follows and orphan child processes.
    """
    got: list[int] = []
    event = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        if got:
            print("spark-bookie: already stopping", file=sys.stderr, flush=True)
        got.append(signum)
        event.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)
    if ready is not None:
        print(ready, flush=True)
    while not event.wait(0.5):
        pass
    return got[0]


def fail(msg: str) -> int:
    print(f"spark-bookie: error: {msg}", file=sys.stderr)
    return 2
