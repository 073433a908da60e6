"""Command-line glue for re-replication: ``spark-bookie autorecovery``, the shell's ``recover`` and
``decommission``, and the autorecovery daemon a bookie runs beside itself
(``autorecovery_enabled``, BookKeeper's autoRecoveryDaemonEnabled).

The logic lives in the ``recovery`` package; it is imported inside the functions here so that
``spark_bookie`` keeps importing without it (the bookie process only loads it when asked to).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger_client import LedgerClient
    from recovery import AutoRecovery, DrainProgress
    from spark_bookie.server.config import BookieConfig

PROG = "spark-bookie"


# ---------------------------------------------------------------------- spark-bookie autorecovery

def add_autorecovery_parser(p: argparse.ArgumentParser, zk_default: str) -> None:
    p.add_argument("--zk", default=zk_default, help=f"ZooKeeper connect string (default {zk_default})")
    p.add_argument("--conf", default=None, help="TOML configuration file (see conf/autorecovery.toml)")
    p.add_argument("--id", default=None, help="auditor candidate id (default host:pid)")
    p.add_argument("--no-auditor", action="store_true", help="only replicate; never stand for auditor")
    p.add_argument("--no-worker", action="store_true", help="only stand for auditor; never replicate")
    p.add_argument("--http-port", type=int, default=0, help="serve /metrics and the admin API here (0 = off)")
    p.add_argument("--http-host", default="127.0.0.1", help="address the admin API binds (default 127.0.0.1)")


def tier_step() -> Any:
    """jobs.stream_tiering.tier_step, so the auditor tiers the sealed segments of namespaces that set
    tier_after_ms (as the Spark-hosted cluster's does); None where deltalake is not installed."""
    try:
        from jobs.stream_tiering import tier_step as step
    except ImportError:
        return None
    return step


def run_autorecovery(args: argparse.Namespace) -> int:
    """Auditor candidate + replication worker in the foreground until SIGTERM/SIGINT."""
    from ledger_client.errors import LedgerError
    from recovery import AutoRecovery, RecoveryError, load_autorecovery_config
    from spark_bookie.cli.common import client_config, wait_for_signal

    try:
        cfg = load_autorecovery_config(args.conf)
        ar = AutoRecovery(args.zk, cfg, candidate_id=args.id or f"{socket.gethostname()}:{os.getpid()}",
                          run_auditor=not args.no_auditor, run_worker=not args.no_worker,
                          client_config=client_config(getattr(args, "client_conf", None)),
                          tier_step=tier_step())
    except (RecoveryError, ValueError, LedgerError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    from spark_bookie.cli.logs import set_log_identity

    set_log_identity(ar.candidate_id)
    if not 0 <= args.http_port < 65536:
        print(f"{PROG}: error: --http-port {args.http_port} is not in 0..65535", file=sys.stderr)
        return 2
    ar.start()
    admin = None
    try:
        if args.http_port:
            from spark_bookie.http.process import serve_autorecovery

            try:
                admin = serve_autorecovery(ar, args.http_port, args.http_host)
            except OSError as e:
                print(f"{PROG}: error: cannot serve HTTP on {args.http_host}:{args.http_port}: {e.strerror or e}",
                      file=sys.stderr)
                return 2
            print(f"autorecovery {ar.candidate_id} http admin on {admin.url}", flush=True)
        if not ar.wait_ready(cfg.zk_connect_timeout_ms / 1000 + 5):
            print(f"{PROG}: ZooKeeper at {args.zk} is not reachable yet; still trying", file=sys.stderr, flush=True)
        else:
            print(f"autorecovery {ar.candidate_id} ready", flush=True)
        wait_for_signal()
    finally:
        if admin is not None:
            admin.stop()
        ar.stop()
    return 0


def start_beside_bookie(cfg: BookieConfig) -> AutoRecovery:
    """The autorecovery daemon of a bookie process: auditor candidate + worker, the bookie id as
    candidate id; its client presents the bookie's ``client_conf`` (or the bookie's own zk_auth).
    ConfigError (a BookieError) for a bad ``autorecovery_conf`` or ``client_conf``."""
    from ledger_client.errors import LedgerError
    from recovery import AutoRecovery, RecoveryConfigError, load_autorecovery_config
    from spark_bookie.cli.common import client_config
    from spark_bookie.errors import ConfigError

    try:
        ar_cfg = load_autorecovery_config(cfg.autorecovery_conf or None)
        client_cfg = client_config(cfg.client_conf or None)
        if cfg.zk_auth and not client_cfg.zk_auth:
            client_cfg = dataclasses.replace(client_cfg, zk_auth=cfg.zk_auth)
    except (RecoveryConfigError, LedgerError) as e:
        raise ConfigError(str(e)) from e
    ar = AutoRecovery(cfg.zk_connect, ar_cfg, candidate_id=cfg.bookie_id, client_config=client_cfg,
                      tier_step=tier_step())
    ar.start()
    return ar


# ---------------------------------------------------------------------- shell recover / decommission

def add_drain_arguments(c: argparse.ArgumentParser, *, force: bool) -> None:
    c.add_argument("bookie", metavar="BOOKIE", help="the bookie id (host:port)")
    if force:
        c.add_argument("--force", action="store_true", help="recover even though the bookie is registered (alive)")
    c.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="give up after this long (default 3600)")
    c.add_argument("--no-worker", action="store_true",
                   help="rely on the cluster's autorecovery daemons instead of replicating from this shell too")
    c.add_argument("--conf", default=None, help="autorecovery TOML for the shell's own worker")


def cmd_recover(client: LedgerClient, args: argparse.Namespace) -> int:
    """Re-replicate a dead bookie's ledgers now (whatever the lost-bookie delay) and wait."""
    return _drain(client, args, decommission=False)


def cmd_decommission(client: LedgerClient, args: argparse.Namespace) -> int:
    """Move every ledger off a bookie (dead or alive), then delete its cookie."""
    return _drain(client, args, decommission=True)


def _drain(client: LedgerClient, args: argparse.Namespace, *, decommission: bool) -> int:
    from metadata import MetadataError
    from recovery import RecoveryError, ReplicationWorker, drain_bookie, is_registered, load_autorecovery_config
    from recovery import delete_cookie as delete_cookie_of

    store, bookie = client.store, args.bookie
    verb = "decommission" if decommission else "recover"
    worker = None
    try:
        if not decommission and not getattr(args, "force", False) and is_registered(store, bookie):
            raise RecoveryError(f"bookie {bookie} is alive (registered); `recover` is for dead bookies: use "
                                "`decommission` to move data off a live one, or --force")
        if not args.no_worker:
            worker = ReplicationWorker(store, client, load_autorecovery_config(args.conf), name=f"shell-{verb}")
            worker.start()
        display = _ProgressDisplay(verb, args.json)
        final = drain_bookie(store, bookie, timeout_s=args.timeout, progress=display)
        display.finish()
        deleted = delete_cookie_of(store, bookie) if decommission else False
    except (RecoveryError, MetadataError) as e:
        print(f"{PROG} shell: error: {verb} {bookie}: {e}", file=sys.stderr)
        return 2
    finally:
        if worker is not None:
            worker.stop()
    if args.json:
        print(_json({"bookie": bookie, "command": verb, "ledgers_moved": final.total,
                     "seconds": round(final.elapsed_s, 3), "cookie_deleted": deleted}))
    else:
        tail = "; its cookie is deleted" if deleted else ("; it had no cookie" if decommission else "")
        print(f"{verb} {bookie}: done, {final.total} ledgers moved off it in {final.elapsed_s:.1f}s{tail}")
    return 0


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj)


class _ProgressDisplay:
    """A tqdm progress bar on a terminal (ledgers moved of those that named the bookie); a line
    per change (at most one every 10 s) otherwise, so logs of scripted runs stay short. Always on
    stderr: stdout is the result."""

    def __init__(self, verb: str, quiet: bool) -> None:
        self.verb = verb
        self.tty = sys.stderr.isatty()
        self.quiet = quiet
        self.last: tuple[int, int] | None = None
        self.last_print = 0.0
        self.bar: Any = None

    def __call__(self, p: DrainProgress) -> None:
        if self.quiet:
            return
        if self.tty:
            self._bar(p)
            return
        line = (f"{self.verb} {p.bookie}: {p.total - p.remaining}/{p.total} ledgers moved, "
                f"{p.remaining} still on it ({p.queued} queued), {p.elapsed_s:.0f}s")
        now = time.monotonic()
        if (p.remaining, p.queued) != self.last and (now - self.last_print >= 10 or p.done or self.last is None):
            print(line, file=sys.stderr, flush=True)
            self.last_print = now
        self.last = (p.remaining, p.queued)

    def _bar(self, p: DrainProgress) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=p.total, desc=f"{self.verb} {p.bookie}", unit="ledger", file=sys.stderr,
                            dynamic_ncols=True)
        if p.total != self.bar.total:  # ledgers placed on the bookie while it drains
            self.bar.total = p.total
        self.bar.n = p.total - p.remaining
        self.bar.set_postfix(queued=p.queued, refresh=False)
        self.bar.refresh()

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
