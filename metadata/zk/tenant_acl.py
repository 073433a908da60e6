"""ZooKeeper ACLs per tenant (DESIGN §4.9): a role reads and changes only the znodes of the
namespaces it holds a grant on, and of its own ledgers.

Why per-role digest identities (and not x509 names over ZooKeeper's TLS port): a digest identity
needs nothing but the ZooKeeper server as shipped, an ACL entry can be computed by anyone who knows
the role's public digest (``role:base64(sha1(role:password))``, kept in ``<root>/roles/<role>``),
and the password never crosses the network in clear because a secured cluster's ZooKeeper serves
only its TLS port. ZooKeeper ACLs are per node, not inherited, so every creator computes the ACL of
what it creates from the path and the data (this module), and a grant or revoke re-applies them to
the namespace's nodes and its ledgers' metadata (:meth:`ZkNodes.apply_tenant_acls`).

Identities: the cluster's superuser (``zk_auth`` of bookies, autorecovery and superuser clients;
every permission everywhere), the members (``zk_member_auth``, which every role's client config
carries: it may list the layout, draw ledger ids, create ledger metadata and mark ledgers
under-replicated, and read nothing of a namespace), and one identity per role (``zk_auth`` of that
role's client config). The scheme is on once ``<root>/SECURITY`` names the superuser's and the
members' digests (``shell secure-metadata --tenants``); before, every node keeps the cluster's one
digest ACL (§4.8).

ZooKeeper checks a delete against the parent's ACL, so no role may delete a ledger's metadata
node (the buckets would have to let every member delete every ledger): a role's delete marks the
metadata deleted (a write, which only its namespace's producers or its creator may make) and
leaves a marker under ``<root>/deleted``; bookies, under the superuser, remove marked nodes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from metadata.errors import InvalidMetadataError
from metadata.layout import (
    DELETED,
    IDGEN_LONG,
    UNDERREPLICATION,
    UR_LEDGERS,
    ZkLayout,
    is_bucket_name,
    is_ledger_node_name,
)
from metadata.model import decode
from metadata.tenancy.model import NamespaceAccess, TenantDoc
from metadata.zk.acl import parse_zk_auth

SECURITY = "SECURITY"
ROLES = "roles"
STREAMS = "streams"
SUBSCRIPTIONS = "subscriptions"   # <ns>/<stream>/subscriptions (metadata/streams/store.py): consumers write there
TENANTS = "tenants"
R, W, C, D, A = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE, Permissions.ADMIN
ALL = Permissions.ALL
STRUCTURE = (STREAMS, TENANTS, ROLES, DELETED)   # made by the superuser when the scheme is turned on
INACTIVE_RECHECK_S = 5.0   # how soon a process notices the scheme was turned on

Read = Callable[[str], bytes | None]   # a node's data (None: absent), read without ACL computations


def digest_id(zk_auth: str) -> str:
    """The public digest identity (``user:base64(sha1(user:password))``) of ``user:password``."""
    user, password = parse_zk_auth(zk_auth)
    return str(make_digest_acl_credential(user, password))


def _acl(perms: int, ident: str) -> ACL:
    return ACL(perms, Id("digest", ident))


def security_doc(superuser_auth: str, member_auth: str) -> bytes:
    return json.dumps({"v": 1, "superuser": digest_id(superuser_auth), "members": digest_id(member_auth)}).encode()


class TenantAclPolicy:
    """The ACL of each node this session creates, from its path and data. Thread-safe."""

    def __init__(self, root: str, read: Read) -> None:
        self._layout = ZkLayout(root)
        self._root = root.rstrip("/")
        self._read = read
        self._ids: tuple[str, str] | None = None   # (superuser, members) digests once active
        self._checked_s = -1e9
        self._roles: dict[str, str | None] = {}
        self._lock = threading.Lock()

    @property
    def layout(self) -> ZkLayout:
        return self._layout

    def active(self) -> bool:
        """Whether ``<root>/SECURITY`` turned the scheme on (checked again every few seconds while off)."""
        if self._ids is not None:
            return True
        now = time.monotonic()
        if now - self._checked_s < INACTIVE_RECHECK_S:
            return False
        self._checked_s = now
        data = self._read(f"{self._root}/{SECURITY}")
        if data is None:
            return False
        try:
            doc = json.loads(data.decode())
            self._ids = (str(doc["superuser"]), str(doc["members"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidMetadataError(f"{self._root}/{SECURITY}: not a security record ({e})") from e
        return True

    def forget(self) -> None:
        """Read ``SECURITY`` again on the next create (it was just written)."""
        self._ids, self._checked_s = None, -1e9

    def role_id(self, role: str) -> str | None:
        """A role's digest identity from ``<root>/roles`` (None: never registered; cached)."""
        with self._lock:
            if role in self._roles:
                return self._roles[role]
        data = self._read(f"{self._root}/{ROLES}/{role}") if role and "/" not in role else None
        ident = data.decode() if data else None
        with self._lock:
            if ident is not None:
                self._roles[role] = ident
        return ident

    def acl_for(self, path: str, data: bytes = b"") -> list[ACL] | None:
        """The ACL for a node created at ``path`` with ``data`` (None: the scheme is off)."""
        ids = self._ids if self.active() else None
        if ids is None:
            return None
        superuser, members = ids
        base = [_acl(ALL, superuser)]
        if path != self._root and not path.startswith(self._root + "/"):   # the root's parents
            return [*base, _acl(R, members)]
        rel = path[len(self._root):].strip("/").split("/")
        if rel == [""]:   # members create the ledger tree's top buckets here
            return [*base, _acl(R | C, members)]
        head = rel[0]
        if head == STREAMS:
            if len(rel) == 1:
                return [*base, _acl(R | C, members)]
            return base + self._namespace_entries(rel[1], data if len(rel) == 2 else None, top=len(rel) == 2,
                                                  subscriptions=len(rel) >= 4 and rel[3] == SUBSCRIPTIONS)
        if head == IDGEN_LONG:
            # members claim ids by writing the counter (metadata.idgen); the sequences below it
            # are the older scheme's, read once to start above them
            return [*base, _acl(R | W | C | D if len(rel) == 1 else ALL, members)]
        if head == UNDERREPLICATION:
            under_ledgers = len(rel) >= 2 and rel[1] == UR_LEDGERS
            return [*base, _acl(R | W | C | D if under_ledgers else R, members)]
        if head == DELETED:
            return [*base, _acl(R | C if len(rel) == 1 else R, members)]
        if is_bucket_name(0, head):
            if is_ledger_node_name(rel[-1]):
                return base + self._ledger_entries(path, data)
            return [*base, _acl(R | C, members)]
        return [*base, _acl(R, members)]

    # -- namespaces and ledgers ------------------------------------------------------------------
    def _grants(self, ns: str, data: bytes | None) -> tuple[NamespaceAccess, frozenset[str]] | None:
        if not data:   # not given (a node below the namespace's): read the namespace's
            data = self._read(f"{self._root}/{STREAMS}/{ns}")
            if data is None:
                return None
        try:
            doc = json.loads(data.decode())
        except ValueError:
            return None
        access = NamespaceAccess.from_json(doc.get("access") if isinstance(doc, dict) else None, f"namespace {ns}")
        tenant = self._read(f"{self._root}/{TENANTS}/{access.tenant}")
        admins = TenantDoc.decode(tenant).admin_roles if tenant is not None else frozenset()
        return access, admins

    def _namespace_entries(self, ns: str, data: bytes | None, *, top: bool, subscriptions: bool = False) -> list[ACL]:
        """Tenant admins every permission; producers may create and delete streams (the namespace
        node) or change them (below it); consumers read, and keep their streams' subscriptions
        (``<stream>/subscriptions`` and below: DESIGN §4.11)."""
        got = self._grants(ns, data)
        if got is None:
            return []
        access, admins = got
        out = [_acl(ALL, i) for i in map(self.role_id, sorted(admins)) if i]
        for role, actions in sorted(access.permissions.items()):
            ident = self.role_id(role)
            if ident is None or role in admins:
                continue
            perms = (R | C | D if top else R | W | C | D) if "produce" in actions or subscriptions else R
            out.append(_acl(perms, ident))
        return out

    def _ledger_entries(self, path: str, data: bytes) -> list[ACL]:
        """A namespace's ledger: its tenant admins and producers read and write (close, recover,
        delete-mark), its tenant admins also re-apply ACLs (a grant); its consumers read. Outside
        namespaces: its creator."""
        try:
            md = decode(data, self._layout.ledger_id(path))
        except (InvalidMetadataError, ValueError):
            return []
        if not md.namespace:
            ident = self.role_id(md.owner_role) if md.owner_role else None
            return [_acl(R | W, ident)] if ident else []
        got = self._grants(md.namespace, None)
        if got is None:
            return []
        access, admins = got
        out = [_acl(R | W | A, i) for i in map(self.role_id, sorted(admins)) if i]
        for role, actions in sorted(access.permissions.items()):
            ident = self.role_id(role)
            if ident is not None and role not in admins:
                out.append(_acl(R | W if "produce" in actions else R, ident))
        return out
