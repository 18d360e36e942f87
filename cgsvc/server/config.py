"""Server configuration: defaults < TOML file < environment (CGSVC_*) < command-line flags."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cgsvc.launch.devices import MAX_LOCAL_DEVICES, MAX_RAY_SLOTS
from cgsvc.server.addresses import check_advertised, parse_host_port

CLIENT_ENVIRONMENT = ("CGSVC_SERVER", "CGSVC_TOKEN")  # read by cgsvc-cli, not by the server


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


EVENT_LOOPS = ("auto", "uvloop", "asyncio")
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_MESSAGE_BYTES = 64 * 1024
INT32_MAX = 2**31 - 1
MAX_RETENTION_DAYS = 36500  # a hundred years: past it, a date overflows


@dataclass(frozen=True)
class ServerConfig:
    """Every setting, with the help line `cgsvc serve --help` prints for its flag."""

    address: str = _opt("127.0.0.1:50051", "HOST:PORT to serve gRPC on (port 0 picks a free one; an IPv6 host in "
                        "brackets, [::1]:50051)")
    advertise_address: str = _opt("", "HOST:PORT that clients reach this server at, where the address it binds "
                                      "is not (a wildcard, a port behind a NAT): replicas name it for the launch "
                                      "logs on their disk; default: the bound address, with this machine's name "
                                      "for a wildcard host")
    data_dir: str = _opt("var/cgsvc", "directory for the SQLite database, launch run directories and logs")
    database_url: str = _opt("", "URL of the audit/launch database: sqlite:///PATH or "
                                 "postgresql+psycopg://USER@HOST:PORT/DB (postgres:// and postgresql:// mean the "
                                 "same; default: SQLite under data_dir); a PostgreSQL URL lets replicas share one log")
    tls_cert: str = _opt("", "PEM certificate for TLS (with --tls-key)")
    tls_key: str = _opt("", "PEM private key for TLS (with --tls-cert)")
    tls_client_ca: str = _opt("", "PEM CA bundle: require client certificates signed by it (mutual TLS)")
    token_file: str = _opt("", "file of bearer-token hashes, principals and roles (cgsvc token hash); requires "
                               "tokens")
    credentials_poll_seconds: float = _opt(0.0, "how often to look for a changed token file or TLS file and reload "
                                                "it (as SIGHUP does), e.g. 30 where a Kubernetes Secret or "
                                                "cert-manager rewrites them; 0: only on SIGHUP")
    metrics_address: str = _opt("127.0.0.1:0", "HOST:PORT of the Prometheus endpoint; empty turns it off")
    max_message_bytes: int = _opt(4 * 1024 * 1024, "largest gRPC message accepted or sent, bytes")
    max_concurrent_rpcs: int = _opt(1000, "RPCs served at once; more wait")
    shutdown_grace_seconds: float = _opt(10.0, "on SIGTERM, how long in-flight RPCs may finish")
    allow_insecure_remote: bool = _opt(False, "serve a non-loopback address without TLS and tokens (warned)")
    log_level: str = _opt("info", "debug, info, warning or error (JSON lines on stderr)")
    event_loop: str = _opt("auto", "the server's event loop: auto (uvloop where it is installed, else asyncio's own), "
                                   "uvloop or asyncio")
    audit_max_batch: int = _opt(256, "most audit records committed in one group commit")
    audit_writer: str = _opt("process", "process (default: group commit in a writer process, off the event loop's "
                                        "GIL) or thread")
    audit_cohort_wait_ms: float = _opt(5.0, "how long the writer process holds a commit open until half of the "
                                            "appends waiting for an answer are in it (0: commit what is there at once)")
    audit_cohort_gap_ms: float = _opt(2.0, "within that wait, how long the writer waits for the next append before "
                                           "it commits what it has")
    signing_key: str = _opt("", "Ed25519 private key (PEM) that signs audit-log checkpoints; default: "
                                "data_dir/signing_key.pem, created at first start; replicas of one log share one key")
    previous_signing_key: str = _opt("", "the log's key until now (PEM), to rotate to --signing-key: the old key signs "
                                         "the handover into the log, and witnesses follow it; kept harmlessly after")
    replace_lost_signing_key: bool = _opt(False, "the log's key is lost: sign with --signing-key from now on, recorded "
                                                 "unendorsed (witnesses refuse it until re-pinned; warned)")
    model_roots: str = _opt("", "comma-separated directories that callers' checkpoint paths (a spec's model.path, a "
                                "launch's or experiment's model_path) must lie under, symlinks followed; empty: "
                                "any directory the server can read")
    local_devices: str = _opt("", "devices the local dispatcher gives ranks, e.g. 0,1,2,3 or 0-7 (GPU ids); "
                                  "default: this machine's GPUs, or --local-slots CPU slots without one")
    local_slots: int = _opt(4, "CPU slots (ranks at once) when the machine has no GPU and --local-devices is unset")
    lease_seconds: float = _opt(30.0, "on a shared (PostgreSQL) database: a replica whose lease has gone this long "
                                      "unrenewed is taken to be gone, and another takes over its launches and "
                                      "experiments; each replica renews its own every third of this")
    unfollowed_group_seconds: float = _opt(600.0, "a worker group that no server has followed for this long (its "
                                                  "server stopped and did not come back, or its replica is gone) "
                                                  "is stopped by its supervisor, reporting why; 0: never")
    launch_retention_days: float = _opt(0.0, "days an ended launch's logs and events are kept on this machine "
                                             "after its last change (its end, or a later relabel): then they are "
                                             "removed, audited (method launch.retention), and its report, plan and "
                                             "records stay; 0: kept for ever")
    ray_address: str = _opt("", "HOST:PORT of a Ray cluster's GCS; enables the Ray dispatcher")
    ray_slots: int = _opt(8, "ranks the Ray dispatcher may run at once")
    ray_gpus_per_rank: float = _opt(-1.0, "GPUs Ray gives each rank: -1 (default) one for a GPU plan and none "
                                          "for a CPU plan; 0 places CPU bundles (a GPU plan then reports the "
                                          "substitution)")

    def check(self) -> None:
        """Each setting that is a number or a name, within what works: ValueError naming the first
        that is not and what would be valid (before anything is opened)."""
        numbers = [(f.name, f.type, getattr(self, f.name)) for f in dataclasses.fields(self)]
        for name, typ, value in numbers:  # a duration goes to a sleep, a lease, a deadline
            if typ == "float" and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        bounds: tuple[tuple[str, bool, str], ...] = (
            ("event_loop", self.event_loop in EVENT_LOOPS, f"one of {', '.join(EVENT_LOOPS)}"),
            ("log_level", self.log_level.lower() in LOG_LEVELS, f"one of {', '.join(LOG_LEVELS)}"),
            ("audit_writer", self.audit_writer in ("process", "thread"), "process or thread"),
            ("lease_seconds", self.lease_seconds > 0, "more than 0"),
            ("unfollowed_group_seconds", self.unfollowed_group_seconds >= 0, "0 (never) or more"),
            ("credentials_poll_seconds", self.credentials_poll_seconds >= 0, "0 (only on SIGHUP) or more"),
            ("audit_cohort_wait_ms", self.audit_cohort_wait_ms >= 0, "0 or more"),
            ("audit_cohort_gap_ms", self.audit_cohort_gap_ms >= 0, "0 or more"),
            ("shutdown_grace_seconds", self.shutdown_grace_seconds >= 0, "0 or more"),
            ("launch_retention_days", 0 <= self.launch_retention_days <= MAX_RETENTION_DAYS,
             f"0 (kept for ever) or more, at most {MAX_RETENTION_DAYS}"),
            ("audit_max_batch", self.audit_max_batch >= 1, "at least 1"),
            ("max_concurrent_rpcs", self.max_concurrent_rpcs >= 1, "at least 1"),
            ("local_slots", 1 <= self.local_slots <= MAX_LOCAL_DEVICES, f"from 1 to {MAX_LOCAL_DEVICES}"),
            ("ray_slots", 1 <= self.ray_slots <= MAX_RAY_SLOTS, f"from 1 to {MAX_RAY_SLOTS}"),
            ("max_message_bytes", self.max_message_bytes >= MIN_MESSAGE_BYTES,
             f"at least {MIN_MESSAGE_BYTES} (64 KiB; a plan's answer alone is several KiB)"),
        )
        for name, ok, valid in bounds:
            if not ok:
                raise ValueError(f"{name} must be {valid}, got {getattr(self, name)!r}")
        for name, typ, value in numbers:  # what the bounds leave open goes to gRPC's C ints
            if typ == "int" and value > INT32_MAX:
                raise ValueError(f"{name} must be at most {INT32_MAX} (settings are 32-bit numbers, as gRPC's are), "
                                 f"got {value}")
        if parse_host_port(self.address) is None:
            # gRPC binds some other port for one it cannot parse (127.0.0.1:99999 served on a random one)
            raise ValueError(f"address must be HOST:PORT (port 0-65535, 0 picks a free one; an IPv6 host in "
                             f"brackets), got {self.address!r}")
        if self.advertise_address:
            try:
                check_advertised(self.advertise_address)
            except ValueError as exc:
                raise ValueError(f"advertise_address: {exc}") from None
        if self.database_url:
            from cgsvc.audit.store import store_url  # SQLAlchemy: only where a URL is given

            try:
                store_url(self.database_url)
            except ValueError as exc:
                raise ValueError(f"database_url: {exc}") from None

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            from cgsvc.audit.store import store_url

            return store_url(self.database_url)
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


def misspelt_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warnings for CGSVC_* variables that name no setting but nearly do (CGSVC_TOKEN_FIL): the
    operator meant a setting and the server runs without it. Other CGSVC_* variables (the CLI's
    CGSVC_SERVER, a test's) are left alone; the environment is shared, so this warns, never refuses."""
    known = [f"CGSVC_{f.name.upper()}" for f in dataclasses.fields(ServerConfig)] + list(CLIENT_ENVIRONMENT)
    out = []
    for key in sorted(os.environ if environ is None else environ):
        if key.startswith("CGSVC_") and key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
            if near:
                out.append(f"${key} is not a setting and is ignored; did you mean {near[0]}?")
    return out


def load_config(file: str | None = None, env: Mapping[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Build the configuration; unknown keys in the file are an error naming them."""
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    values: dict[str, Any] = {}
    if file:
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{file}: not TOML: {exc}") from None
        except OSError as exc:
            raise ValueError(f"config: {file}: {exc.strerror or exc}") from None
        section = data.get("server", data)
        if not isinstance(section, dict):
            raise ValueError(f"{file}: server must be a table ([server]) of the settings")
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
    cfg = ServerConfig(**values)
    cfg.check()
    return cfg
