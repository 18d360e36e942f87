"""Throw-away certificates for TLS tests: a CA, a server certificate for 127.0.0.1/localhost,
and client certificates with a chosen common name."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return str(path.with_suffix(".crt")), str(path.with_suffix(".key"))


class ThrowawayPKI:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cgsvc test CA")])
        now = dt.datetime.now(dt.UTC)
        self.ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.ca_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
                   .not_valid_after(now + dt.timedelta(days=60))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(self.ca_key, hashes.SHA256()))
        self.ca_path, _ = _write(directory / "ca", self.ca, self.ca_key)

    def issue(self, stem: str, common_name: str, server: bool, days: float = 30) -> tuple[str, str]:
        """A certificate valid from yesterday for `days` (the server warns of one expiring within 7)."""
        key = _key()
        now = dt.datetime.now(dt.UTC)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self.ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=days)))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return _write(self.dir / stem, builder.sign(self.ca_key, hashes.SHA256()), key)
