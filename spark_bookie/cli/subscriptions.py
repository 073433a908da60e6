"""`spark-bookie stream subscriptions|reset-subscription|delete-subscription`: a stream's
subscriptions (DESIGN §4.11) from the command line, registered by spark_bookie.cli.stream.

    spark-bookie stream subscriptions payments/orders [--json]     # position, backlog, last update
    spark-bookie stream reset-subscription payments/orders billing 3/0/0   # admin role; or earliest|latest
    spark-bookie stream delete-subscription payments/orders billing        # admin role

A position is the last record the subscription consumed (its readers resume after it), written as
a DLSN ``segment/entry/slot`` as everywhere else (`stream truncate`, `stream tail --from`). Reset
and delete change what a consumer relies on, so they take the admin role as the other
destructive stream commands do.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_bookie.cli.shell import AdminRule, ShellFunc

if TYPE_CHECKING:
    from ledger_client import LedgerClient, SubscriptionInfo

# add_stream_parser's `command(name, func, help, admin)`; the NS/S argument type of stream commands
RESET_WORDS = ("earliest", "latest")   # before the first record kept / at the last record written

Command = Callable[[str, ShellFunc, str, AdminRule], argparse.ArgumentParser]
StreamArg = Callable[[str], tuple[str, str]]


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def subscription_json(info: SubscriptionInfo) -> dict[str, Any]:
    return {"position": str(info.position), "backlog_records": info.backlog_records,
            "backlog_bytes": info.backlog_bytes, "updated_ms": info.updated_ms}


def cmd_subscriptions(client: LedgerClient, args: argparse.Namespace) -> int:
    """One line per subscription, by name: ``NAME position P backlog N records B bytes updated T``."""
    ns_name, stream = args.stream
    subs = client.namespace(ns_name).subscriptions(stream)
    if args.json:
        print(json.dumps({"stream": f"{ns_name}/{stream}",
                          "subscriptions": {n: subscription_json(s) for n, s in sorted(subs.items())}}))
        return 0
    for name, s in sorted(subs.items()):
        print(f"{name}\tposition {s.position}\tbacklog {s.backlog_records} records {s.backlog_bytes} bytes"
              f"\tupdated {_when(s.updated_ms)}")
    return 0


def cmd_reset_subscription(client: LedgerClient, args: argparse.Namespace) -> int:
    from ledger_client import DLSN

    ns_name, stream = args.stream
    word = args.dlsn.strip().lower()
    point = word if word in RESET_WORDS else DLSN.parse(args.dlsn)
    ns = client.namespace(ns_name)
    ns.reset_subscription(stream, args.subscription, point)
    where = ns.subscriptions(stream)[args.subscription].position if isinstance(point, str) else point
    print(f"subscription {args.subscription} of {ns_name}/{stream} reset to {where}")
    return 0


def cmd_delete_subscription(client: LedgerClient, args: argparse.Namespace) -> int:
    ns_name, stream = args.stream
    client.namespace(ns_name).delete_subscription(stream, args.subscription)
    print(f"deleted subscription {args.subscription} of {ns_name}/{stream}")
    return 0


def add_subscription_commands(command: Command, stream_arg: StreamArg) -> None:
    c = command("subscriptions", cmd_subscriptions, "a stream's subscriptions: position (the last record "
                "consumed), backlog in records and bytes, last update", False)
    c.add_argument("stream", type=stream_arg, metavar="NS/S")
    c = command("reset-subscription", cmd_reset_subscription, "move a subscription to DLSN (its readers resume "
                "after it; backwards too)", True)
    c.add_argument("stream", type=stream_arg, metavar="NS/S")
    c.add_argument("subscription", metavar="NAME")
    c.add_argument("dlsn", metavar="DLSN|earliest|latest",
                   help="the last record to count as consumed (segment/entry/slot), or earliest or latest")
    c = command("delete-subscription", cmd_delete_subscription, "delete a subscription (it no longer holds "
                "back retention)", True)
    c.add_argument("stream", type=stream_arg, metavar="NS/S")
    c.add_argument("subscription", metavar="NAME")
