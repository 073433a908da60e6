"""`spark-bookie`: run ZooKeeper, bookies, a sandbox cluster, and the benchmarks.

Each subcommand exits non-zero with a one-line message on bad input (bad directory, port in use,
cookie mismatch, ZooKeeper down) instead of a traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from spark_bookie.cli.common import (
    DEFAULT_ZK,
    client_conf_default,
    client_config,
    fail,
    setup_logging,
    wait_for_signal,
    zk_default,
)

if TYPE_CHECKING:
    from spark_bookie.local.sandbox_dir import SandboxDir, SandboxRecord

# ---------------------------------------------------------------------- subcommands

def cmd_zookeeper(args: argparse.Namespace) -> int:
    from spark_bookie.local.zookeeper import run_foreground

    return run_foreground(args.port, args.data_dir)


def cmd_init(args: argparse.Namespace) -> int:
    from ledger_client import errors
    from metadata import MetadataError
    from metadata import connect as connect_metadata

    try:
        cfg = client_config(args.client_conf)
        store = connect_metadata(args.zk, zk_auth=cfg.zk_auth, zk_tls=cfg.zookeeper_tls())
        try:
            print(f"cluster initialised: instance id {store.cluster.init_cluster()}")
        finally:
            store.close()
    except (MetadataError, errors.LedgerError) as e:
        return fail(f"cannot initialise the cluster at {args.zk}: {e}")
    return 0


def cmd_bookie(args: argparse.Namespace) -> int:
    from spark_bookie.errors import BookieError
    from spark_bookie.server.bookie import Bookie
    from spark_bookie.server.config import load_config

    try:
        cfg = load_config(args.conf, zk_connect=args.zk, port=args.port, host=args.host,
                          advertised_host=args.advertised_host,
                          journal_dirs=[args.journal_dir] if args.journal_dir else None,
                          ledger_dirs=[args.ledger_dir] if args.ledger_dir else None,
                          http_port=args.http_port, network_location=args.network_location,
                          bookie_group=args.bookie_group)
        from spark_bookie.cli.logs import set_log_identity

        set_log_identity(cfg.bookie_id)
        bookie = Bookie(cfg)
        bookie.start()
    except BookieError as e:
        return fail(str(e))
    autorecovery = None
    if cfg.autorecovery_enabled:  # BookKeeper's autoRecoveryDaemonEnabled: auditor candidate + worker
        from spark_bookie.cli.autorecovery import start_beside_bookie

        try:
            autorecovery = start_beside_bookie(cfg)
        except BookieError as e:
            bookie.stop()
            return fail(str(e))
    admin = None
    if cfg.http_port:
        from spark_bookie.http.process import serve_bookie

        try:
            admin = serve_bookie(bookie, cfg.http_port, autorecovery)
        except OSError as e:
            if autorecovery is not None:
                autorecovery.stop()
            bookie.stop()
            return fail(f"cannot serve HTTP on {cfg.host}:{cfg.http_port}: {e.strerror or e}")
        print(f"bookie {bookie.bookie_id} http admin on {admin.url} (/metrics, /heartbeat, /api/v1/)", flush=True)
    # This process is the bookie's own: freeze what start-up allocated and collect young objects
    # less often, so the cyclic GC does not rescan the write cache's bookkeeping on every add burst.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    print(f"bookie {bookie.bookie_id} ready", flush=True)
    try:
        wait_for_signal()
    finally:
        if admin is not None:
            admin.stop()
        if autorecovery is not None:
            autorecovery.stop()
        bookie.stop()
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Fresh unless --resume (spark_bookie/local/sandbox_dir.py says why); any failure to start is
    one line on stderr and exit 2; Ctrl-C before the sandbox waits for it stops what started, exit 130."""
    import logging

    from spark_bookie.local.sandbox_dir import SandboxDir

    root = os.path.abspath(args.root or os.path.join(os.getcwd(), ".sandbox"))
    if args.bookies is not None and args.bookies < 1:
        return fail(f"--bookies must be at least 1, not {args.bookies}")
    if args.resume and args.demo:
        return fail("--resume does not go with --demo: a demo starts fresh")
    args.bookie_groups = [g.strip() for g in args.bookie_groups.split(",")] if args.bookie_groups else []
    if len(args.bookie_groups) > (args.hosts or args.bookies or 3):
        return fail(f"--bookie-groups names {len(args.bookie_groups)} groups for "
                    f"{args.hosts or args.bookies or 3} {'hosts' if args.hosts else 'bookies'}")
    if args.bookie_groups and args.spark:
        return fail("--bookie-groups is for bookie processes and --hosts; Spark-hosted bookies take "
                    "jobs/bookie_cluster.py's --bookie-group-map")
    sandbox_dir = SandboxDir(root)
    try:
        with sandbox_dir.claim(_sandbox_shape(args), args.resume) as previous:
            if previous is not None and not args.hosts:
                args.bookies = previous.bookies
            return _run_sandbox(args, sandbox_dir, previous)
    except KeyboardInterrupt:
        print("spark-bookie: interrupted; the sandbox is stopped", file=sys.stderr)
        return 130
    except _sandbox_errors() as e:
        logging.getLogger(__name__).debug("the sandbox failed", exc_info=True)   # the traceback with -v
        return fail(_one_line(e))


def _sandbox_shape(args: argparse.Namespace) -> SandboxRecord:
    from spark_bookie.local.sandbox_dir import BOOKIES, HOSTS, SPARK, SandboxRecord

    mode = HOSTS if args.hosts else SPARK if args.spark else BOOKIES
    bookies = 0 if mode == HOSTS else args.bookies or 0   # --hosts: a bookie per host; 0: as the record says
    return SandboxRecord(mode, bool(args.secure), bookies, bool(args.http), args.hosts or 0)


def _sandbox_errors() -> tuple[type[BaseException], ...]:
    """What a sandbox's start can fail with, short of a bug: each is said in one line."""
    from ledger_client.errors import LedgerError
    from metadata import MetadataError
    from spark_bookie.errors import BookieError
    from spark_bookie.local.hosts import HostsError
    from spark_bookie.local.sandbox import SandboxError

    return SandboxError, BookieError, HostsError, MetadataError, LedgerError, OSError, ValueError


def _one_line(e: BaseException) -> str:
    from spark_bookie.local.sandbox import SandboxError

    if isinstance(e, SandboxError):
        return e.message
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[0] if lines else type(e).__name__


def _run_sandbox(args: argparse.Namespace, sandbox_dir: SandboxDir, previous: SandboxRecord | None) -> int:
    root = str(sandbox_dir.root)
    if args.hosts:
        from spark_bookie.local.multihost import run_hosts_sandbox

        return run_hosts_sandbox(root, args.hosts, _wait_ready, secure=args.secure,
                                 sandbox_dir=sandbox_dir, resume=previous, bookie_groups=args.bookie_groups)
    if args.spark:
        if args.demo:
            from spark_bookie.local.spark_demo import run_spark_demo

            return run_spark_demo(root, args.bookies or 3, args.zk_port, secure=args.secure)
        from spark_bookie.cli.cluster import run_spark_sandbox

        return run_spark_sandbox(root, args.bookies or 3, args.zk_port, _wait_ready, secure=args.secure,
                                 sandbox_dir=sandbox_dir, resume=previous)
    return _run_bookies(args, sandbox_dir, previous)


READY = "press Ctrl-C to stop"   # a sandbox's last line once it is up (tests wait for it)


def _wait_ready() -> int:
    return wait_for_signal(READY)


def _run_bookies(args: argparse.Namespace, sandbox_dir: SandboxDir, previous: SandboxRecord | None) -> int:
    """ZooKeeper + N bookie processes (BookKeeper's localbookie)."""
    from spark_bookie.local.sandbox import Sandbox
    from spark_bookie.local.sandbox_dir import BOOKIES, SandboxRecord
    from spark_bookie.local.secure import load_secure_files, sandbox_secure_files

    root = sandbox_dir.root
    files = None
    if args.secure:
        files = load_secure_files(root) if previous is not None else sandbox_secure_files(root)
    settings = files.bookie_settings() if files is not None else {}
    http = args.http or bool(previous and previous.http)
    n = args.bookies or 3
    with Sandbox(root, n, zk_port=previous.zk_port if previous else args.zk_port, http=http,
                 bookie_settings=settings, bookie_ports=previous.bookie_ports if previous else (),
                 http_ports=previous.http_ports if previous else (),
                 zk_tls=files.zookeeper_tls() if files is not None else None, bookie_groups=args.bookie_groups) as sb:
        sandbox_dir.save(SandboxRecord(BOOKIES, files is not None, n, http, zk_port=sb.zk.port if sb.zk else 0,
                                       bookie_ports=[b.port for b in sb.bookies],
                                       http_ports=[int(b.settings.get("http_port") or 0) for b in sb.bookies if http],
                                       pids=sb.pids))
        print(f"sandbox up: ZooKeeper at {sb.connect_string}, bookies "
              f"{', '.join(b.bookie_id for b in sb.bookies)}", flush=True)
        if files is not None:
            files.announce()
        for b in sb.bookies:
            if b.http_url:
                print(f"bookie {b.bookie_id} http admin on {b.http_url} (/metrics, /api/v1/)", flush=True)
        print(f"export SPARK_BOOKIE_ZK={sb.connect_string}", flush=True)
        if args.demo:
            from spark_bookie.local.demo import round_trip

            return round_trip(sb, client_conf=files.client_conf_path if files is not None else None)
        wait_for_signal(READY)
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from spark_bookie.cli.cluster import run_cluster

    return run_cluster(args)


def cmd_autorecovery(args: argparse.Namespace) -> int:
    from spark_bookie.cli.autorecovery import run_autorecovery

    return run_autorecovery(args)


def cmd_shell(args: argparse.Namespace) -> int:
    from spark_bookie.cli.shell import run_shell

    return run_shell(args)


def cmd_stream(args: argparse.Namespace) -> int:
    from spark_bookie.cli.stream import run_stream

    return run_stream(args)


def cmd_tenant(args: argparse.Namespace) -> int:
    from spark_bookie.cli.tenant import run_tenant

    return run_tenant(args)


def cmd_role(args: argparse.Namespace) -> int:
    from spark_bookie.cli.role import run_role

    return run_role(args)


def cmd_replicate(args: argparse.Namespace) -> int:
    from spark_bookie.cli.replicate import run_replicate

    return run_replicate(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from spark_bookie.cli.bench import run_bench

    return run_bench(args)


def cmd_deploy(args: argparse.Namespace) -> int:
    from spark_bookie.deploy.render import run_render

    return run_render(args)


# ---------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="spark-bookie", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--client-conf", default=client_conf_default(), metavar="PATH",
                    help="client TOML ([client] table: zk_auth, auth_token(_file), tls_*) for secured clusters; "
                         "default $SPARK_BOOKIE_CLIENT_CONF")
    ap.add_argument("--log-format", choices=("text", "json"), default="text",
                    help="json: one JSON object per log line, with the bookie id in each (spark_bookie/cli/logs.py)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("zookeeper", help="run the embedded ZooKeeper (loopback) in the foreground")
    p.add_argument("--port", type=int, default=2181)
    p.add_argument("--data-dir", required=True)
    p.set_defaults(func=cmd_zookeeper)

    p = sub.add_parser("init", help="create the cluster layout in ZooKeeper (idempotent)")
    p.add_argument("--zk", default=zk_default())
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("bookie", help="run one bookie in the foreground")
    p.add_argument("--zk", default=None,
                   help=f"ZooKeeper connect string (default $SPARK_BOOKIE_ZK or {DEFAULT_ZK})")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--advertised-host", default=None, help="host part of the bookie id")
    p.add_argument("--journal-dir", default=None)
    p.add_argument("--ledger-dir", default=None)
    p.add_argument("--conf", default=None, help="TOML configuration file (see conf/bookie.toml)")
    p.add_argument("--http-port", type=int, default=None,
                   help="serve /metrics and the admin API on this port (0 = off; default: http_port of --conf)")
    p.add_argument("--network-location", default=None, help="rack/zone for rack-aware placement, e.g. /zone-a/rack-1 "
                   "(default: network_location of --conf)")
    p.add_argument("--bookie-group", default=None, help="placement group this bookie joins, e.g. gold: namespaces "
                   "with bookie_groups place their segments on such bookies (default: bookie_group of --conf)")
    p.set_defaults(func=cmd_bookie)

    p = sub.add_parser("sandbox", help="embedded ZooKeeper + N bookie processes on this machine",
                       description="ZooKeeper + N bookies on this machine (BookKeeper's localbookie). Each start is "
                       "fresh, as localbookie's: it deletes the previous sandbox's data in its directory (--root, "
                       "default ./.sandbox) and says so, since that data belongs to ports a new start does not "
                       "get back. --resume brings the previous sandbox back instead: same flags, same ports, same "
                       "data. Only one sandbox runs in a directory at a time.")
    p.add_argument("--bookies", type=int, default=None, help="bookies to run (default 3; --resume: as before)")
    p.add_argument("--root", default=None, help="the sandbox's directory (default ./.sandbox); a fresh start "
                   "deletes what a previous sandbox left there, and refuses a directory holding anything else")
    p.add_argument("--resume", action="store_true",
                   help="bring the previous sandbox in --root back with its data, on its recorded ports (same "
                        "--spark/--secure/--hosts as it ran with); a one-line error if a port is taken")
    p.add_argument("--zk-port", type=int, default=None)
    p.add_argument("--demo", action="store_true",
                   help="run the demo, then stop (with --spark: the Spark-first demo, bookies in executors)")
    p.add_argument("--spark", action="store_true",
                   help="host the bookies in Spark executors (jobs/bookie_cluster.py on local-cluster[N,1,1024])")
    p.add_argument("--secure", action="store_true",
                   help="TLS with client certificates, token authentication and ZooKeeper ACLs, with a fresh CA; "
                        "prints the client config to use (docs/security.md); with --spark, for the executors' "
                        "bookies; with --demo, the demo uses it")
    p.add_argument("--http", action="store_true", help="every bookie serves /metrics and the admin API on a port "
                   "of its own (printed)")
    p.add_argument("--hosts", type=int, default=0, help="N hosts (network namespaces as root, else loopback "
                   "addresses), a bookie on each; see docs/hosts.md")
    p.add_argument("--bookie-groups", default=None, metavar="G1,G2,...",
                   help="placement groups of the bookies in order (with --hosts: of each host's bookie), e.g. "
                        "gold,gold,silver; an empty or missing name leaves that bookie in no group. Give it again "
                        "with --resume (docs/operations.md, placement groups)")
    p.set_defaults(func=cmd_sandbox)

    from spark_bookie.cli.cluster import add_cluster_parser

    p = sub.add_parser("cluster", help="the Spark-hosted bookie cluster: `cluster stop`, `cluster status`")
    add_cluster_parser(p, zk_default=zk_default())
    p.set_defaults(func=cmd_cluster)

    from spark_bookie.cli.autorecovery import add_autorecovery_parser

    p = sub.add_parser("autorecovery", help="auditor candidate + replication worker in the foreground")
    add_autorecovery_parser(p, zk_default=zk_default())
    p.set_defaults(func=cmd_autorecovery)

    from spark_bookie.cli.shell import add_shell_parser

    p = sub.add_parser("shell", help="inspect and test the cluster (listbookies, readledger, ...)")
    add_shell_parser(p, zk_default=zk_default())
    p.set_defaults(func=cmd_shell)

    from spark_bookie.cli.stream import add_stream_parser

    p = sub.add_parser("stream", help="namespaces and streams: create, list, info, write, tail, truncate, delete; "
                       "grant, revoke, permissions; subscriptions")
    add_stream_parser(p)
    p.set_defaults(func=cmd_stream)

    from spark_bookie.cli.tenant import add_tenant_parser

    p = sub.add_parser("tenant", help="tenants: create, list, info, update, delete (DESIGN §4.9)")
    add_tenant_parser(p)
    p.set_defaults(func=cmd_tenant)

    from spark_bookie.cli.role import add_role_parser

    p = sub.add_parser("role", help="`role create NAME --out PATH`: a client config with a token for a role")
    add_role_parser(p)
    p.set_defaults(func=cmd_role)

    from spark_bookie.cli.replicate import add_replicate_parser

    p = sub.add_parser("replicate", help="copy streams to another cluster with a Spark query; `replicate status` "
                       "shows the lag (DESIGN §4.12)")
    add_replicate_parser(p)
    p.set_defaults(func=cmd_replicate)

    from spark_bookie.cli.bench import add_bench_parser

    p = sub.add_parser("bench", help="benchmarks against same-run baselines")
    add_bench_parser(p)
    p.set_defaults(func=cmd_bench)

    from spark_bookie.deploy.render import add_deploy_parser

    p = sub.add_parser("deploy", help="deployment artefacts: `deploy render` writes the Marathon group (DC/OS)")
    add_deploy_parser(p)
    p.set_defaults(func=cmd_deploy)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.log_format == "json":
        from spark_bookie.cli.logs import install_json_logging

        install_json_logging()
    if args.command == "bookie" and args.zk is None:
        args.zk = zk_default()
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
