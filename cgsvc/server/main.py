"""`cgsvc`: the service command.

    cgsvc serve [--config FILE.toml] [--address HOST:PORT] [--data-dir DIR] [--database-url URL]
                [--tls-cert F --tls-key F [--tls-client-ca F]] [--token-file F] [--metrics-address HOST:PORT]
    cgsvc token new|revoke|check|hash ...   the token file's commands (cgsvc/server/token_commands.py)
    cgsvc store copy SOURCE TARGET          the whole database into an empty one (cgsvc/server/store_commands.py)
    cgsvc store verify WHERE [--checkpoint F]   a log checked where it lies, with no server

Every setting can also come from the environment as CGSVC_<NAME> (e.g. CGSVC_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import fcntl
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import structlog

from cgsvc import __version__
from cgsvc.server import store_commands, token_commands
from cgsvc.server.addresses import parse_host_port
from cgsvc.server.config import EVENT_LOOPS, ServerConfig, load_config, misspelt_environment
from cgsvc.server.token_commands import EXPIRY_WARNING_DAYS, token_warnings

# The server itself (gRPC, the stores, the services) is imported where it is served, not here:
# the audit writer's child process is started with spawn, which imports this module again first.


def configure_logging(level: str) -> None:
    """JSON on stderr, one object a line: the server's own records (structlog) and the libraries'
    (asyncio, gRPC, SQLAlchemy through the standard logging module) alike, each naming its logger."""
    number = getattr(logging, level.upper(), logging.INFO)
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=structlog.processors.JSONRenderer(),
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, stamp]))
    logging.basicConfig(handlers=[handler], level=number, force=True)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, stamp,
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr), cache_logger_on_first_use=True)


Runner = Callable[[Coroutine[Any, Any, int]], int]


def event_loop(choice: str) -> tuple[Runner, str]:
    """What runs the server's coroutine for `--event-loop choice`, and the start-up line naming it.
    uvloop (libuv's loop in C) costs the server about a tenth less CPU a request than asyncio's own
    loop, Echo and ResolvePlan alike (docs/decisions.md); `auto` takes it where it is installed."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ValueError("event_loop: uvloop is not installed (pip install uvloop; it has no Windows build); "
                                 "choose auto or asyncio") from None
            return asyncio.run, "event loop: asyncio (uvloop is not installed; --event-loop auto)"
        return uvloop.run, f"event loop: uvloop {uvloop.__version__} (--event-loop {choice})"
    return asyncio.run, "event loop: asyncio (--event-loop asyncio)"


def open_to_others(path: str | os.PathLike[str]) -> int:
    """The file's mode where users other than its owner may use it (0 where they may not)."""
    mode = os.stat(path).st_mode & 0o777
    return mode if mode & 0o077 else 0


def metrics_host_port(address: str) -> tuple[str, int]:
    """--metrics-address as (host, port); ValueError naming the form otherwise."""
    parsed = parse_host_port(address)
    if parsed is None or not parsed[0]:
        raise ValueError(f"must be HOST:PORT (port 0-65535, 0 picks one; an IPv6 host in brackets; empty turns it "
                         f"off), got {address!r}")
    return parsed


def start_metrics(address: str) -> str:
    if not address:
        return ""
    from prometheus_client import start_http_server

    from cgsvc.server import metrics

    host, port = metrics_host_port(address)
    try:
        server, _thread = start_http_server(port, addr=host.strip("[]"), registry=metrics.REGISTRY)
    except OSError as exc:
        raise ValueError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    return f"http://{host}:{server.server_port}/metrics"


def config_warnings(cfg: ServerConfig, loopback: bool, key_path: Path, log_file: str, model_roots: Any,
                    metrics_url: str, admits: Any) -> list[str]:
    """What a start with this configuration warns of, each a line after "WARNING: ": serve prints
    them, and serve --check."""
    from cgsvc.server import app

    out = []
    if not cfg.authenticated and not loopback:
        out.append(f"--allow-insecure-remote: serving {cfg.address} with no authentication; every remote caller is "
                   "admin, audited as 'anonymous'. Configure token_file (with TLS) or tls_client_ca.")
    elif not cfg.authenticated:
        out.append("insecure local mode: no authentication; every local caller is admin (audited as 'local'). "
                   "Configure tls_cert/tls_key and token_file before exposing this server.")
    out += misspelt_environment()
    if key_path.exists() and (key_mode := open_to_others(key_path)):
        out.append(f"signing key {key_path} is readable beyond its owner (mode {key_mode:04o}): whoever can read it "
                   "can sign checkpoints of a rewritten log; chmod 600 it.")
    if os.path.isdir(cfg.data_dir) and (dir_mode := open_to_others(cfg.data_dir)):
        out.append(f"data_dir {cfg.data_dir} is open to other users (mode {dir_mode:04o}); the server makes its "
                   "files there 0600, but chmod 700 it: a file made by hand, or before, may be readable.")
    if log_file and (log_mode := open_to_others(log_file)):
        out.append(f"audit log {log_file} is readable beyond its owner (mode {log_mode:04o}): anyone who can read "
                   "it reads every record without the auditor role; chmod 600 it (and its -wal and -shm files).")
    if not model_roots.dirs and not loopback:
        out.append("checkpoint paths unconfined: a caller's model.path or model_path may name any directory "
                   "this server can read; --model-roots confines them.")
    if metrics_url and not app.is_loopback(cfg.metrics_address):
        out.append(f"metrics at {metrics_url} are served beyond loopback with no authentication (Prometheus's "
                   "way): anyone who reaches it sees RPC and audit counts; firewall it or bind a loopback address.")
    now = time.time()
    out += token_warnings(admits.admitted.tokens, admits.admitted.certificates, now)
    for setting, when in admits.admitted.expiries().items():
        if when - now < EXPIRY_WARNING_DAYS * 86400:
            stamp = dt.datetime.fromtimestamp(when, dt.UTC).isoformat()
            out.append(f"{setting}: " + (f"the certificate expired at {stamp}: clients will refuse the handshake"
                                         if when <= now else
                                         f"the certificate expires at {stamp}, in {(when - now) / 86400:.1f} days")
                       + "; renew it and reload (SIGHUP)")
    return out


def transport(cfg: ServerConfig) -> str:
    """"transport: TLS; authentication: bearer tokens": what callers cross and present."""
    mode = ("TLS" + (" + client certificates" if cfg.tls_client_ca else "")) if cfg.secure else "insecure (no TLS)"
    auth = "bearer tokens" if cfg.token_file else ("client certificates" if cfg.tls_client_ca else "none")
    return f"transport: {mode}; authentication: {auth}"


def refused(message: str, output: str) -> int:
    """A configuration that would not start: exit 2, said on stderr as serve says it, or under -o
    json as {"starts": false, "error"} naming the setting the message names first."""
    if output != "json":
        print(f"cgsvc: {message}", file=sys.stderr)
        return 2
    named = {}
    for f in dataclasses.fields(ServerConfig):
        at = [i for i in (message.find(f.name), message.find("--" + f.name.replace("_", "-"))) if i >= 0]
        if at:
            named[f.name] = min(at)
    field = min(named, key=lambda name: named[name]) if named else "configuration"
    print(json.dumps({"starts": False, "error": {"code": "INVALID_ARGUMENT", "message": message,
                                                 "field_violations": [{"field": field, "description": message}]}},
                     indent=2))
    return 2


def check(cfg: ServerConfig, loop_line: str = "", output: str = "table") -> int:
    """`serve --check`: every check a start makes, what it would make and what it would warn of,
    with nothing made or written: no data directory, no key file, no database file, no migration.
    Exit 0 when this configuration starts, 2 naming the first thing that stops it (as serve)."""
    import sqlalchemy as sa

    from cgsvc.audit import keys
    from cgsvc.audit.store import STORE_SCHEMA, probe
    from cgsvc.server import app, signing
    from cgsvc.server.addresses import cannot_listen

    def refuse(message: str) -> int:
        return refused(message, output)

    try:
        if cfg.metrics_address:
            metrics_host_port(cfg.metrics_address)
        p = app.prepare(cfg, dry=True)
    except ValueError as exc:  # ConfigError too
        return refuse(f"metrics_address: {exc}" if not isinstance(exc, app.ConfigError) else str(exc))
    notes = list(p.notes)
    if cfg.metrics_address and (why := cannot_listen(cfg.metrics_address)):
        notes.append(f"metrics_address {cfg.metrics_address}: cannot listen now ({why})")
    lock = Path(cfg.data_dir) / "instance"
    if lock.is_file():
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                notes.append(f"data_dir {cfg.data_dir} is in use by a running cgsvc server: a start is refused "
                             "until it stops")
    url = cfg.effective_database_url
    try:
        found = probe(url)
    except sa.exc.SQLAlchemyError as exc:
        return refuse(f"database: cannot read {_redact(url)}: {str(exc).splitlines()[0]}")
    ours = keys.own_key_id(p.signing_key) if p.signing_key is not None else ""
    if found is None or found.schema_version == 0:
        database = f"no cgsvc schema yet: a start makes schema {STORE_SCHEMA}"
    elif found.schema_version < STORE_SCHEMA:
        database = (f"schema {found.schema_version}: a start applies migrations {found.schema_version + 1}-"
                    f"{STORE_SCHEMA}")
    else:
        database = f"schema {found.schema_version}" + (" (this release's)" if found.schema_version == STORE_SCHEMA
                                                       else f", newer than this release's {STORE_SCHEMA}")
    if found is not None:
        database += f", {found.records} audit records"
    key_line = f"signing key {p.key_path}: " + (f"key {ours}" if ours else "generated at start")
    if found is not None and found.log_key is not None:
        generation, log_id = found.log_key
        if not ours:
            return refuse(f"signing_key: {p.key_path} does not exist, and this log's checkpoints are signed by key "
                          f"{log_id}: a start would generate another key and refuse to sign for this log; give the "
                          "log's key with --signing-key")
        if ours == log_id:
            key_line += ", the log's key"
        elif p.previous_key is not None:
            if (retiring := keys.own_key_id(p.previous_key)) != log_id:
                return refuse(signing.not_the_retiring_key(retiring, log_id))
            notes.append(f"a start rotates this log's key from {log_id} to {ours}, endorsed by the old key")
        elif cfg.replace_lost_signing_key:
            notes.append(f"a start replaces this log's key {log_id} with {ours} WITHOUT its endorsement "
                         "(--replace-lost-signing-key): every witness will refuse it")
        else:
            return refuse(signing.not_the_logs_key(log_id, generation, ours))
    metrics_url = f"http://{cfg.metrics_address}/metrics" if cfg.metrics_address else ""
    log_file = (sa.engine.make_url(url).database or "") if url.startswith("sqlite") and found is not None else ""
    checked = [transport(cfg),
               f"local devices: {', '.join(p.inventory.devices)} ({p.inventory.source})",
               key_line, f"database: {_redact(url)}: {database}", *([loop_line] if loop_line else []),
               *([retention_line(cfg.launch_retention_days)] if cfg.launch_retention_days > 0 else [])]
    warnings = config_warnings(cfg, p.loopback, p.key_path, log_file, p.model_roots, metrics_url, p.admits)
    if output == "json":
        print(json.dumps({"starts": True, "address": cfg.address, "ok": checked, "notes": notes,
                          "warnings": warnings}, indent=2))
        return 0
    print(f"cgsvc {__version__} serve --check: {cfg.address}")
    for line in checked:
        print(f"ok: {line}")
    for note in notes:
        print(f"note: {note}")
    for warning in warnings:
        print(f"WARNING: {warning}")
    print("this configuration starts" + (" (see the notes)" if notes else ""))
    return 0


async def serve(cfg: ServerConfig, loop_line: str = "") -> int:
    from cgsvc import tls
    from cgsvc.launch.dispatch import HOST
    from cgsvc.server import app, metrics

    log = structlog.get_logger("cgsvc")
    try:  # before the server: a bad address must stop the start before anything is opened
        metrics_url = start_metrics(cfg.metrics_address)
    except ValueError as exc:
        print(f"cgsvc: metrics_address: {exc}", file=sys.stderr)
        return 2
    # What the server makes is its own: the audit log (SQLite, its WAL), the signing key, the
    # launches' plans and logs; a record is not for every user of the machine to read.
    os.umask(0o077)
    running = await app.start(cfg)
    running_loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    metrics.SERVER_INFO.labels(__version__, running_loop).set(1)
    # What start-up made (every module's objects: protobuf, gRPC, SQLAlchemy, scipy) lives as long
    # as the process; out of the collector's sight, a full collection walks only what serving
    # made since. Before, it walked them all every few seconds under load and held the event loop,
    # every call in flight with it, for 70-90 ms: that set p99 (docs/decisions.md).
    gc.collect()
    gc.freeze()
    metrics.time_gc_pauses()
    host = cfg.address.rsplit(":", 1)[0]
    # The first line is for people and scripts alike (port 0 prints the port picked).
    print(f"cgsvc {__version__} listening on {host}:{running.port}", flush=True)
    loopback = running.extras["loopback"]
    admits = running.extras["credentials"]
    if loop_line:
        print(loop_line, flush=True)
    inventory = running.extras["devices"]
    print(f"local devices: {', '.join(inventory.devices)} ({inventory.source})", flush=True)
    settled = running.extras["signing"]
    print(settled.line(), flush=True)
    if settled.rotation is not None and settled.rotation.reason == "replaced":
        print(f"WARNING: --replace-lost-signing-key: key {settled.key_id} now signs this log with nothing from the "
              f"old key {settled.rotation.previous_key_id} vouching for it ({settled.rotation.record}); every witness "
              "will refuse it until its keeper re-pins it (audit witness --key-id on a new directory).", flush=True)
    for warning in config_warnings(cfg, loopback, running.extras["signing_key_path"], running.store.sqlite_path,
                                   running.extras["model_roots"], metrics_url, admits):
        print(f"WARNING: {warning}", flush=True)
    if roots := running.extras["model_roots"].dirs:
        print(f"checkpoint paths: under {', '.join(roots)} (--model-roots)", flush=True)
    if cfg.launch_retention_days > 0:
        print(retention_line(cfg.launch_retention_days), flush=True)
    if admits.paths:
        poll = cfg.credentials_poll_seconds
        print(f"credentials: SIGHUP reloads {', '.join(admits.paths)}"
              + (f" (and a change is looked for every {poll:g} s)" if poll > 0 else ""), flush=True)
    launches = running.extras["launches"]
    if launches.shared:  # what the other replicas name when a caller asks them for this one's launch logs
        how = "--advertise-address" if cfg.advertise_address else "the bound address; --advertise-address to change"
        print(f"replica replicas/{launches.instance} on {HOST}, reached at {launches.address} ({how})", flush=True)
        served = running.extras["credentials"].admitted.tls
        advertised_host = launches.address.rsplit(":", 1)[0]
        if served is not None and not tls.covers(served[0], advertised_host):
            print(f"WARNING: tls_cert's certificate is not valid for {advertised_host} (it names "
                  f"{', '.join(tls.names(served[0])) or 'nothing'}): clients sent to {launches.address} for this "
                  "replica's launch logs will refuse the handshake; advertise a name the certificate carries "
                  "(--advertise-address)", flush=True)
    print(f"{transport(cfg)}; database: "
          f"{running.store.dialect} ({_redact(cfg.effective_database_url)}); metrics: {metrics_url or 'off'}",
          flush=True)
    log.info("started", address=f"{host}:{running.port}", database=running.store.dialect)
    for note in running.extras["recovered"]:
        print(f"launch recovery: {note}", flush=True)


    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[Any]] = set()

    async def reload() -> None:
        try:
            _applied, message = await admits.reload(running.extras["auditor"], "reloaded on SIGHUP")
            print(f"credentials {message}", flush=True)
        except Exception:  # noqa: BLE001 - the audit store may be away: the set in use stays, say so
            log.exception("credentials reload failed; the credentials in use stay")

    def on_hup() -> None:
        task = asyncio.create_task(reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    if admits.paths:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    await stop.wait()
    log.info("stopping", grace_seconds=cfg.shutdown_grace_seconds)
    await running.stop(cfg.shutdown_grace_seconds)
    log.info("stopped")
    return 0


def retention_line(days: float) -> str:
    return (f"launch logs: removed {days:g} days after an ended launch's last change, audited "
            "(--launch-retention-days; its report and records are kept)")


def _redact(url: str) -> str:
    from cgsvc.audit.records import mask_secrets

    return str(mask_secrets(url))


def parser() -> argparse.ArgumentParser:
    """`cgsvc`'s command line: serve (every ServerConfig setting a flag), token and store."""
    ap = argparse.ArgumentParser(prog="cgsvc", description="The cgsvc plan, audit and launch service.")
    ap.add_argument("--version", action="version", version=f"cgsvc {__version__}", help="print the release and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gRPC server", description="Run the gRPC server. Every flag is also a "
                       "[server] key in --config FILE.toml and an environment variable CGSVC_<NAME>; flags win.")
    s.add_argument("--config", help="TOML file with a [server] table of the settings below")
    for f in dataclasses.fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        text = f"{f.metadata['help']} (default: {f.default!r})"
        if f.type in ("bool", bool):
            s.add_argument(flag, action="store_const", const=True, default=None, help=text)
        else:
            s.add_argument(flag, default=None, help=text)
    s.add_argument("--check", action="store_true", help="check this configuration as a start would (TLS and token "
                   "files, keys, devices, the database and its key) and say what it would warn of, making and "
                   "writing nothing; exit 0 when it starts, 2 naming what stops it")
    s.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="with --check: table (default) or json ({\"starts\", \"ok\", \"notes\", \"warnings\"}, or "
                        "{\"starts\": false, \"error\"})")
    token_commands.register(sub)
    store_commands.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)

    if ns.command == "token":
        return token_commands.run(ns)
    if ns.command == "store":
        return store_commands.run(ns)
    try:
        cfg = load_config(ns.config, overrides={f.name: getattr(ns, f.name) for f in dataclasses.fields(ServerConfig)})
        run, loop_line = event_loop(cfg.event_loop)
    except (OSError, ValueError) as exc:
        if ns.check:
            return refused(f"configuration error: {exc}", ns.output)
        print(f"cgsvc: configuration error: {exc}", file=sys.stderr)
        return 2
    if ns.check:
        return check(cfg, loop_line, ns.output)
    configure_logging(cfg.log_level)
    # The logs on stderr are JSON, a line each; gRPC's C core would add lines of its own (a client's
    # failed TLS handshake, at INFO), so it logs errors only unless GRPC_VERBOSITY says otherwise. It
    # is read once, when grpc is first imported: here, before the server's modules are.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from cgsvc.server import app

    try:
        return run(serve(cfg, loop_line))
    except app.ConfigError as exc:
        print(f"cgsvc: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
