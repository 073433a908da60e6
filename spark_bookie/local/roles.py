"""A client config for a role (DESIGN §4.9, `spark-bookie role create`): a token whose ``sub`` is
the role, signed with the cluster's token key, in a ``[client]`` TOML that ``ClientConfig.from_toml``
loads, beside the connection settings of the config it was made from.

What is copied from that config: every field that differs from ClientConfig's default (so fields
added later, ZooKeeper's TLS for one, come along without a change here), except the maker's own
credentials: its token (``auth_token``, ``auth_token_file``) and its client certificate
(``tls_cert_path``, ``tls_key_path``), which identify the maker, not the new role. A cluster that
requires client certificates (mTLS) needs one for the role too: pass it explicitly.

Who may make a role is the command's check (superusers; a tenant's admin roles for that tenant);
:func:`foreign_role_refusal` is the part of it that keeps a tenant admin from minting a role that
another tenant names (its admin role, or a grant on its namespaces). Whoever holds the key can sign
any token: these checks keep honest operators in their lane, the key itself must stay private.
"""

from __future__ import annotations

import math
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ledger_client import ClientConfig
from ledger_client.errors import IncorrectParameterError
from metadata import MetadataAccessDeniedError, NodeExistsError
from metadata.tenancy import SERVICE_ROLE, check_role
from spark_bookie.errors import ConfigError
from spark_bookie.server.auth import mint_token

if TYPE_CHECKING:
    from metadata import MetadataStore

ENV_TOKEN_SECRET = "SPARK_BOOKIE_TOKEN_SECRET"   # the HS256 secret file `role create` uses by default
MAKER_FIELDS = frozenset({"auth_token", "auth_token_file", "tls_cert_path", "tls_key_path"})
ROLE_CLAIMS = ("client", SERVICE_ROLE)
TOKEN_TTL_S_DEFAULT = 30 * 86_400.0


class RoleConfigError(ValueError):
    """A role's config cannot be made: a bad name, key, setting or output path (said in one line)."""


@dataclass(frozen=True)
class TokenKey:
    """The key tokens are signed with: an HS256 secret (the bookies' ``auth_token_secret_path``)
    or an RS256 private key (its public half is the bookies' ``auth_token_public_key_path``)."""

    key: bytes | str
    algorithm: str
    path: str

    @classmethod
    def from_files(cls, secret_path: str | None = None, private_key_path: str | None = None) -> TokenKey:
        """Exactly one of the two; the secret read as the bookies' verifier reads it (stripped)."""
        if bool(secret_path) == bool(private_key_path):
            raise RoleConfigError("give the cluster's token key: a secret file (HS256) or a private key "
                                  f"(RS256), one of them (the secret's default: ${ENV_TOKEN_SECRET})")
        path = str(secret_path or private_key_path)
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise RoleConfigError(f"cannot read the token key {path}: {e.strerror or e}") from e
        if secret_path:
            if not data.strip():
                raise RoleConfigError(f"the token secret {path} is empty")
            return cls(data.strip(), "HS256", path)
        if b"PRIVATE KEY" not in data:
            raise RoleConfigError(f"{path} is not a PEM private key (RS256)")
        return cls(data.decode("ascii", errors="replace"), "RS256", path)


def mint_role_token(key: TokenKey, role: str, role_claim: str = "client",
                    ttl_s: float = TOKEN_TTL_S_DEFAULT) -> str:
    """A token for ``role`` (its ``sub``) with the ``role`` claim ``client`` or ``service``."""
    try:
        check_role(role)
    except ValueError as e:
        raise RoleConfigError(str(e)) from e
    if role_claim not in ROLE_CLAIMS:
        raise RoleConfigError(f"role claim must be one of {', '.join(ROLE_CLAIMS)}, not {role_claim!r}")
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise RoleConfigError(f"the token's lifetime must be positive, not {ttl_s}")
    try:
        return mint_token(key.key, role, role_claim, ttl_s, key.algorithm)
    except (ConfigError, ValueError, TypeError) as e:   # e.g. a PEM that is not an RSA key
        raise RoleConfigError(f"cannot sign with {key.path} ({key.algorithm}): {e}") from e


def role_client_settings(base: ClientConfig | None, token: str, tls_cert_path: str | None = None,
                         tls_key_path: str | None = None, zk_auth: str | None = None) -> dict[str, object]:
    """The ``[client]`` table of the role: ``base``'s settings but its maker's credentials, the
    token, the role's own client certificate if given, and its own ZooKeeper identity
    (``zk_auth``, with the tenant ACLs on: see metadata.zk.tenant_acl); checked as ClientConfig
    checks it."""
    default = ClientConfig()
    values: dict[str, object] = {}
    if base is not None:
        for f in fields(ClientConfig):
            v = getattr(base, f.name)
            if f.name not in MAKER_FIELDS and v is not None and v != getattr(default, f.name):
                values[f.name] = v
    values["auth_token"] = token
    if zk_auth is not None:
        values["zk_auth"] = zk_auth
    if tls_cert_path or tls_key_path:
        values.update(tls_cert_path=tls_cert_path, tls_key_path=tls_key_path)
    try:
        ClientConfig(**values)   # type: ignore[arg-type]
    except (IncorrectParameterError, TypeError) as e:
        raise RoleConfigError(f"the role's client config would not load: {e}") from e
    return values


def client_toml(values: Mapping[str, object]) -> str:
    """A ``[client]`` table of strings, integers, floats and booleans, as TOML."""
    lines = ["# spark-bookie client config for one role (spark-bookie role create); keep it private", "[client]"]
    for key, v in values.items():
        lines.append(f"{key} = {_toml_value(key, v)}")
    return "\n".join(lines) + "\n"


def _toml_value(key: str, v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float) and math.isfinite(v):
        return repr(v)
    if isinstance(v, str):
        out = []
        for ch in v:
            if ch in ('"', "\\"):
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    raise RoleConfigError(f"client setting {key} = {v!r} has no TOML form here")


def write_private(path: str | Path, text: str, force: bool = False) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (0600); an existing file is kept
    (RoleConfigError) unless ``force``, which replaces it atomically."""
    path = Path(path)
    data = text.encode()
    try:
        if not force:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return path
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "wb") as f:   # mkstemp's file is 0600 already
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return path
    except FileExistsError as e:
        raise RoleConfigError(f"{path} exists; --force replaces it") from e
    except OSError as e:
        raise RoleConfigError(f"cannot write {path}: {e.strerror or e}") from e


def write_role_config(path: str | Path, base: ClientConfig | None, token: str, *, force: bool = False,
                      tls_cert_path: str | None = None, tls_key_path: str | None = None,
                      zk_auth: str | None = None) -> Path:
    """The role's ``[client]`` TOML at ``path`` (0600), loadable with ``ClientConfig.from_toml``."""
    values = role_client_settings(base, token, tls_cert_path, tls_key_path, zk_auth)
    return write_private(path, client_toml(values), force)


def register_zk_identity(store: MetadataStore, role: str, base: ClientConfig | None) -> str | None:
    """With the per-tenant ZooKeeper ACLs on, the role's own ZooKeeper credentials, registered
    (its public digest in ``<root>/roles``) so grants name it in ACLs; None when the scheme is
    off (the role then uses its maker's ZooKeeper credentials, as every client of the cluster)."""
    if not store.nodes.tenant_acls_active():
        return None
    if base is None or not base.zk_member_auth:
        raise RoleConfigError("this cluster keeps tenants apart in ZooKeeper: the maker's client config must "
                              "hold zk_member_auth (the members' credentials every role's config carries)")
    zk_auth = f"{role}:{secrets.token_urlsafe(24)}"
    try:
        store.tenants.register_role(role, zk_auth)
    except NodeExistsError as e:
        raise RoleConfigError(f"role {role!r} has ZooKeeper credentials already (a role's never change): "
                              "its existing config keeps working; a new config needs a new role name") from e
    except MetadataAccessDeniedError as e:
        raise RoleConfigError("registering a role's ZooKeeper identity takes the cluster's superuser ZooKeeper "
                              "credentials (zk_auth of a superuser's client config)") from e
    for ns in _namespaces_naming(store, role):   # grants made before the role existed now reach ZooKeeper
        store.tenants.reapply_acls(ns)
    return zk_auth


def _namespaces_naming(store: MetadataStore, role: str) -> list[str]:
    """The namespaces that grant ``role`` something or whose tenant it administers."""
    admins_of = {t: doc[0].admin_roles for t in store.tenants.list_tenants()
                 if (doc := store.tenants.read_tenant(t)) is not None}
    out = []
    for ns in store.streams.list_namespaces():
        access = store.tenants.read_access(ns)
        if access is not None and (role in access[0].permissions
                                   or role in admins_of.get(access[0].tenant, frozenset())):
            out.append(ns)
    return out


def foreign_role_refusal(store: MetadataStore, role: str, tenant: str | None) -> str | None:
    """Why a tenant admin of ``tenant`` may not mint a token for ``role`` (None: it may): another
    tenant names the role as an admin, or grants it actions on one of its namespaces."""
    for other in store.tenants.list_tenants():
        got = store.tenants.read_tenant(other) if other != tenant else None
        if got is not None and role in got[0].admin_roles:
            return f"role {role!r} is an admin role of tenant {other!r}"
    for ns in store.streams.list_namespaces():
        access = store.tenants.read_access(ns)
        if access is not None and access[0].tenant != tenant and role in access[0].permissions:
            return f"role {role!r} holds grants on namespace {ns!r} of tenant {access[0].tenant!r}"
    return None
