"""ZooKeeper digest ACLs (DESIGN §4.8): with ``zk_auth = "user:password"`` every node the project
creates under the root, the root included, carries one ACL entry granting that identity every
permission and nobody else anything, so a ZooKeeper client without the credentials can neither
read nor change the cluster's metadata.

Why digest and not SASL: it needs nothing but the ZooKeeper server as shipped (the embedded one
included), and kazoo computes the digest itself. The password is sent to ZooKeeper as it is, so a
secured cluster's ZooKeeper serves only its TLS client port (``zk_tls``, :mod:`metadata.tls`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.security import ACL, make_digest_acl

from metadata.errors import InvalidConnectStringError

AUTH_SCHEME = "digest"


def parse_zk_auth(zk_auth: str) -> tuple[str, str]:
    """``user:password`` -> (user, password); a clear error for anything else (the password may
    itself contain ``:``)."""
    if not isinstance(zk_auth, str):
        raise InvalidConnectStringError(f"zk_auth must be 'user:password', not {type(zk_auth).__name__}")
    user, sep, password = zk_auth.partition(":")
    if not sep or not user or not password:
        raise InvalidConnectStringError("zk_auth must be 'user:password' with both parts non-empty")
    return user, password


def client_options(zk_auth: str | None, member_auth: str | None = None) -> dict[str, Any]:
    """KazooClient keyword arguments: the credentials added to the session, and the ACL every
    node it creates gets (kazoo applies ``default_acl`` to creates, parents and multi-ops alike;
    with the tenant scheme on, metadata.zk.tenant_acl gives each create its own). ``member_auth``:
    the members' credentials, added beside a role's own (metadata.zk.tenant_acl)."""
    if zk_auth is None:
        return {}
    user, password = parse_zk_auth(zk_auth)
    auth = [(AUTH_SCHEME, zk_auth)]
    if member_auth is not None:
        parse_zk_auth(member_auth)
        auth.append((AUTH_SCHEME, member_auth))
    return {"auth_data": auth, "default_acl": [make_digest_acl(user, password, all=True)]}


def secured_acl(zk_auth: str) -> list[ACL]:
    user, password = parse_zk_auth(zk_auth)
    return [make_digest_acl(user, password, all=True)]


def walk(children: Callable[[str], list[str]], root: str) -> list[str]:
    """Every path at and under ``root``, parents before their children (ACLs are set top down,
    so a concurrent creator under a secured parent already inherits nothing open)."""
    out, stack = [], [root]
    while stack:
        path = stack.pop()
        out.append(path)
        stack.extend(f"{path.rstrip('/')}/{c}" for c in sorted(children(path), reverse=True))
    return out
