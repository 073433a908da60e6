"""Shell commands over the re-replication queue and the auditor election (BookKeeper's
``listunderreplicated``, ``whoisauditor``, ``autorecovery -enable/-disable`` and
``lostbookierecoverydelay``). They read and write the metadata store directly: there is nothing
of it in the client's public API, and nothing a bookie needs to be up for. ``checkledger`` asks
the bookies (the auditor's replicas check for one ledger, now).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger_client import LedgerClient

AddCommand = Callable[..., argparse.ArgumentParser]


def cmd_listunderreplicated(client: LedgerClient, args: argparse.Namespace) -> int:
    """Ledger ids one per line; ``--json``: ``{"<ledger id>": [missing bookie ids]}``."""
    queued = client.store.underreplication.list_underreplicated()
    if args.json:
        print(json.dumps({str(lid): missing for lid, missing in queued.items()}))
    else:
        for lid in queued:
            print(lid)
    return 0


def cmd_whoisauditor(client: LedgerClient, args: argparse.Namespace) -> int:
    print(client.store.underreplication.current_auditor() or "no auditor")
    return 0


def cmd_autorecovery(client: LedgerClient, args: argparse.Namespace) -> int:
    """Switch re-replication on or off cluster-wide; prints the state (after the change)."""
    if args.enable or args.disable:
        client.store.underreplication.set_replication_enabled(bool(args.enable))
    print("enabled" if client.store.underreplication.is_replication_enabled() else "disabled")
    return 0


def cmd_lostbookierecoverydelay(client: LedgerClient, args: argparse.Namespace) -> int:
    """Print (after ``--set``: set, then print) the seconds the auditor waits before it marks a
    lost bookie's ledgers; the running auditor picks a change up at once."""
    if args.set is not None:
        client.store.underreplication.set_lost_bookie_recovery_delay_s(args.set)
    print(client.store.underreplication.lost_bookie_recovery_delay_s())
    return 0


def cmd_checkledger(client: LedgerClient, args: argparse.Namespace) -> int:
    """Ask every bookie of each finished fragment which entries of its share it holds (ids only,
    as the auditor's replicas check does); print one line per fragment and bookie. Exit 0 when
    every copy is there, 1 when a bookie lacks entries or did not answer. An open ledger's last
    fragment is its writer's and is not checked. ``--mark``: queue the ledger for the replication
    workers with the bookies that lack entries."""
    from recovery.checker import FragmentChecker
    from recovery.plan import checkable_fragments, positions_entries

    md = client.ledger_metadata(args.ledger_id)
    checker = FragmentChecker(client.pool, sample_fraction=0.0, reads_in_flight_max=1,
                              timeout_s=client.config.read_timeout_ms / 1000)
    rows: list[dict[str, Any]] = []
    short: set[str] = set()
    for first, last, bookies in checkable_fragments(md):
        for pos, bookie in enumerate(bookies):
            lacking = checker.lacking_entries(md, first, last, pos, bookie)
            share = sum(1 for _ in positions_entries(md, first, last, pos))
            rows.append({"fragment": first, "last_entry_id": last, "bookie": bookie, "entries": share,
                         "lacking": lacking})
            if lacking:
                short.add(bookie)
    if args.mark and short:
        client.store.underreplication.mark_underreplicated(md.ledger_id, sorted(short))
    if args.json:
        print(json.dumps({"ledger_id": md.ledger_id, "fragments": rows, "marked": sorted(short) if args.mark else []}))
    for r in rows if not args.json else ():
        print(f"fragment {r['fragment']}..{r['last_entry_id']} {r['bookie']}: {_said(r['lacking'], r['entries'])}")
    if args.mark and short and not args.json:
        print(f"marked under-replicated for {', '.join(sorted(short))}")
    if not md.is_closed and not args.json:   # its writer's: entries may still be on their way
        print(f"fragment {max(md.ensembles)}.. (open, the writer's): not checked")
    return 0 if all(r["lacking"] == [] for r in rows) else 1


def _said(lacking: list[int] | None, entries: int) -> str:
    if lacking is None:
        return "no answer (or a copy it holds failed its digest)"
    return f"lacks {len(lacking)} of {entries}: {_ranges(lacking)}" if lacking else f"holds all {entries}"


def _ranges(ids: list[int]) -> str:
    """Entry ids as runs: [1, 2, 3, 7] -> "1..3, 7"."""
    runs: list[list[int]] = []
    for e in ids:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs)


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seconds must not be negative: {text}")
    return value


def add_underreplication_commands(sub: Any, command: AddCommand) -> None:
    """Register the commands with the shell's ``_command(sub, name, func, help, json_flag=, admin=)``."""
    command(sub, "listunderreplicated", cmd_listunderreplicated,
            "list the ledgers waiting for re-replication", json_flag=True)
    command(sub, "whoisauditor", cmd_whoisauditor, "print the id of the current auditor")
    c = command(sub, "autorecovery", cmd_autorecovery,
                "enable or disable re-replication cluster-wide (no flag: print the state)",
                admin=lambda a: a.enable or a.disable)
    switch = c.add_mutually_exclusive_group()
    switch.add_argument("--enable", action="store_true", help="let replication workers take ledgers")
    switch.add_argument("--disable", action="store_true", help="stop workers from taking ledgers")
    c = command(sub, "checkledger", cmd_checkledger,
                "ask each bookie of a ledger which entries of its share it holds (exit 1 when one lacks any)",
                json_flag=True, admin=lambda a: a.mark)
    c.add_argument("ledger_id", type=int)
    c.add_argument("--mark", action="store_true", help="queue the ledger for re-replication of what is lacking")
    c = command(sub, "lostbookierecoverydelay", cmd_lostbookierecoverydelay,
                "print (or --set) the seconds the auditor waits before re-replicating a lost bookie",
                admin=lambda a: a.set is not None)
    c.add_argument("--set", type=_seconds, default=None, metavar="SECONDS")
