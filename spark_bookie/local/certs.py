"""A throw-away certificate authority for secured sandboxes and tests (`sandbox --secure`).

Production clusters bring their own CA; this one exists so that TLS, mTLS and hostname checks can
be exercised on one machine with real certificates. Keys are EC P-256 (fast to make, small).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class IssuedPair:
    """A certificate (PEM) and its private key (PEM), as files once written."""

    cert_path: Path
    key_path: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, common_name: str = "spark-bookie test CA", valid_days: int = 30) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._valid_days = valid_days
        self.cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
                     .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=valid_days))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self._key, hashes.SHA256()))

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write_cert(self, path: Path) -> Path:
        path.write_bytes(self.cert_pem)
        return path

    def issue(self, common_name: str, hosts: tuple[str, ...] = (), *, client: bool = False) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for `common_name`, valid for `hosts` (IP addresses and DNS
        names) as a server, or as a client with `client`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=self._valid_days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    def issue_files(self, directory: Path, name: str, hosts: tuple[str, ...] = (), *,
                    client: bool = False) -> IssuedPair:
        """`issue`, written to `<directory>/<name>.pem` and `<name>-key.pem` (the key readable
        by its owner only)."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = self.issue(name, hosts, client=client)
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        return IssuedPair(cert_path, key_path)
