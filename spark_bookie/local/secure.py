"""The credentials of a secured sandbox (`spark-bookie sandbox --secure`, DESIGN §4.8).

One call makes everything a secured cluster needs on one machine: a CA, a server certificate for
the bookies (127.0.0.1 and localhost), a client certificate, a token secret and an admin token
signed with it, ZooKeeper digest credentials, the bookie settings that turn every part on, and a
client TOML (`client config: PATH`) that the CLI, the Python client and the Spark jobs read.

ZooKeeper gets a certificate of its own and serves only its TLS port (`zk_tls`): the digest
credentials never cross the network in clear, from the sandbox, its bookies or its clients.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_bookie.local.certs import CertificateAuthority
from spark_bookie.local.sandbox import SandboxError
from spark_bookie.local.zookeeper import ZooKeeperServerTls
from spark_bookie.server.auth import mint_token

TOKEN_TTL_S = 30 * 86_400.0
SERVICE_SUBJECT = "bookie-service"   # the bookies' replication workers and auditor (role claim service)
ZK_KEY_STORE = "zookeeper-keystore.pem"   # ZooKeeper's private key and certificate, one PEM (its key store)
LOOPBACK = ("127.0.0.1", "localhost")


class SecureFilesError(SandboxError):
    """A resumed secured sandbox's files are missing or unreadable."""


@dataclass(frozen=True)
class SecureSandboxFiles:
    directory: Path
    ca_path: Path
    bookie_cert_path: Path
    bookie_key_path: Path
    client_cert_path: Path
    client_key_path: Path
    token_secret_path: Path
    token_path: Path
    client_conf_path: Path
    zk_auth: str
    zookeeper_key_store: Path | None = None   # set: ZooKeeper serves TLS only, and everyone uses it
    service_conf_path: Path | None = None     # the bookies' own client config: the service identity (§4.9)

    def bookie_settings(self) -> dict[str, Any]:
        """The bookie configuration keys that turn on TLS (mTLS), tokens and ZooKeeper ACLs, and
        TLS to ZooKeeper when it serves it."""
        settings: dict[str, Any] = {
            "zk_auth": self.zk_auth, "auth_enabled": True, "auth_token_secret_path": str(self.token_secret_path),
            "tls_enabled": True, "tls_certificate_path": str(self.bookie_cert_path),
            "tls_key_path": str(self.bookie_key_path), "tls_trust_store_path": str(self.ca_path),
            "tls_client_authentication": True, "client_conf": str(self.service_conf_path or self.client_conf_path)}
        if self.zookeeper_key_store is not None:
            settings.update({"zk_tls": True, "zk_tls_ca_path": str(self.ca_path)})
        return settings

    def zookeeper_tls(self) -> ZooKeeperServerTls | None:
        """How the sandbox's embedded ZooKeeper serves TLS (its certificate, and the CA of client
        certificates), or None for a ZooKeeper without TLS."""
        if self.zookeeper_key_store is None:
            return None
        return ZooKeeperServerTls(self.zookeeper_key_store, self.ca_path)

    def announce(self) -> None:
        """The lines a secured sandbox prints beside its connect string."""
        print(f"client config: {self.client_conf_path}", flush=True)
        print(f"export SPARK_BOOKIE_CLIENT_CONF={self.client_conf_path}", flush=True)


def make_secure_files(directory: Path, subject: str = "sandbox-admin", bookie_hosts: tuple[str, ...] = LOOPBACK,
                      zookeeper_hosts: tuple[str, ...] = ()) -> SecureSandboxFiles:
    """Write a fresh CA, certificates, token and client TOML under `directory` (private files 0600).
    `bookie_hosts`: the addresses and names the bookies' certificate is valid for (clients check
    the one they dial). `zookeeper_hosts`: the same for ZooKeeper's certificate, which turns TLS to
    ZooKeeper on (`zookeeper_tls()` for the embedded ZooKeeper, `zk_tls` for everyone else); none:
    ZooKeeper's plain port (a ZooKeeper the caller did not start, without TLS)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("spark-bookie sandbox CA")
    ca_path = ca.write_cert(directory / "ca.pem")
    bookie = ca.issue_files(directory, "bookie", bookie_hosts)
    client = ca.issue_files(directory, "client", client=True)
    key_store = None
    if zookeeper_hosts:
        zk_cert, zk_key = ca.issue("zookeeper", zookeeper_hosts)
        key_store = _private(directory / ZK_KEY_STORE, zk_key + zk_cert)
    secret = secrets.token_hex(32).encode()
    secret_path = _private(directory / "token-secret", secret)
    token_path = _private(directory / "token", mint_token(secret, subject, "admin", TOKEN_TTL_S).encode())
    zk_auth = f"spark-bookie:{secrets.token_hex(12)}"
    member_auth = f"members:{secrets.token_hex(12)}"   # roles' shared ZooKeeper identity (tenants)
    def conf(token: Path, who: str) -> bytes:
        return "\n".join([
            f"# written by `spark-bookie sandbox --secure`: {who} (docs/security.md)",
            "[client]",
            f'zk_auth = "{zk_auth}"',
            f'zk_member_auth = "{member_auth}"',
            f'auth_token_file = "{token}"',
            f'tls_ca_path = "{ca_path}"',
            f'tls_cert_path = "{client.cert_path}"',
            f'tls_key_path = "{client.key_path}"', *(["zk_tls = true"] if key_store else []), ""]).encode()

    conf_path = _private(directory / "client.toml", conf(token_path, "the superuser's credentials of this sandbox"))
    service_token = _private(directory / "service-token", mint_token(secret, SERVICE_SUBJECT, "service",
                                                                     TOKEN_TTL_S).encode())
    service_conf = _private(directory / "service.toml", conf(service_token, "its bookies' own (service) identity"))
    return SecureSandboxFiles(directory, ca_path, bookie.cert_path, bookie.key_path, client.cert_path,
                              client.key_path, secret_path, token_path, conf_path, zk_auth, key_store, service_conf)


def sandbox_secure_files(root: str | Path, bookie_hosts: tuple[str, ...] = (),
                         zookeeper_host: str | None = None) -> SecureSandboxFiles:
    """`sandbox --secure`'s files, fresh, under ``<root>/secure`` with absolute paths: the client
    TOML and the bookie settings name them, and executors and shells in other working directories
    read them. `bookie_hosts`: addresses the bookies listen on besides 127.0.0.1 (other hosts');
    `zookeeper_host`: the address ZooKeeper binds besides loopback's (a hosts sandbox's gateway).
    ZooKeeper serves TLS only."""
    return make_secure_files(Path(root).absolute() / "secure", bookie_hosts=(*LOOPBACK, *bookie_hosts),
                             zookeeper_hosts=(*LOOPBACK, *((zookeeper_host,) if zookeeper_host else ())))


def load_secure_files(root: str | Path) -> SecureSandboxFiles:
    """The files ``sandbox_secure_files(root)`` made for a sandbox that is now resumed: the same CA,
    certificates, token secret and ZooKeeper credentials (its ZooKeeper data carries their ACL),
    with a new admin token (the old one may have expired). SecureFilesError when any is missing."""
    import tomllib

    directory = Path(root).absolute() / "secure"
    names = ("ca.pem", "bookie.pem", "bookie-key.pem", "client.pem", "client-key.pem", "token-secret", "client.toml")
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise SecureFilesError(f"the secured sandbox's files in {directory} are incomplete (no {', '.join(missing)})")
    try:
        client = tomllib.loads((directory / "client.toml").read_text())["client"]
        zk_auth = client["zk_auth"]
        secret = (directory / "token-secret").read_bytes()
    except (OSError, ValueError, KeyError) as e:
        raise SecureFilesError(f"cannot read the secured sandbox's files in {directory}: {e}") from e
    key_store = directory / ZK_KEY_STORE if client.get("zk_tls") is True else None   # older sandboxes: no TLS
    if key_store is not None and not key_store.is_file():
        raise SecureFilesError(f"the secured sandbox's files in {directory} are incomplete (no {ZK_KEY_STORE})")
    token_path = _private(directory / "token", mint_token(secret, "sandbox-admin", "admin", TOKEN_TTL_S).encode())
    service_conf = directory / "service.toml"   # older sandboxes have none: their bookies use client.toml
    if service_conf.is_file():
        _private(directory / "service-token", mint_token(secret, SERVICE_SUBJECT, "service", TOKEN_TTL_S).encode())
    return SecureSandboxFiles(directory, directory / "ca.pem", directory / "bookie.pem", directory / "bookie-key.pem",
                              directory / "client.pem", directory / "client-key.pem", directory / "token-secret",
                              token_path, directory / "client.toml", str(zk_auth), key_store,
                              service_conf if service_conf.is_file() else None)


def _private(path: Path, data: bytes) -> Path:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(data)
    return path
