"""`spark-bookie tenant CMD`: tenants from the command line (DESIGN §4.2, §4.9).

Built on the public client only, so the command line is refused exactly what the Python API is
refused (superusers make, change and delete tenants; a tenant's admin roles read it). Plain text,
one item per line; `--json` for structure. Every failure is one line on stderr and exit status 2;
a refusal names the role, the tenant and what was asked.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from spark_bookie.cli.common import zk_default
from spark_bookie.cli.shell import ShellFunc, run_shell

if TYPE_CHECKING:
    from ledger_client import LedgerClient

PROG = "spark-bookie tenant"


def role_list(text: str) -> list[str]:
    """``a,b`` -> ["a", "b"] (blanks dropped: ``""`` is no role at all); the names are checked by
    the client."""
    return [r.strip() for r in text.split(",") if r.strip()]


def cmd_create(client: LedgerClient, args: argparse.Namespace) -> int:
    client.create_tenant(args.tenant, admin_roles=args.admin_roles)
    roles = ", ".join(args.admin_roles) or "none: superusers only"
    print(f"created tenant {args.tenant} (admin roles: {roles})")
    return 0


def cmd_update(client: LedgerClient, args: argparse.Namespace) -> int:
    client.update_tenant(args.tenant, admin_roles=args.admin_roles)
    print(f"tenant {args.tenant}: admin roles now {', '.join(args.admin_roles) or 'none (superusers only)'}")
    return 0


def cmd_list(client: LedgerClient, args: argparse.Namespace) -> int:
    names = client.list_tenants()
    if args.json:
        print(json.dumps(names))
    elif names:
        print("\n".join(names))
    return 0


def cmd_info(client: LedgerClient, args: argparse.Namespace) -> int:
    info = client.tenant_info(args.tenant)
    if args.json:
        print(json.dumps({"name": info.name, "admin_roles": info.admin_roles, "namespaces": info.namespaces}))
        return 0
    print(f"tenant: {info.name}")
    print(f"admin_roles: {', '.join(info.admin_roles)}")
    print(f"namespaces: {', '.join(info.namespaces)}")
    return 0


def cmd_delete(client: LedgerClient, args: argparse.Namespace) -> int:
    client.delete_tenant(args.tenant)
    print(f"deleted tenant {args.tenant}")
    return 0


def add_tenant_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", default=zk_default(), help="ZooKeeper connect string (default $SPARK_BOOKIE_ZK)")
    sub = p.add_subparsers(dest="tenant_command", required=True, metavar="CMD")

    def command(name: str, func: ShellFunc, help_text: str, json_flag: bool = False) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text)
        if json_flag:
            c.add_argument("--json", action="store_true", help="structured output")
        c.set_defaults(shell_func=func, admin_required=False, shell_prog=PROG)
        return c

    c = command("create", cmd_create, "create a tenant (superusers)")
    c.add_argument("tenant")
    c.add_argument("--admin-roles", type=role_list, default=[], metavar="A,B",
                   help="the roles that manage its namespaces and their grants (default: none)")
    c = command("update", cmd_update, "replace a tenant's admin roles (superusers)")
    c.add_argument("tenant")
    c.add_argument("--admin-roles", type=role_list, required=True, metavar="A,B",
                   help='the new admin roles ("" for none)')
    command("list", cmd_list, "tenant names", json_flag=True)
    c = command("info", cmd_info, "a tenant's admin roles and namespaces (superusers, its admins)", json_flag=True)
    c.add_argument("tenant")
    c = command("delete", cmd_delete, "delete a tenant that owns no namespace (superusers)")
    c.add_argument("tenant")


def run_tenant(args: argparse.Namespace) -> int:
    return run_shell(args)
