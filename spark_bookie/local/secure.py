"""The credentials of a secured sandbox (`spark-bookie sandbox --secure`, DESIGN §4.8).

One call makes everything a secured cluster needs on one machine: a CA, a server certificate for
the bookies (127.0.0.1 and localhost), a client certificate, a token secret and an admin token
signed with it, ZooKeeper digest credentials, the bookie settings that turn every part on, and a
client TOML (`client config: PATH`) that the CLI, the Python client and the Spark jobs read.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_bookie.local.certs import CertificateAuthority
from spark_bookie.local.sandbox import SandboxError
from spark_bookie.server.auth import mint_token

TOKEN_TTL_S = 30 * 86_400.0


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

    def bookie_settings(self) -> dict[str, Any]:
        """The bookie configuration keys that turn on TLS (mTLS), tokens and ZooKeeper ACLs."""
        return {"zk_auth": self.zk_auth, "auth_enabled": True, "auth_token_secret_path": str(self.token_secret_path),
                "tls_enabled": True, "tls_certificate_path": str(self.bookie_cert_path),
                "tls_key_path": str(self.bookie_key_path), "tls_trust_store_path": str(self.ca_path),
                "tls_client_authentication": True, "client_conf": str(self.client_conf_path)}

    def announce(self) -> None:
        """The lines a secured sandbox prints beside its connect string."""
        print(f"client config: {self.client_conf_path}", flush=True)
        print(f"export SPARK_BOOKIE_CLIENT_CONF={self.client_conf_path}", flush=True)


def make_secure_files(directory: Path, subject: str = "sandbox-admin",
                      bookie_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> SecureSandboxFiles:
    """Write a fresh CA, certificates, token and client TOML under `directory` (private files 0600).
    `bookie_hosts`: the addresses and names the bookies' certificate is valid for (clients check
    the one they dial)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("spark-bookie sandbox CA")
    ca_path = ca.write_cert(directory / "ca.pem")
    bookie = ca.issue_files(directory, "bookie", bookie_hosts)
    client = ca.issue_files(directory, "client", client=True)
    secret = secrets.token_hex(32).encode()
    secret_path = _private(directory / "token-secret", secret)
    token_path = _private(directory / "token", mint_token(secret, subject, "admin", TOKEN_TTL_S).encode())
    zk_auth = f"spark-bookie:{secrets.token_hex(12)}"
    conf = "\n".join([
        "# written by `spark-bookie sandbox --secure`: the credentials of this sandbox (docs/security.md)",
        "[client]",
        f'zk_auth = "{zk_auth}"',
        f'auth_token_file = "{token_path}"',
        f'tls_ca_path = "{ca_path}"',
        f'tls_cert_path = "{client.cert_path}"',
        f'tls_key_path = "{client.key_path}"', ""])
    conf_path = _private(directory / "client.toml", conf.encode())
    return SecureSandboxFiles(directory, ca_path, bookie.cert_path, bookie.key_path, client.cert_path,
                              client.key_path, secret_path, token_path, conf_path, zk_auth)


def sandbox_secure_files(root: str | Path, bookie_hosts: tuple[str, ...] = ()) -> SecureSandboxFiles:
    """`sandbox --secure`'s files, fresh, under ``<root>/secure`` with absolute paths: the client
    TOML and the bookie settings name them, and executors and shells in other working directories
    read them. `bookie_hosts`: addresses the bookies listen on besides 127.0.0.1 (other hosts')."""
    return make_secure_files(Path(root).absolute() / "secure",
                             bookie_hosts=("127.0.0.1", "localhost", *bookie_hosts))


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
        zk_auth = tomllib.loads((directory / "client.toml").read_text())["client"]["zk_auth"]
        secret = (directory / "token-secret").read_bytes()
    except (OSError, ValueError, KeyError) as e:
        raise SecureFilesError(f"cannot read the secured sandbox's files in {directory}: {e}") from e
    token_path = _private(directory / "token", mint_token(secret, "sandbox-admin", "admin", TOKEN_TTL_S).encode())
    return SecureSandboxFiles(directory, directory / "ca.pem", directory / "bookie.pem", directory / "bookie-key.pem",
                              directory / "client.pem", directory / "client-key.pem", directory / "token-secret",
                              token_path, directory / "client.toml", str(zk_auth))


def _private(path: Path, data: bytes) -> Path:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(data)
    return path
