"""The bookie-hosting application as the hosting tests start it: three executor-hosted bookies
on a chroot of the session's ZooKeeper, short session and heartbeat timeouts, the auditor in the
driver. One per test module (a start costs 15-30 s)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metadata import connect as connect_metadata
from spark_bookie.local.sandbox import SparkSandbox

REPO = Path(__file__).resolve().parents[2]
COMEBACK_S = 300.0   # an executor JVM takes 5 s on a quiet machine and over a minute under load to come back


def write_toml(path: Path, table: str, settings: Mapping[str, Any]) -> Path:
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in settings.items())
    path.write_text(f"[{table}]\n{body}")
    return path


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str, diag: Callable[[], str] = lambda: "") -> None:
    """Poll `pred` every 0.5 s until it holds; AssertionError with `diag()` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{diag()}")


@contextmanager
def hosting_cluster(root: Path, zk_server: str, *, lost_bookie_delay_s: int,
                    autorecovery: Mapping[str, Any] | None = None,
                    submit_conf: Mapping[str, str] | None = None) -> Iterator[SparkSandbox]:
    """The application started and, on exit, stopped. ``lost_bookie_delay_s``: the cluster's
    lostBookieRecoveryDelay (0: the auditor marks a dead bookie's ledgers at once);
    ``autorecovery``: settings beside the short ones every hosting test uses."""
    zk = f"{zk_server}/t-{uuid.uuid4().hex[:12]}/ledgers"
    bookie_conf = write_toml(root / "bookie.toml", "bookie", {
        "gc_interval_ms": 3_600_000, "journal_preallocate_bytes": 1 << 20, "write_cache_bytes_max": 8 << 20})
    ar_conf = write_toml(root / "autorecovery.toml", "autorecovery", {
        "audit_interval_ms": 5_000, "acquire_poll_ms": 500, "open_ledger_rereplication_grace_ms": 5_000,
        "zk_session_timeout_ms": 4_000, **(autorecovery or {})})
    with connect_metadata(zk) as store:
        store.cluster.init_cluster()
        store.underreplication.set_lost_bookie_recovery_delay_s(lost_bookie_delay_s)
    sb = SparkSandbox(root, 3, zk_connect=zk, extra_args=[
        "--zk-session-timeout-ms", "4000", "--heartbeat-interval-s", "1", "--health-interval-s", "5",
        "--bookie-conf", str(bookie_conf), "--autorecovery-conf", str(ar_conf)], start_timeout_s=COMEBACK_S,
        submit_conf=dict(submit_conf or {}), script=REPO / "jobs" / "bookie_cluster.py")
    try:
        sb.start()
        yield sb
    finally:
        sb.stop()
