"""`spark-bookie stream CMD`: namespaces and streams from the command line (DESIGN §4.2, §4.5),
who may use a namespace (`grant`, `revoke`, `permissions`: DESIGN §4.9), and streams'
subscriptions (spark_bookie.cli.subscriptions: DESIGN §4.11).

Built on the public client only. Plain text, one item per line; `--json` for structure. Records
are written one per stdin line (the line without its newline; bytes as they are) and printed as
`dlsn txid payload` (payload as UTF-8 when printable, else `hex:` and its hex). Every failure is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger_client.errors import IncorrectParameterError
from spark_bookie.cli.common import zk_default
from spark_bookie.cli.shell import AdminRule, ShellFunc, render_bytes, run_shell
from spark_bookie.cli.subscriptions import add_subscription_commands

if TYPE_CHECKING:
    from ledger_client import LedgerClient, LogRecord, Namespace

WRITE_FLUSH_RECORDS = 1_000   # `stream write` waits for acknowledgements this often


def _split(path: str) -> tuple[str, str]:
    ns, sep, name = path.partition("/")
    if not sep or not ns or not name:
        raise argparse.ArgumentTypeError(f"want NAMESPACE/STREAM, not {path!r}")
    return ns, name


def _ns(client: LedgerClient, path: tuple[str, str]) -> tuple[Namespace, str]:
    return client.namespace(path[0]), path[1]


def _record_text(r: LogRecord) -> str:
    enc, text = render_bytes(r.payload)
    return f"{r.dlsn} {r.txid} {text if enc == 'utf-8' else 'hex:' + text}"


def _record_json(r: LogRecord) -> dict[str, Any]:
    enc, text = render_bytes(r.payload)
    return {"dlsn": str(r.dlsn), "txid": r.txid, "encoding": enc, "payload": text}


# ---------------------------------------------------------------------- commands

def cmd_namespaces(client: LedgerClient, args: argparse.Namespace) -> int:
    names = client.list_namespaces()
    if args.json:
        print(json.dumps({n: client.namespace(n).settings.to_json() for n in names}))
    elif names:
        print("\n".join(names))
    return 0


SETTING_FLAGS = (  # (flag, setting, type, metavar, help): create-namespace and update-namespace
    ("--ensemble", "ensemble_size", int, "E", None),
    ("--write-quorum", "write_quorum_size", int, "Qw", None),
    ("--ack-quorum", "ack_quorum_size", int, "Qa", None),
    ("--rolling-bytes", "segment_rolling_bytes", int, "BYTES", "new segment past this size"),
    ("--rolling-interval-ms", "segment_rolling_interval_ms", int, "MS", "new segment past this age"),
    ("--output-buffer-bytes", "output_buffer_bytes", int, "BYTES", "records packed into one entry up to this"),
    ("--retention-ms", "retention_ms", int, "MS", None),
    ("--retention-bytes", "retention_bytes", int, "BYTES", None),
    ("--tier-after-ms", "tier_after_ms", int, "MS", "tier sealed segments into Delta past this age"),
    ("--tier-table", "tier_table", str, "PATH", "... into <PATH>/<stream>"),
    ("--bookie-groups", "bookie_groups", str, "G1,G2", "segments only on bookies of these placement groups"),
    ("--bookie-groups-secondary", "bookie_groups_secondary", str, "G1,G2",
     "... or of these when the primary groups lack bookies"),
    ("--storage-quota-bytes", "storage_quota_bytes", int, "BYTES", "writes refused past this much held on bookies"),
    ("--write-rate-bytes-per-s", "write_rate_bytes_per_s", int, "N", "bookies slow writers above this"),
    ("--write-rate-records-per-s", "write_rate_records_per_s", int, "N", "bookies slow writers above this"),
    ("--retain-until-consumed", "retain_until_consumed", json.loads, "true|false",
     "retention keeps what a subscription has not consumed"),
    ("--backlog-quota-bytes", "backlog_quota_bytes", int, "BYTES", "the slowest subscription's backlog per stream"),
    ("--backlog-quota-policy", "backlog_quota_policy", str, "refuse_writes|drop_oldest", "past the backlog quota"),
)
NONE_WORD = "none"


def _setting_value(kind: Callable[[str], Any]) -> Callable[[str], object]:
    """argparse type of a setting: its own type (or parser), or the word `none` (no limit; update-namespace)."""
    def parse(text: str) -> object:
        return None if text.strip().lower() == NONE_WORD else kind(text)
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _add_setting_flags(c: argparse.ArgumentParser) -> None:
    for flag, setting, kind, metavar, help_text in SETTING_FLAGS:
        c.add_argument(flag, dest=f"setting_{setting}", type=_setting_value(kind), default=argparse.SUPPRESS,
                       metavar=metavar, help=help_text)


def _settings_from(args: argparse.Namespace) -> dict[str, object]:
    """The settings given on the command line (``none`` given: None, i.e. no limit)."""
    return {k[len("setting_"):]: v for k, v in vars(args).items() if k.startswith("setting_")}


def cmd_create_namespace(client: LedgerClient, args: argparse.Namespace) -> int:
    settings = {k: v for k, v in _settings_from(args).items() if v is not None}
    ns = client.create_namespace(args.namespace, tenant=args.tenant, **settings)
    print(json.dumps(ns.settings.to_json()) if args.json else f"created namespace {ns.name} in tenant {ns.tenant}")
    return 0


def cmd_update_namespace(client: LedgerClient, args: argparse.Namespace) -> int:
    changes = _settings_from(args)
    if not changes:
        raise IncorrectParameterError("update-namespace: give at least one setting to change")
    settings = client.namespace(args.namespace).update_settings(**changes)
    print(json.dumps(settings.to_json()) if args.json else f"updated namespace {args.namespace}: "
          + ", ".join(f"{k}={v}" for k, v in changes.items()))
    return 0


def _actions(text: str) -> list[str]:
    """``produce,consume`` -> ["produce", "consume"] (the client checks them)."""
    return [a.strip() for a in text.split(",") if a.strip()]


def cmd_grant(client: LedgerClient, args: argparse.Namespace) -> int:
    client.namespace(args.namespace).grant_permission(args.role, args.actions)
    print(f"granted {','.join(sorted(set(args.actions)))} on namespace {args.namespace} to role {args.role}")
    return 0


def cmd_revoke(client: LedgerClient, args: argparse.Namespace) -> int:
    client.namespace(args.namespace).revoke_permission(args.role)
    print(f"revoked every permission of role {args.role} on namespace {args.namespace}")
    return 0


def cmd_permissions(client: LedgerClient, args: argparse.Namespace) -> int:
    """``role<TAB>action,action`` per role (``--json``: ``{role: [actions]}``)."""
    perms = {role: sorted(actions) for role, actions in sorted(client.namespace(args.namespace).permissions().items())}
    if args.json:
        print(json.dumps(perms))
    else:
        for role, actions in perms.items():
            print(f"{role}\t{','.join(actions)}")
    return 0


def cmd_list(client: LedgerClient, args: argparse.Namespace) -> int:
    names = client.namespace(args.namespace).list_streams(args.prefix)
    if names or args.json:
        print(json.dumps(names) if args.json else "\n".join(names))
    return 0


def cmd_info(client: LedgerClient, args: argparse.Namespace) -> int:
    ns, name = _ns(client, args.stream)
    info = ns.stream_info(name)
    if args.json:
        d = {"stream": f"{ns.name}/{name}", "first_dlsn": _s(info.first_dlsn), "last_dlsn": _s(info.last_dlsn),
             "last_txid": info.last_txid, "end_of_stream": info.end_of_stream,
             "truncated_before": _s(info.truncated_before), "storage_bytes": info.storage_bytes,
             "namespace_storage_bytes": info.namespace_storage_bytes,
             "storage_quota_bytes": info.storage_quota_bytes, "placement_problems": info.placement_problems,
             "segments": [{**s.__dict__, "first_dlsn": _s(s.first_dlsn), "last_dlsn": _s(s.last_dlsn)}
                          for s in info.segments]}
        print(json.dumps(d))
        return 0
    print(f"stream {ns.name}/{name}: {len(info.segments)} segments, last txid {info.last_txid}, "
          f"first {info.first_dlsn}, last {info.last_dlsn}{', ENDED' if info.end_of_stream else ''}"
          f"{f', truncated before {info.truncated_before}' if info.truncated_before else ''}")
    for problem in info.placement_problems:
        print(f"placement: {problem}")
    print(f"storage: {info.storage_bytes} bytes on bookies; namespace {ns.name}: "
          f"{_against(info.namespace_storage_bytes, info.storage_quota_bytes)}")
    for s in info.segments:
        where = f"ledger {s.ledger_id}" if s.ledger_id is not None else f"table {s.table} v{s.delta_version}"
        print(f"  segment {s.sequence} {s.state:<11} {where} txids {s.first_txid}..{s.last_txid} "
              f"records {s.record_count} bytes {s.bytes} dlsn {s.first_dlsn}..{s.last_dlsn}")
    return 0


def _against(used: int, quota: int | None) -> str:
    if quota is None:
        return f"{used} bytes (no storage quota)"
    return f"{used} of {quota} bytes of storage quota ({100 * used / quota:.1f}%)"


def cmd_usage(client: LedgerClient, args: argparse.Namespace) -> int:
    usage = client.namespace(args.namespace).storage_usage()
    if args.json:
        print(json.dumps(usage.to_json()))
        return 0
    print(f"namespace {usage.namespace}: {_against(usage.used_bytes, usage.quota_bytes)} on bookies")
    for name, s in sorted(usage.streams.items()):
        print(f"  {name}\t{s.total}")
    return 0


def _s(d: object) -> str | None:
    return None if d is None else str(d)


def cmd_write(client: LedgerClient, args: argparse.Namespace) -> int:
    ns, name = _ns(client, args.stream)
    n = 0
    last = None
    with ns.open_writer(name, lock_timeout_ms=args.lock_timeout_ms) as w:
        for line in sys.stdin.buffer:
            last = w.write_async(line.rstrip(b"\n"))
            n += 1
            if n % WRITE_FLUSH_RECORDS == 0:
                w.flush()
        w.flush()
    dlsn = last.result() if last is not None else None
    print(json.dumps({"records": n, "last_dlsn": _s(dlsn)}) if args.json else f"wrote {n} records, last at {dlsn}")
    return 0


def cmd_tail(client: LedgerClient, args: argparse.Namespace) -> int:
    from ledger_client import DLSN, errors

    ns, name = _ns(client, args.stream)
    start: dict[str, Any] = {}
    if args.from_txid is not None:
        start["start_txid"] = args.from_txid
    elif args.from_ == "latest":
        start["start"] = "latest"
    elif args.from_ is not None:
        start["start"] = DLSN.parse(args.from_)
    shown = 0
    with ns.open_reader(name, **start) as r:
        while args.count is None or shown < args.count:
            try:
                batch = r.read_batch(1_000 if args.count is None else min(1_000, args.count - shown), 1_000)
            except errors.EndOfStreamError:
                break
            if not batch and args.no_follow:
                break
            for rec in batch:
                print(json.dumps(_record_json(rec)) if args.json else _record_text(rec), flush=not batch[1:])
            shown += len(batch)
            sys.stdout.flush()
    return 0


def cmd_truncate(client: LedgerClient, args: argparse.Namespace) -> int:
    from ledger_client import DLSN

    ns, name = _ns(client, args.stream)
    point = DLSN.parse(args.dlsn)
    with ns.open_writer(name, lock_timeout_ms=args.lock_timeout_ms) as w:
        w.truncate(point)
    print(f"truncated {ns.name}/{name} before {point}")
    return 0


def cmd_delete(client: LedgerClient, args: argparse.Namespace) -> int:
    ns, name = _ns(client, args.stream)
    ns.delete_stream(name)
    print(f"deleted stream {ns.name}/{name}")
    return 0


def cmd_delete_namespace(client: LedgerClient, args: argparse.Namespace) -> int:
    client.delete_namespace(args.namespace, force=args.force)
    print(f"deleted namespace {args.namespace}")
    return 0


def cmd_retention(client: LedgerClient, args: argparse.Namespace) -> int:
    ns, name = _ns(client, args.stream)
    print(f"deleted {ns.apply_retention(name)} segments")
    return 0


def cmd_gc(client: LedgerClient, args: argparse.Namespace) -> int:
    """Spark task ledgers of the stream that no segment refers to (a failed or replayed batch, a
    driver that died before its commit), older than --older-than-ms: deleted, one id per line.
    Found through the stream's task markers; --all-ledgers reads every ledger of the cluster
    (ledgers written before the markers, or by a task that died before marking its ledger)."""
    from ledger_client.stream.sink import collect_orphans

    ns, name = _ns(client, args.stream)
    doomed = collect_orphans(client, ns, name, args.older_than_ms, dry_run=args.dry_run, scan_all=args.all_ledgers)
    if args.json:
        print(json.dumps({"stream": f"{ns.name}/{name}", "dry_run": args.dry_run, "ledgers": doomed}))
    else:
        for lid in doomed:
            print(lid)
    return 0


# ---------------------------------------------------------------------- parser

def add_stream_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", default=zk_default(), help="ZooKeeper connect string (default $SPARK_BOOKIE_ZK)")
    sub = p.add_subparsers(dest="stream_command", required=True, metavar="CMD")

    def command(name: str, func: ShellFunc, help_text: str, admin: AdminRule = False) -> argparse.ArgumentParser:
        """`admin`: it deletes data, so a bookie confirms the caller's admin role first (see shell)."""
        c = sub.add_parser(name, help=help_text)
        c.add_argument("--json", action="store_true", help="structured output")
        c.set_defaults(shell_func=func, admin_required=admin)
        return c

    command("namespaces", cmd_namespaces, "list namespaces (--json: with their settings)")
    c = command("create-namespace", cmd_create_namespace, "create a namespace with its settings")
    c.add_argument("namespace")
    _add_setting_flags(c)
    c.add_argument("--tenant", default="public", metavar="T",
                   help="the tenant that owns it (default public); superusers and T's admin roles")
    c = command("update-namespace", cmd_update_namespace, "change a namespace's settings (for segments started "
                "afterwards; `none` lifts a limit)")
    c.add_argument("namespace")
    _add_setting_flags(c)
    c = command("grant", cmd_grant, "give ROLE actions on a namespace (replacing what it had; superusers "
                "and the tenant's admin roles)")
    c.add_argument("namespace", metavar="NS")
    c.add_argument("role", metavar="ROLE")
    c.add_argument("--actions", type=_actions, required=True, metavar="A,B", help="produce, consume or both")
    c = command("revoke", cmd_revoke, "take every action ROLE holds on a namespace")
    c.add_argument("namespace", metavar="NS")
    c.add_argument("role", metavar="ROLE")
    c = command("permissions", cmd_permissions, "the roles granted actions on a namespace")
    c.add_argument("namespace", metavar="NS")
    c = command("delete-namespace", cmd_delete_namespace, "delete a namespace (--force: and its streams)",
                admin=True)
    c.add_argument("namespace")
    c.add_argument("--force", action="store_true")
    c = command("usage", cmd_usage, "a namespace's bytes on bookies against its storage quota, per stream "
                "(segments in progress as their writers last published them)")
    c.add_argument("namespace")
    c = command("list", cmd_list, "streams of a namespace")
    c.add_argument("namespace")
    c.add_argument("--prefix", default="")
    for name, func, help_text, admin in (
            ("info", cmd_info, "segments, DLSN and txid ranges, counts, state (the segment in progress: what "
                                "its writer was acknowledged so far, read without disturbing it)", False),
            ("delete", cmd_delete, "delete a stream and its ledgers", True),
            ("retention", cmd_retention, "apply the namespace's retention now", True)):
        c = command(name, func, help_text, admin)
        c.add_argument("stream", type=_split, metavar="NS/S")
    c = command("write", cmd_write, "write one record per stdin line")
    c.add_argument("stream", type=_split, metavar="NS/S")
    c.add_argument("--lock-timeout-ms", type=int, default=30_000)
    c = command("tail", cmd_tail, "print records, following the stream (Ctrl-C stops)")
    c.add_argument("stream", type=_split, metavar="NS/S")
    c.add_argument("--from", dest="from_", metavar="DLSN|latest", help="start here (default: the first record)")
    c.add_argument("--from-txid", type=int, metavar="N", help="start at the first record with txid >= N")
    c.add_argument("-n", "--count", type=int, help="stop after N records")
    c.add_argument("--no-follow", action="store_true", help="stop when no record arrives for a second")
    c = command("gc", cmd_gc, "delete orphaned Spark task ledgers of a stream", admin=lambda a: not a.dry_run)
    c.add_argument("stream", type=_split, metavar="NS/S")
    c.add_argument("--older-than-ms", type=int, default=3_600_000, metavar="MS",
                   help="only ledgers at least this old (default: an hour; a running job's are younger)")
    c.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    c.add_argument("--all-ledgers", action="store_true",
                   help="read every ledger's metadata, not only the stream's marked task ledgers (slow on a "
                        "large cluster; finds task ledgers without a marker)")
    c = command("truncate", cmd_truncate, "drop every record before DLSN", admin=True)
    c.add_argument("stream", type=_split, metavar="NS/S")
    c.add_argument("dlsn", metavar="DLSN")
    c.add_argument("--lock-timeout-ms", type=int, default=30_000)
    add_subscription_commands(command, _split)


def run_stream(args: argparse.Namespace) -> int:
    return run_shell(args)
