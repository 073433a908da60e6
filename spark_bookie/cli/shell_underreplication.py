"""Shell commands over the re-replication queue and the auditor election (BookKeeper's
``listunderreplicated``, ``whoisauditor``, ``autorecovery -enable/-disable`` and
``lostbookierecoverydelay``). They read and write the metadata store directly: there is nothing
of it in the client's public API, and nothing a bookie needs to be up for.
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
    c = command(sub, "lostbookierecoverydelay", cmd_lostbookierecoverydelay,
                "print (or --set) the seconds the auditor waits before re-replicating a lost bookie",
                admin=lambda a: a.set is not None)
    c.add_argument("--set", type=_seconds, default=None, metavar="SECONDS")
