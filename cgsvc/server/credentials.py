"""What the server admits — its token file and TLS files — and how it takes a new set without a restart.

The files are read and checked at start, and read again on SIGHUP, or when
`--credentials-poll-seconds` sees one change (a Kubernetes Secret or cert-manager renewal
rewrites them in place). A new set is checked whole and applied whole, or not at all: a bad
token file or a key that is not its certificate's leaves the set in use serving, and says
why. Tokens and client-certificate names apply from the next call; a TLS certificate or
client CA from the next connection (a connection already open keeps the one it shook hands
with, as TLS does). Every reload, applied or refused, is an audit record
(`method = "server.credentials"`) naming who gained, lost or changed access.

The paths themselves, and whether TLS and authentication are on, are fixed at start: a
reload cannot turn a server's exposure rules (README, "Who may call") into another's.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID

from cgsvc import tls
from cgsvc.audit.auditor import Auditor
from cgsvc.server import metrics
from cgsvc.server.auth import Authenticator, Principal, TokenFileError, load_token_file
from cgsvc.server.config import ServerConfig

RELOAD_METHOD = "server.credentials"

log = structlog.get_logger("cgsvc.server")


class CredentialsError(ValueError):
    """A token file or TLS file the server will not take; the message names the setting."""


@dataclass(frozen=True)
class Admitted:
    """One checked set: principals by token SHA-256 and by certificate common name, and the TLS
    files' bytes (certificate chain, key, client CA) when TLS is on."""

    tokens: dict[str, Principal] = field(default_factory=dict)
    certificates: dict[str, Principal] = field(default_factory=dict)
    tls: tuple[bytes, bytes, bytes | None] | None = None

    def expiries(self) -> dict[str, float]:
        """When the TLS certificates in this set stop being valid, by setting."""
        if self.tls is None:
            return {}
        cert, _key, ca = self.tls
        return {"tls_cert": tls.expiry(cert), **({"tls_client_ca": tls.earliest_expiry(ca)} if ca else {})}

    def tls_configuration(self) -> grpc.ServerCertificateConfiguration:
        assert self.tls is not None
        cert, key, ca = self.tls
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def paths(cfg: ServerConfig) -> list[str]:
    """The files a reload reads again."""
    return [p for p in (cfg.token_file, cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) if p]


def files_digest(names: Iterable[str]) -> str:
    """SHA-256 over the files' contents (a missing file counts as its error): what polling compares."""
    h = hashlib.sha256()
    for name in names:
        try:
            with open(name, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            data = f"unreadable: {exc.strerror}".encode()
        h.update(hashlib.sha256(name.encode()).digest() + hashlib.sha256(data).digest())
    return h.hexdigest()


def read(cfg: ServerConfig) -> Admitted:
    """Read and check every credential file the configuration names; CredentialsError names the
    first bad one."""
    try:
        tokens, certificates = load_token_file(cfg.token_file) if cfg.token_file else ({}, {})
        tls_files = None
        if cfg.secure:
            cert, key = tls.read_pair(cfg.tls_cert, cfg.tls_key)
            ca = tls.read_certificates(cfg.tls_client_ca, "tls_client_ca") if cfg.tls_client_ca else None
            tls_files = (cert, key, ca)
    except (TokenFileError, tls.TlsFileError) as exc:
        raise CredentialsError(str(exc)) from None
    return Admitted(tokens, certificates, tls_files)


@dataclass(frozen=True)
class _Access:
    roles: tuple[str, ...]
    tokens: frozenset[str] = frozenset()  # the SHA-256s (compared, never written out)
    expiries: tuple[str, ...] = ()


def _access(admitted: Admitted) -> dict[str, _Access]:
    """Who is admitted: "token principal NAME" or "certificate CN" -> roles, tokens, expiries."""
    out: dict[str, _Access] = {}
    for digest, p in admitted.tokens.items():
        was = out.get(f"token principal {p.name!r}", _Access(()))
        out[f"token principal {p.name!r}"] = _Access(tuple(sorted({*was.roles, *p.roles})), was.tokens | {digest},
                                                     tuple(sorted({*was.expiries, p.expiry() or "never"})))
    for cn, p in admitted.certificates.items():
        out[f"certificate {cn!r}"] = _Access(tuple(sorted(p.roles)))
    return out


def _roles(roles: tuple[str, ...]) -> str:
    return ", ".join(roles) or "no roles"


def _certificate(data: bytes) -> str:
    cert = x509.load_pem_x509_certificates(data)[0]
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else cert.subject.rfc4514_string()
    fingerprint = cert.fingerprint(hashes.SHA256()).hex()[:16]
    return f"{cn!r} (SHA-256 {fingerprint}..., valid until {cert.not_valid_after_utc.isoformat()})"


def changes(old: Admitted, new: Admitted) -> list[str]:
    """What a reload from `old` to `new` changes, one phrase each: the audit record's message."""
    out: list[str] = []
    before, after = _access(old), _access(new)
    def until(a: _Access) -> str:
        return "" if a.expiries in ((), ("never",)) else f", expires {', '.join(a.expiries)}"

    for who in sorted(after.keys() - before.keys()):
        out.append(f"added {who} ({_roles(after[who].roles)}{until(after[who])})")
    for who in sorted(before.keys() - after.keys()):
        out.append(f"removed {who} (had {_roles(before[who].roles)})")
    for who in sorted(before.keys() & after.keys()):
        was, now = before[who], after[who]
        if was.roles != now.roles:
            out.append(f"{who}: roles {_roles(was.roles)} -> {_roles(now.roles)}")
        if was.tokens != now.tokens:
            out.append(f"{who}: token{'s' if len(now.tokens) > 1 else ''} replaced")
        if was.expiries != now.expiries:
            out.append(f"{who}: expires {', '.join(was.expiries)} -> {', '.join(now.expiries)}")
    if old.tls is not None and new.tls is not None:
        if old.tls[0] != new.tls[0]:
            out.append(f"tls_cert: {_certificate(old.tls[0])} -> {_certificate(new.tls[0])}")
        elif old.tls[1] != new.tls[1]:
            out.append("tls_key replaced")
        if old.tls[2] != new.tls[2]:
            out.append("tls_client_ca replaced")
    return out


class Credentials:
    """The set in use, what gRPC's TLS layer asks for at each new connection, and reloads."""

    def __init__(self, cfg: ServerConfig, authenticator: Authenticator) -> None:
        """Reads the files (CredentialsError when one is bad) and admits what they hold."""
        self.cfg = cfg
        self.paths = paths(cfg)
        self.digest = files_digest(self.paths)  # of the files as last read, applied or refused
        self.admitted = read(cfg)
        self.authenticator = authenticator
        authenticator.admit(self.admitted.tokens, self.admitted.certificates)
        self._observe()
        self._lock = asyncio.Lock()
        self._tls_lock = threading.Lock()  # the fetcher runs on gRPC's threads
        self._tls_next: grpc.ServerCertificateConfiguration | None = None

    def _observe(self) -> None:
        for setting, when in self.admitted.expiries().items():
            metrics.TLS_EXPIRY.labels(setting).set(when)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS whose certificate and client CA a reload can replace; None without TLS."""
        if self.admitted.tls is None:
            return None
        return grpc.dynamic_ssl_server_credentials(self.admitted.tls_configuration(), self._fetch,
                                                   require_client_authentication=self.admitted.tls[2] is not None)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC asks before every handshake: a reloaded configuration once, then None (keep it)."""
        with self._tls_lock:
            pending, self._tls_next = self._tls_next, None
        return pending

    def changed(self) -> bool:
        """Whether a file differs from what the last reload (or the start) read."""
        return files_digest(self.paths) != self.digest

    async def reload(self, auditor: Auditor, why: str) -> tuple[bool, str]:
        """Read the files again and apply them whole, or keep the set in use; audited either way.
        (applied, the record's message)."""
        async with self._lock:
            self.digest = await asyncio.to_thread(files_digest, self.paths)
            try:
                new = await asyncio.to_thread(read, self.cfg)
            except CredentialsError as exc:
                message = f"{why}: refused, the credentials in use stay: {exc}"
                code = "INVALID_ARGUMENT"
            else:
                message = f"{why}: " + ("; ".join(changes(self.admitted, new)) or "no change")
                code = "OK"
            # The record first: whoever finds the new set in force finds its record committed.
            await auditor.append(auditor.entry(RELOAD_METHOD, "cgsvc", "", "", "", None, code, message))
            metrics.CREDENTIAL_RELOADS.labels("applied" if code == "OK" else "refused").inc()
            if code != "OK":
                log.error("credentials reload refused", reason=message)
                return False, message
            self.authenticator.admit(new.tokens, new.certificates)
            if new.tls is not None and new.tls != self.admitted.tls:
                with self._tls_lock:
                    self._tls_next = new.tls_configuration()
            self.admitted = new
            self._observe()
            log.info("credentials reloaded", changes=message)
            return True, message

    async def poll(self, auditor: Auditor, seconds: float) -> None:
        """Reload whenever a file changes, looking every `seconds`."""
        while True:
            await asyncio.sleep(seconds)
            try:
                if await asyncio.to_thread(self.changed):
                    await self.reload(auditor, "reloaded: a credential file changed")
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the audit store may be away for a while: look again next time
                log.exception("credentials poll failed; looking again", retry_seconds=seconds)
