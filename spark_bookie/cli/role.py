"""`spark-bookie role create NAME --out PATH`: a client config for a role (DESIGN §4.9).

It signs a token for NAME (its ``sub``) with the cluster's token key and writes a ``[client]`` TOML
(0600) holding it and the connection settings of the caller's own client config (spark_bookie.local
.roles says which). Who may: superusers; with ``--tenant T``, also T's admin roles, for a NAME that
no other tenant names (as an admin role or in a grant); a service token (``--role-claim service``,
which passes every check) only superusers. Checked with the caller's own client config
(``--client-conf``), as the Python API checks it.

The key: ``--token-secret PATH`` (the bookies' HS256 ``auth_token_secret_path``; default
``$SPARK_BOOKIE_TOKEN_SECRET``, e.g. a secured sandbox's ``.sandbox/secure/token-secret``) or
``--token-private-key PATH`` (RS256, the private half of the bookies' public key).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from spark_bookie.cli.common import zk_default
from spark_bookie.cli.shell import run_shell

if TYPE_CHECKING:
    from ledger_client import LedgerClient

PROG = "spark-bookie role"
DAY_S = 86_400.0


def _authorize(client: LedgerClient, args: argparse.Namespace) -> None:
    """UnauthorizedAccessError naming the caller's role unless it may create this role."""
    from ledger_client import errors
    from ledger_client.stream.tenants import require_superuser, require_tenant_admin
    from metadata.tenancy import SERVICE_ROLE, SUPERUSER_ROLE
    from spark_bookie.local.roles import foreign_role_refusal

    name, tenant = args.name, args.tenant
    if tenant is not None:
        require_tenant_admin(client, tenant, f"create role {name!r} for tenant {tenant!r}")
    else:
        require_superuser(client, f"create role {name!r} (with --tenant T, the admin roles of T may)")
    if args.role_claim == SERVICE_ROLE:
        require_superuser(client, f"create role {name!r} with the service claim")
    caller = client.caller
    if caller is not None and caller.role_claim != SUPERUSER_ROLE:
        why = foreign_role_refusal(client.store, name, tenant)
        if why is not None:
            raise errors.UnauthorizedAccessError(f"role {caller.subject!r} may not create role {name!r}: {why}; "
                                                 f"only superusers may")


def cmd_create(client: LedgerClient, args: argparse.Namespace) -> int:
    from ledger_client.stream.meta import check_names
    from spark_bookie.cli.common import client_config
    from spark_bookie.errors import ShellError
    from spark_bookie.local.roles import (
        ENV_TOKEN_SECRET,
        RoleConfigError,
        TokenKey,
        mint_role_token,
        register_zk_identity,
        write_role_config,
    )

    try:
        if args.tenant is not None:
            check_names((args.tenant, "tenant"))
        secret = args.token_secret or (None if args.token_private_key else os.environ.get(ENV_TOKEN_SECRET))
        key = TokenKey.from_files(secret, args.token_private_key)
        ttl_s = args.ttl_days * DAY_S
        token = mint_role_token(key, args.name, args.role_claim, ttl_s)   # checks the name, claim and lifetime
        _authorize(client, args)   # before anything is written
        base = client_config(args.client_conf) if args.client_conf else None   # as written, no overrides
        cert, key_path = (os.path.abspath(p) if p else None for p in (args.tls_cert, args.tls_key))
        if Path(args.out).exists() and not args.force:   # before a ZooKeeper identity is registered for nothing
            raise RoleConfigError(f"{args.out} exists; --force replaces it")
        zk_auth = register_zk_identity(client.store, args.name, base)
        path = write_role_config(args.out, base, token, force=args.force, tls_cert_path=cert, tls_key_path=key_path,
                                 zk_auth=zk_auth)
    except RoleConfigError as e:
        raise ShellError(str(e)) from e
    until = datetime.fromtimestamp(time.time() + ttl_s, tz=UTC).isoformat(timespec="seconds")
    print(f"wrote {path}: role {args.name} ({args.role_claim} token, valid until {until})")
    if base is not None and base.tls_cert_path and not args.tls_cert:
        print(f"{PROG}: note: your config presents a client certificate; if the cluster requires one (mTLS), "
              "give the role its own with --tls-cert/--tls-key", file=sys.stderr)
    return 0


def add_role_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", default=zk_default(), help="ZooKeeper connect string (default $SPARK_BOOKIE_ZK)")
    sub = p.add_subparsers(dest="role_command", required=True, metavar="CMD")
    c = sub.add_parser("create", help="write a client config (token and connection settings) for a role",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("name", metavar="NAME", help="the role: the token's sub, as grants and tenants name it")
    c.add_argument("--out", required=True, metavar="PATH", help="the [client] TOML to write (mode 0600)")
    c.add_argument("--tenant", metavar="T", help="create it as an admin of tenant T (else: superusers only)")
    c.add_argument("--ttl-days", type=float, default=30.0, metavar="N", help="token lifetime (default 30 days)")
    c.add_argument("--role-claim", choices=("client", "service"), default="client",
                   help="the token's role claim (service: the cluster's own identity; superusers only)")
    c.add_argument("--token-secret", metavar="PATH",
                   help="the cluster's HS256 token secret file (default $SPARK_BOOKIE_TOKEN_SECRET)")
    c.add_argument("--token-private-key", metavar="PATH", help="or its RS256 private key (PEM)")
    c.add_argument("--tls-cert", metavar="PATH", help="the role's client certificate (mTLS), with --tls-key "
                   "(written as absolute paths)")
    c.add_argument("--tls-key", metavar="PATH")
    c.add_argument("--force", action="store_true", help="replace PATH if it exists")
    c.set_defaults(shell_func=cmd_create, admin_required=False, shell_prog=PROG)


def run_role(args: argparse.Namespace) -> int:
    return run_shell(args)
