"""`spark-bookie shell CMD`: inspect and exercise a cluster from the command line (DESIGN §4.2).

BookKeeper's `bookkeeper shell` equivalents, built only on the public client (`ledger_client`) so
the shell sees exactly what an application would. Output is plain text, one item per line, so it
pipes into grep/awk; `--json` gives the structure where there is some. Every failure is a typed
`ledger_client.errors.LedgerError`, reported as one line on stderr with exit status 2 (argparse's
own convention for bad arguments), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_bookie.errors import ShellError

if TYPE_CHECKING:
    from ledger_client import LedgerClient, LedgerEntry, LedgerMetadata

PROG = "spark-bookie shell"
# Short enough that an unreachable ZooKeeper fails the command well within ~10 s.
ZK_CONNECT_TIMEOUT_MS = 5_000
ZK_SESSION_TIMEOUT_MS = 10_000
READ_CHUNK_ENTRIES = 1_000   # readledger streams its output in chunks this size, not all at once

ShellFunc = Callable[["LedgerClient", argparse.Namespace], int]


# ---------------------------------------------------------------------- formatting helpers

def render_bytes(data: bytes) -> tuple[str, str]:
    """(encoding, text): UTF-8 when it decodes to printable text, else hex.

    Printable only, so a payload holding a tab or newline cannot break the one-line-per-entry
    format; such payloads come out as hex instead.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "hex", data.hex()
    if text.isprintable():
        return "utf-8", text
    return "hex", data.hex()


def _emit_json(obj: object) -> None:
    print(json.dumps(obj, sort_keys=False))


def _ms_to_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def metadata_to_dict(md: LedgerMetadata) -> dict[str, Any]:
    """The JSON form of a ledger's metadata (fragment keys become strings, as JSON requires)."""
    custom = {}
    for k, v in md.custom_metadata.items():
        enc, text = render_bytes(v)
        custom[k] = {"encoding": enc, "value": text}
    return {
        "ledger_id": md.ledger_id,
        "state": md.state.value,
        "ensemble_size": md.ensemble_size,
        "write_quorum_size": md.write_quorum_size,
        "ack_quorum_size": md.ack_quorum_size,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": md.digest_type.value,
        "ctime": md.ctime,
        "custom_metadata": custom,
        "ensembles": {str(k): list(md.ensembles[k]) for k in sorted(md.ensembles)},
    }


def metadata_lines(md: LedgerMetadata) -> Iterator[str]:
    """The text form: `key: value` lines, then one `first_entry: [bookies]` line per fragment."""
    yield f"ledger_id: {md.ledger_id}"
    yield f"state: {md.state.value}"
    yield f"ensemble_size: {md.ensemble_size}"
    yield f"write_quorum_size: {md.write_quorum_size}"
    yield f"ack_quorum_size: {md.ack_quorum_size}"
    yield f"last_entry_id: {md.last_entry_id}"
    yield f"length: {md.length}"
    yield f"digest_type: {md.digest_type.value}"
    yield f"ctime: {md.ctime} ({_ms_to_iso(md.ctime)})"
    yield "custom_metadata:" + ("" if md.custom_metadata else " {}")
    for k, v in sorted(md.custom_metadata.items()):
        enc, text = render_bytes(v)
        yield f"  {k}: {text}" if enc == "utf-8" else f"  {k}: hex:{text}"
    yield "ensembles:"
    for first in sorted(md.ensembles):
        yield f"  {first}: [{', '.join(md.ensembles[first])}]"


# ---------------------------------------------------------------------- commands

def cmd_listbookies(client: LedgerClient, args: argparse.Namespace) -> int:
    """Writable bookies by default (those that take new ledgers), `--readonly` for the others."""
    state = "readonly" if args.readonly else "writable"
    ids = sorted(client.registry.readonly_ids() if args.readonly else client.registry.writable_ids())
    if args.json:
        _emit_json([{"bookie_id": b, "state": state} for b in ids])
    else:
        for b in ids:
            print(b)
    return 0


def cmd_listledgers(client: LedgerClient, args: argparse.Namespace) -> int:
    for lid in sorted(client.list_ledgers()):
        print(lid)
    return 0


def cmd_ledgermetadata(client: LedgerClient, args: argparse.Namespace) -> int:
    md = client.ledger_metadata(args.ledger_id)
    if args.json:
        _emit_json(metadata_to_dict(md))
    else:
        for line in metadata_lines(md):
            print(line)
    return 0


def _print_entry(entry: LedgerEntry, as_json: bool) -> None:
    enc, text = render_bytes(entry.data)
    if as_json:
        _emit_json({"entry_id": entry.entry_id, "length": len(entry.data), "encoding": enc,
                    "payload": text})
    else:
        print(f"{entry.entry_id}\t{text}")


def cmd_readledger(client: LedgerClient, args: argparse.Namespace) -> int:
    """Entries --from..--to, capped at what is safe to read: the LAC, or the end of a closed ledger.

    Without `--recover` the ledger is not fenced, so reading never disturbs a live writer (the
    price: entries past the LAC the reader learnt stay invisible).
    """
    from ledger_client import errors

    if args.first < 0 or (args.last is not None and args.last < args.first):
        raise errors.IncorrectParameterError(f"bad entry range --from {args.first} --to {args.last}")
    r = client.open_ledger(args.ledger_id, password=args.password.encode("utf-8"), recovery=args.recover)
    end = r.last_add_confirmed if args.last is None else min(args.last, r.last_add_confirmed)
    first = args.first
    while first <= end:
        last = min(end, first + READ_CHUNK_ENTRIES - 1)
        for entry in r.read(first, last):
            _print_entry(entry, args.json)
        sys.stdout.flush()
        first = last + 1
    return 0


def cmd_deleteledger(client: LedgerClient, args: argparse.Namespace) -> int:
    """Deletes after checking the ledger exists: the client's delete is idempotent, but an
    operator naming a ledger that is not there has probably mistyped the id."""
    client.ledger_metadata(args.ledger_id)
    client.delete_ledger(args.ledger_id)
    print(f"deleted ledger {args.ledger_id}")
    return 0


def _payload(i: int, base: bytes) -> bytes:
    """Entry i's bytes: its index then a shared random block, so every entry differs yet the
    expected bytes can be rebuilt at verification without keeping N payloads in memory."""
    return (i.to_bytes(8, "big") + base)[:len(base)]


def _write_entries(client: LedgerClient, args: argparse.Namespace, base: bytes) -> tuple[int, float]:
    """Create, fill (pipelined appends) and close a ledger; returns (ledger id, seconds)."""
    from ledger_client import errors

    w = client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"")
    t0 = time.monotonic()
    with w:
        futures = [w.append_async(_payload(i, base)) for i in range(args.entries)]
        for i, fut in enumerate(futures):
            eid = fut.result(timeout=client.config.operation_timeout_ms / 1000)
            if eid != i:
                raise errors.WriteError(f"simpletest: append {i} got entry id {eid}")
    return w.ledger_id, time.monotonic() - t0


def _verify_entries(client: LedgerClient, lid: int, args: argparse.Namespace, base: bytes) -> float:
    """Read every entry back from the closed ledger and compare bytes; returns seconds taken."""
    t0 = time.monotonic()
    r = client.open_ledger(lid, password=b"", recovery=False)
    if r.last_add_confirmed != args.entries - 1:
        raise ShellError(f"simpletest: ledger {lid} ends at entry {r.last_add_confirmed}, "
                         f"expected {args.entries - 1}")
    first = 0
    while first < args.entries:
        last = min(args.entries - 1, first + READ_CHUNK_ENTRIES - 1)
        for entry in r.read(first, last):
            if entry.entry_id != first or entry.data != _payload(first, base):
                raise ShellError(f"simpletest: ledger {lid} entry {entry.entry_id} read back wrong "
                                 f"(expected entry {first}); the ledger is kept for inspection")
            first += 1
    return time.monotonic() - t0


def cmd_simpletest(client: LedgerClient, args: argparse.Namespace) -> int:
    """BookKeeper's simpletest: write N entries to a fresh ledger, read them back byte for byte,
    delete it. Exit 0 means the cluster can take and serve writes at this E/Qw/Qa."""
    from ledger_client import errors

    if args.entries < 1 or args.entry_size < 1:
        raise errors.IncorrectParameterError("--entries and --entry-size must be at least 1")
    base = os.urandom(args.entry_size)
    lid, write_s = _write_entries(client, args, base)
    read_s = _verify_entries(client, lid, args, base)
    client.delete_ledger(lid)
    write_rate = args.entries / max(write_s, 1e-9)
    read_rate = args.entries / max(read_s, 1e-9)
    if args.json:
        _emit_json({"ledger_id": lid, "entries": args.entries, "entry_size": args.entry_size,
                    "ensemble_size": args.ensemble, "write_quorum_size": args.write_quorum,
                    "ack_quorum_size": args.ack_quorum, "write_seconds": round(write_s, 6),
                    "write_entries_per_s": round(write_rate, 1), "read_seconds": round(read_s, 6),
                    "read_entries_per_s": round(read_rate, 1), "verified": True, "deleted": True})
    else:
        print(f"simpletest: ledger {lid}: wrote {args.entries} entries of {args.entry_size} B "
              f"(E={args.ensemble} Qw={args.write_quorum} Qa={args.ack_quorum}) at {write_rate:.0f} "
              f"entries/s, read back and verified at {read_rate:.0f} entries/s, deleted")
    return 0


# ---------------------------------------------------------------------- parser and dispatch

def _ledger_id(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"ledger id must not be negative: {text}")
    return value


AdminRule = bool | Callable[[argparse.Namespace], bool]


def _command(sub: Any, name: str, func: ShellFunc, help_text: str, *, json_flag: bool = False,
             admin: AdminRule = False) -> argparse.ArgumentParser:
    """One shell command's parser. `--zk` is accepted here too (SUPPRESS, so an absent flag does
    not overwrite one given before the command name). `admin`: the command deletes or changes
    what others rely on, so a bookie must confirm the caller's admin role first (a predicate of
    the arguments when only some uses change things)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--zk", default=argparse.SUPPRESS, help="ZooKeeper connect string")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(shell_func=func, json=False, admin_required=admin)
    return p


def needs_admin(args: argparse.Namespace) -> bool:
    rule: AdminRule = getattr(args, "admin_required", False)
    return rule(args) if callable(rule) else bool(rule)


def add_shell_parser(p: argparse.ArgumentParser, zk_default: str) -> None:
    """Wire the shell's commands under `p` (the `shell` subparser of `spark-bookie`)."""
    p.add_argument("--zk", default=zk_default,
                   help=f"ZooKeeper connect string host:port[,host:port][/root] (default {zk_default})")
    sub = p.add_subparsers(dest="shell_command", required=True, metavar="CMD")

    c = _command(sub, "listbookies", cmd_listbookies, "list the writable (or --readonly) bookies",
                 json_flag=True)
    c.add_argument("--readonly", action="store_true", help="list the read-only bookies instead")
    _command(sub, "listledgers", cmd_listledgers, "list the ids of all ledgers")
    c = _command(sub, "ledgermetadata", cmd_ledgermetadata, "show one ledger's metadata", json_flag=True)
    c.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    c = _command(sub, "readledger", cmd_readledger, "print a ledger's entries (up to its LAC)",
                 json_flag=True, admin=lambda a: a.recover)
    c.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    c.add_argument("--from", dest="first", type=int, default=0, metavar="A", help="first entry (default 0)")
    c.add_argument("--to", dest="last", type=int, default=None, metavar="B",
                   help="last entry, inclusive (default: the LAC, or the last entry of a closed ledger)")
    c.add_argument("--password", default="", help="the ledger's password (default empty)")
    c.add_argument("--recover", action="store_true",
                   help="fence and recover (close) the ledger first; stops a live writer")
    c = _command(sub, "simpletest", cmd_simpletest, "write, read back, verify and delete a test ledger",
                 json_flag=True)
    c.add_argument("--ensemble", type=int, default=3, metavar="E")
    c.add_argument("--write-quorum", type=int, default=2, metavar="Qw")
    c.add_argument("--ack-quorum", type=int, default=2, metavar="Qa")
    c.add_argument("--entries", type=int, default=1000, metavar="N")
    c.add_argument("--entry-size", type=int, default=1024, metavar="BYTES")
    c = _command(sub, "deleteledger", cmd_deleteledger, "delete one ledger", admin=True)
    c.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    from spark_bookie.cli.autorecovery import add_drain_arguments, cmd_decommission, cmd_recover

    c = _command(sub, "recover", cmd_recover, "re-replicate a dead bookie's ledgers now and wait",
                 json_flag=True, admin=True)
    add_drain_arguments(c, force=True)
    c = _command(sub, "decommission", cmd_decommission,
                 "move every ledger off a bookie, then delete its cookie", json_flag=True, admin=True)
    add_drain_arguments(c, force=False)
    c = _command(sub, "secure-metadata", cmd_secure_metadata,
                 "put the --client-conf's zk_auth digest ACL on the root and every node under it")
    c.add_argument("--tenants", action="store_true",
                   help="then keep tenants apart in ZooKeeper too: per-role ACLs, with the members' "
                        "credentials of the --client-conf's zk_member_auth (docs/security.md)")
    c = _command(sub, "migrate-tenants", cmd_migrate_tenants,
                 "put a cluster from before tenants under them: namespaces into tenant public, segment "
                 "ledgers stamped with their namespace (superusers)", json_flag=True, admin=True)
    c.add_argument("--legacy-owner", metavar="ROLE", default=None,
                   help="the role that owns the ledgers outside namespaces that name no creator "
                        "(default: none, superusers only)")
    from spark_bookie.cli.shell_underreplication import add_underreplication_commands

    add_underreplication_commands(sub, _command)


def cmd_secure_metadata(client: LedgerClient, args: argparse.Namespace) -> int:
    """Move an open cluster to a secured one (docs/security.md): every process must then use the
    same zk_auth, or it can read nothing."""
    if not client.config.zk_auth:
        raise ShellError("secure-metadata needs zk_auth in the client config (--client-conf or "
                         "$SPARK_BOOKIE_CLIENT_CONF): the credentials to grant")
    print(f"secured {client.store.cluster.secure_tree()} znodes under {args.zk}")
    if args.tenants:
        if not client.config.zk_member_auth:
            raise ShellError("secure-metadata --tenants needs zk_member_auth in the client config: the members' "
                             "credentials every role's config will carry")
        print(f"per-tenant ACLs on {client.store.tenants.enable_zk_acls(client.config.zk_member_auth)} znodes")
    return 0


def cmd_migrate_tenants(client: LedgerClient, args: argparse.Namespace) -> int:
    """DESIGN §4.9's migration: no record moves, only the metadata learns whose data it is."""
    from ledger_client.stream.tenants import migrate_to_tenants

    done = migrate_to_tenants(client, args.legacy_owner)
    if args.json:
        print(json.dumps(done))
    else:
        print(f"namespaces moved into tenant public: {done['namespaces']}; segment ledgers stamped: "
              f"{done['segment_ledgers']}; legacy ledgers given to {args.legacy_owner}: {done['legacy_ledgers']}")
    return 0


def _fail(message: str, prog: str = PROG) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def run_shell(args: argparse.Namespace) -> int:
    """Connect, run the chosen command, and turn every typed error into exit status 2 (the one
    line starts with the command group's ``shell_prog``, `spark-bookie shell` unless it says)."""
    from ledger_client import LedgerClient, errors
    from metadata import MetadataError
    from spark_bookie.cli.common import client_config

    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(logging.WARNING)  # client INFO chatter is not shell output
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # its retries repeat our one error
    func: ShellFunc = args.shell_func
    try:
        config = client_config(getattr(args, "client_conf", None), zk_connect_timeout_ms=ZK_CONNECT_TIMEOUT_MS,
                               zk_session_timeout_ms=ZK_SESSION_TIMEOUT_MS)
        with LedgerClient(args.zk, config=config) as client:
            if needs_admin(args):
                client.confirm_admin()
            return func(client, args)
    except (errors.LedgerError, MetadataError, ShellError, TimeoutError) as e:
        return _fail(str(e) or type(e).__name__, getattr(args, "shell_prog", PROG))
    except BrokenPipeError:
        # The reader went away (`readledger ... | head`): not an error; keep Python's exit-time
        # flush from raising again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
