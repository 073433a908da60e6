"""TLS on the session to ZooKeeper (DESIGN §4.8, docs/security.md).

A secured cluster's ZooKeeper serves only its secure client port: the digest credentials
(``zk_auth``) and every node's data then travel encrypted, and the client checks ZooKeeper's
certificate against ``ca_path`` and the host name it dialled. ``cert_path``/``key_path``: a client
certificate, presented when ZooKeeper asks for one.

Plain data here (no kazoo): the configurations build it, :mod:`metadata.zk` turns it into kazoo's
options.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from metadata.errors import MetadataError


class ZkTlsError(MetadataError, ValueError):
    """A ZooKeeper TLS setting is incomplete, or one of its files is missing or not PEM."""


@dataclass(frozen=True)
class ZkTls:
    ca_path: str
    cert_path: str | None = None
    key_path: str | None = None

    def __post_init__(self) -> None:
        if not self.ca_path:
            raise ZkTlsError("ZooKeeper TLS needs a CA file (the CA ZooKeeper's certificate chains to)")
        if (self.cert_path is None) != (self.key_path is None):
            raise ZkTlsError("a client certificate for ZooKeeper needs its key, and a key its certificate")

    def check(self) -> ZkTls:
        """Load the files as the connection will; ZkTlsError naming the file that does not load.

        Why up front: kazoo loads them on every connection attempt and treats a failure like a
        lost connection, so a missing CA would only show as a connect timeout, saying nothing of
        why."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_verify_locations(self.ca_path)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ZkTlsError(f"cannot load the ZooKeeper TLS CA {self.ca_path}: {e}") from e
        if self.cert_path is not None:
            try:
                context.load_cert_chain(self.cert_path, self.key_path)
            except (OSError, ssl.SSLError, ValueError) as e:
                raise ZkTlsError(f"cannot load the client certificate {self.cert_path} "
                                 f"(key {self.key_path}) for ZooKeeper: {e}") from e
        return self
