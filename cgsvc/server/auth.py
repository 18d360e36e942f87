"""Principals and roles: bearer tokens (stored as SHA-256 hashes) and client certificates.

Token file (TOML):

    [[tokens]]
    principal = "ci-bot"
    roles = ["resolver"]
    sha256 = "<hex digest of the token>"      # `cgsvc token hash` prints it
    expires = 2027-01-31T00:00:00Z            # optional: refused from then on (a date-time with an offset)

    [[certificates]]                           # mutual TLS: certificate common name -> roles
    common_name = "orchestrator"
    roles = ["launcher"]
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
import tomllib
from dataclasses import dataclass

ROLES = ("resolver", "launcher", "auditor", "admin")

# Which roles may call which methods ("Service/Method", or "Service/*").
PERMISSIONS: dict[str, tuple[str, ...]] = {
    "cgsvc.v1.PlanService/ResolvePlan": ("resolver", "launcher", "admin"),
    "cgsvc.v1.PlanService/GetPlan": ("resolver", "launcher", "auditor", "admin"),
    "cgsvc.v1.PlanService/ListPlans": ("resolver", "launcher", "auditor", "admin"),
    "cgsvc.v1.PlanService/ListPolicies": ROLES,
    "cgsvc.v1.PlanService/ListModels": ROLES,
    # Policy impact reads the whole audit history: those who may read the log.
    "cgsvc.v1.PlanService/ComputePolicyImpact": ("auditor", "admin"),
    "cgsvc.v1.AuditService/*": ("auditor", "admin"),
    "cgsvc.v1.LaunchService/CreateLaunch": ("launcher", "admin"),
    "cgsvc.v1.LaunchService/CancelLaunch": ("launcher", "admin"),
    "cgsvc.v1.LaunchService/UpdateLaunch": ("launcher", "admin"),
    "cgsvc.v1.LaunchService/*": ("launcher", "auditor", "admin"),
    "cgsvc.v1.ExperimentService/CreateExperiment": ("launcher", "admin"),
    "cgsvc.v1.ExperimentService/CancelExperiment": ("launcher", "admin"),
    "cgsvc.v1.ExperimentService/UpdateExperiment": ("launcher", "admin"),
    "cgsvc.v1.ExperimentService/*": ("launcher", "auditor", "admin"),
    "cgsvc.v1.DiagnosticsService/*": ROLES,
}
PUBLIC_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                   "grpc.reflection.v1.ServerReflection")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...]
    expires: float = 0.0  # seconds since the epoch from which its token is refused; 0: never
    credential: str = "none"  # how it is recognised: "bearer token", "client certificate" or "none"

    def expiry(self) -> str:
        """When its token expires (ISO 8601, UTC), or "" for never."""
        return dt.datetime.fromtimestamp(self.expires, dt.UTC).isoformat() if self.expires else ""

    def may_call(self, method: str) -> bool:
        """method is "/package.Service/Method"."""
        key = method.lstrip("/")
        allowed = PERMISSIONS.get(key) or PERMISSIONS.get(key.rsplit("/", 1)[0] + "/*") or ()
        return any(r in allowed for r in self.roles)


ANONYMOUS_LOCAL = Principal("local", ("admin",))  # an unauthenticated server on loopback


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


EMPTY_TOKEN_SHA256 = hashlib.sha256(b"").hexdigest()  # never a credential: refused in a token file


class AuthError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TokenFileError(ValueError):
    """A token file the server refuses to start with; the message names the file and the entry."""


_ENTRY_KEYS = {"tokens": ("principal", "roles", "sha256"), "certificates": ("common_name", "roles")}
_OPTIONAL_KEYS = {"tokens": ("expires",), "certificates": ()}


def load_token_file(path: str, text: str | None = None) -> tuple[dict[str, Principal], dict[str, Principal]]:
    """(principals by token SHA-256, principals by certificate common name), every entry checked:
    a typo must not leave a principal silently without its token, its roles, or at all. With
    `text`, that is checked as the file's content (what the file would hold after an edit)."""
    def bad(where: str, what: str) -> TokenFileError:
        return TokenFileError(f"token_file {path}: {where}: {what}")

    try:
        if text is None:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        else:
            data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"token_file {path}: not TOML: {exc}") from None
    except OSError as exc:
        raise TokenFileError(f"token_file {path}: {exc.strerror or exc}") from None
    unknown = sorted(set(data) - set(_ENTRY_KEYS))
    if unknown:
        raise bad(unknown[0], "unknown key; a token file holds [[tokens]] and [[certificates]] tables only")
    tokens: dict[str, Principal] = {}
    certificates: dict[str, Principal] = {}
    for table, keys in _ENTRY_KEYS.items():
        entries = data.get(table, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise bad(table, f"must be an array of tables ([[{table}]]), got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            where = f"{table}[{i}]"
            extra = sorted(set(entry) - set(keys) - set(_OPTIONAL_KEYS[table]))
            if extra:
                raise bad(f"{where}.{extra[0]}", f"unknown key; an entry holds {', '.join(keys)}"
                          + "".join(f" and optionally {k}" for k in _OPTIONAL_KEYS[table]))
            for key in keys:
                if key not in entry:
                    raise bad(f"{where}.{key}", "missing")
            roles = entry["roles"]
            if not isinstance(roles, list) or any(r not in ROLES for r in roles):
                raise bad(f"{where}.roles", f"a list of roles, each one of {', '.join(ROLES)}; got {roles!r}")
            name_key = "principal" if table == "tokens" else "common_name"
            name = entry[name_key]
            if not isinstance(name, str) or not name.strip():
                raise bad(f"{where}.{name_key}", f"a non-empty string, got {name!r}")
            expires = entry.get("expires")
            if expires is not None and not (isinstance(expires, dt.datetime) and expires.tzinfo is not None):
                raise bad(f"{where}.expires", "a TOML date-time with an offset, e.g. 2027-01-31T00:00:00Z (unquoted); "
                                              f"got {expires!r}")
            principal = Principal(name, tuple(roles), expires.timestamp() if expires else 0.0,
                                  "bearer token" if table == "tokens" else "client certificate")
            if table == "certificates":
                if name in certificates:
                    raise bad(f"{where}.common_name", f"{name!r} is given twice")
                certificates[name] = principal
                continue
            digest = entry["sha256"]
            if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest)):
                raise bad(f"{where}.sha256", "the token's SHA-256 as 64 hex digits (`cgsvc token hash TOKEN` prints "
                                             "it), never the token itself")
            if digest.lower() == EMPTY_TOKEN_SHA256:
                raise bad(f"{where}.sha256", "the SHA-256 of an empty token, which admits nobody's secret: hash the "
                                             "token itself (cgsvc token new makes one)")
            if digest.lower() in tokens:
                raise bad(f"{where}.sha256", f"the same token as {tokens[digest.lower()].name!r}'s")
            tokens[digest.lower()] = principal
    return tokens, certificates


class Authenticator:
    """Maps request credentials to a Principal, or raises AuthError."""

    def __init__(self, token_file: str = "", require: bool = False, anonymous: str = "local") -> None:
        # Who an unauthenticated server's callers are: "local" on loopback, "anonymous" when
        # --allow-insecure-remote serves everyone (every audit record then says so).
        self.anonymous = Principal(anonymous, ("admin",))
        self.tokens: dict[str, Principal] = {}
        self.certificates: dict[str, Principal] = {}
        self.require = require or bool(token_file)
        if token_file:
            self.admit(*load_token_file(token_file))

    def admit(self, tokens: dict[str, Principal], certificates: dict[str, Principal]) -> None:
        """Serve these principals from the next call on (a credentials reload)."""
        self.tokens, self.certificates = tokens, certificates

    def authenticate(self, metadata: dict[str, str], cert_common_name: str | None) -> Principal:
        auth = metadata.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError("UNAUTHENTICATED", "authorization metadata must be 'Bearer <token>'")
            digest = hash_token(token.strip())
            for known, principal in self.tokens.items():
                if hmac.compare_digest(known, digest):
                    if principal.expires and time.time() >= principal.expires:
                        raise AuthError("UNAUTHENTICATED", f"the bearer token of principal {principal.name!r} "
                                                           f"expired at {principal.expiry()}")
                    return principal
            raise AuthError("UNAUTHENTICATED", "unknown bearer token")
        if cert_common_name is not None and cert_common_name in self.certificates:
            return self.certificates[cert_common_name]
        if not self.require:
            return self.anonymous
        raise AuthError("UNAUTHENTICATED", "this server requires a bearer token (authorization: Bearer <token>)"
                        + (" or a known client certificate" if self.certificates else ""))
