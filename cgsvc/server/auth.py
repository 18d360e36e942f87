"""Principals and roles: bearer tokens (stored as SHA-256 hashes) and client certificates.

Token file (TOML):

    [[tokens]]
    principal = "ci-bot"
    roles = ["resolver"]
    sha256 = "<hex digest of the token>"      # `cgsvc token hash` prints it

    [[certificates]]                           # mutual TLS: certificate common name -> roles
    common_name = "orchestrator"
    roles = ["launcher"]
"""

from __future__ import annotations

import hashlib
import hmac
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
    "cgsvc.v1.LaunchService/*": ("launcher", "auditor", "admin"),
    "cgsvc.v1.ExperimentService/CreateExperiment": ("launcher", "admin"),
    "cgsvc.v1.ExperimentService/*": ("launcher", "auditor", "admin"),
    "cgsvc.v1.DiagnosticsService/*": ROLES,
}
PUBLIC_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                   "grpc.reflection.v1.ServerReflection")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...]

    def may_call(self, method: str) -> bool:
        """method is "/package.Service/Method"."""
        key = method.lstrip("/")
        allowed = PERMISSIONS.get(key) or PERMISSIONS.get(key.rsplit("/", 1)[0] + "/*") or ()
        return any(r in allowed for r in self.roles)


ANONYMOUS_LOCAL = Principal("local", ("admin",))  # an unauthenticated server on loopback


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class AuthError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
            with open(token_file, "rb") as fh:
                data = tomllib.load(fh)
            for i, t in enumerate(data.get("tokens", [])):
                self.tokens[str(t["sha256"]).lower()] = Principal(str(t["principal"]), self._roles(t, f"tokens[{i}]"))
            for i, c in enumerate(data.get("certificates", [])):
                self.certificates[str(c["common_name"])] = Principal(str(c["common_name"]),
                                                                     self._roles(c, f"certificates[{i}]"))

    @staticmethod
    def _roles(entry: dict[str, object], where: str) -> tuple[str, ...]:
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise ValueError(f"token file {where}.roles: each role must be one of {', '.join(ROLES)}")
        return tuple(str(r) for r in roles)

    def authenticate(self, metadata: dict[str, str], cert_common_name: str | None) -> Principal:
        auth = metadata.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise AuthError("UNAUTHENTICATED", "authorization metadata must be 'Bearer <token>'")
            digest = hash_token(token.strip())
            for known, principal in self.tokens.items():
                if hmac.compare_digest(known, digest):
                    return principal
            raise AuthError("UNAUTHENTICATED", "unknown bearer token")
        if cert_common_name is not None and cert_common_name in self.certificates:
            return self.certificates[cert_common_name]
        if not self.require:
            return self.anonymous
        raise AuthError("UNAUTHENTICATED", "this server requires a bearer token (authorization: Bearer <token>)"
                        + (" or a known client certificate" if self.certificates else ""))
