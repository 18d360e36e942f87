"""Server configuration: defaults < TOML file < environment (CGSVC_*) < command-line flags."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServerConfig:
    address: str = "127.0.0.1:50051"
    data_dir: str = "var/cgsvc"
    database_url: str = ""  # default: sqlite file under data_dir
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""  # set to require client certificates (mutual TLS)
    token_file: str = ""  # set to require bearer tokens
    metrics_address: str = "127.0.0.1:0"  # "" disables the Prometheus endpoint
    max_message_bytes: int = 4 * 1024 * 1024
    max_concurrent_rpcs: int = 1000
    shutdown_grace_seconds: float = 10.0
    allow_insecure_remote: bool = False
    log_level: str = "info"
    audit_max_batch: int = 256
    local_slots: int = 4  # devices (ranks) the local dispatcher may run at once
    ray_address: str = ""  # HOST:PORT of a Ray cluster's GCS; enables the Ray dispatcher
    ray_slots: int = 8  # devices the Ray dispatcher may hold at once
    ray_gpus_per_rank: float = 0.0  # 1 on GPU clusters; 0 places CPU bundles

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.data_dir).resolve() / 'cgsvc.db'}"

    @property
    def secure(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @property
    def authenticated(self) -> bool:
        return bool(self.token_file) or bool(self.tls_client_ca)


def _coerce(field: dataclasses.Field[Any], raw: Any, origin: str) -> Any:
    typ = field.type if isinstance(field.type, str) else field.type.__name__
    try:
        if typ == "bool":
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if typ == "int":
            return int(raw)
        if typ == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{origin}: {field.name} must be a {typ}, got {raw!r}") from None


def load_config(file: str | None = None, env: Mapping[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Build the configuration; unknown keys in the file are an error naming them."""
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    values: dict[str, Any] = {}
    if file:
        with open(file, "rb") as fh:
            data = tomllib.load(fh)
        section = data.get("server", data)
        unknown = sorted(set(section) - set(fields))
        if unknown:
            raise ValueError(f"{file}: unknown keys {unknown}; valid: {', '.join(fields)}")
        values.update({k: _coerce(fields[k], v, file) for k, v in section.items()})
    environ: Mapping[str, str] = os.environ if env is None else env
    for name, f in fields.items():
        key = f"CGSVC_{name.upper()}"
        if key in environ:
            values[name] = _coerce(f, environ[key], f"${key}")
    for name, v in (overrides or {}).items():
        if v is not None:
            values[name] = _coerce(fields[name], v, f"--{name.replace('_', '-')}")
    return ServerConfig(**values)
