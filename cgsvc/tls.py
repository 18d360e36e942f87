"""TLS files, checked before gRPC sees them: gRPC reports a missing, malformed or mismatched
certificate or key as "Failed to bind to address" (server) or UNAVAILABLE (client). Each error
names the setting (`tls_cert`, `tls_key`, `tls_client_ca`, `tls_ca`) and what would be valid."""

from __future__ import annotations

import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import serialization


class TlsFileError(ValueError):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def read_pem(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise TlsFileError(name, f"{path}: {exc.strerror or exc}") from None


def certificates(data: bytes, name: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TlsFileError(name, f"not a PEM certificate (-----BEGIN CERTIFICATE-----): {exc}") from None


def check_pair(cert: bytes, key: bytes, cert_name: str = "tls_cert", key_name: str = "tls_key") -> None:
    """The certificate file is PEM, the key file an unencrypted PEM private key, and the key the
    first certificate's."""
    first = certificates(cert, cert_name)[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsFileError(key_name, f"not an unencrypted PEM private key: {exc}") from None
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(der, spki) != first.public_key().public_bytes(der, spki):
        raise TlsFileError(key_name, f"not the key of {cert_name}'s certificate (the first in the file): give the pair")


def read_certificates(path: str, name: str) -> bytes:
    """A CA file's bytes, checked to hold PEM certificates."""
    data = read_pem(path, name)
    certificates(data, name)
    return data


def read_pair(cert_path: str, key_path: str, cert_name: str = "tls_cert", key_name: str = "tls_key") -> tuple[bytes, bytes]:
    """(certificate, key) bytes, checked to be a matching PEM pair."""
    cert, key = read_pem(cert_path, cert_name), read_pem(key_path, key_name)
    check_pair(cert, key, cert_name, key_name)
    return cert, key


def expiry(data: bytes) -> float:
    """When the first certificate of a PEM file stops being valid (seconds since the epoch)."""
    return x509.load_pem_x509_certificates(data)[0].not_valid_after_utc.timestamp()


def earliest_expiry(data: bytes) -> float:
    """When the first of a PEM bundle's certificates stops being valid (a CA bundle's weakest link)."""
    return min(c.not_valid_after_utc.timestamp() for c in x509.load_pem_x509_certificates(data))


def names(data: bytes) -> list[str]:
    """The names a PEM file's first certificate is valid for: its subjectAltName DNS names and IP
    addresses (what a client checks; a common name counts only where there is no such extension,
    as older clients did)."""
    cert = x509.load_pem_x509_certificates(data)[0]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [str(a.value) for a in cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)]
    return [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]


def covers(data: bytes, host: str) -> bool:
    """Whether a client dialling `host` (a name or an address, IPv6 in brackets or not) accepts
    the certificate by name: an exact name (in any case), an address, or a wildcard `*.` standing
    for one leftmost label (RFC 6125)."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for name in names(data):
        if address is not None:
            try:
                if ipaddress.ip_address(name) == address:
                    return True
            except ValueError:
                pass
            continue
        name = name.rstrip(".").lower()
        if name == host or (name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]):
            return True
    return False
