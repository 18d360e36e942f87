"""Assembles the server: store, audit writer, pipeline, services, health, reflection, TLS."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import sqlalchemy as sa
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cgsvc import catalog
from cgsvc.audit import checkpoint
from cgsvc.audit.auditor import Auditor
from cgsvc.audit.records import mask_secrets
from cgsvc.audit.store import AuditStore
from cgsvc.audit.writer import AuditWriter, ProcessAuditWriter, Writer
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.launches import ACTIVE, Launches
from cgsvc.domain.plans import Plans
from cgsvc.launch.devices import DeviceListError, Inventory
from cgsvc.launch.dispatch import HOST, LocalDispatcher, RayDispatcher
from cgsvc.launch.store import ExperimentStore, LaunchStore
from cgsvc.server import credentials, metrics, reflection, signing
from cgsvc.server.addresses import advertised, cannot_listen, is_loopback
from cgsvc.server.auth import Authenticator
from cgsvc.server.config import ServerConfig
from cgsvc.server.experiment_service import ExperimentService
from cgsvc.server.interceptors import Pipeline
from cgsvc.server.launch_service import LaunchService
from cgsvc.server.services import (
    AuditService,
    DiagnosticsService,
    PlanService,
    ServerFacts,
    rejection_auditor,
)
from cgsvc.v1 import audit_pb2, diagnostics_pb2, experiment_pb2, launch_pb2, plan_service_pb2

SERVICES = {
    "cgsvc.v1.PlanService": plan_service_pb2.DESCRIPTOR.services_by_name["PlanService"],
    "cgsvc.v1.AuditService": audit_pb2.DESCRIPTOR.services_by_name["AuditService"],
    "cgsvc.v1.DiagnosticsService": diagnostics_pb2.DESCRIPTOR.services_by_name["DiagnosticsService"],
    "cgsvc.v1.LaunchService": launch_pb2.DESCRIPTOR.services_by_name["LaunchService"],
    "cgsvc.v1.ExperimentService": experiment_pb2.DESCRIPTOR.services_by_name["ExperimentService"],
}


log = structlog.get_logger("cgsvc.server")


class ConfigError(ValueError):
    """A configuration the server refuses to start with."""


def check_exposure(cfg: ServerConfig, loopback: bool) -> None:
    """The authentication rules (README, "Who may call"): beyond loopback every caller is
    authenticated, and bearer tokens travel only over TLS. --allow-insecure-remote is the one
    escape, and only from the first rule. `loopback`: is_loopback(cfg.address), resolved once."""
    if loopback:
        return
    if not cfg.authenticated and not cfg.allow_insecure_remote:
        raise ConfigError(
            f"refusing to serve {cfg.address}: this server would authenticate nobody (no token_file, no "
            "tls_client_ca), so every remote caller would be admin; configure token_file with tls_cert/tls_key, "
            "or tls_client_ca, or bind a loopback address, or pass --allow-insecure-remote to serve everyone as "
            "'anonymous'" + (" (TLS alone encrypts, it does not authenticate callers)" if cfg.secure else ""))
    if cfg.token_file and not cfg.secure:
        raise ConfigError(f"refusing to serve {cfg.address}: bearer tokens beyond loopback need TLS (tls_cert and "
                          "tls_key), or they cross the network in plaintext; --allow-insecure-remote does not lift "
                          "this")


def server_instance(data_dir: Path) -> tuple[str, IO[str]]:
    """This server's name as the owner of the launches it supervises, made once and kept in the
    data directory so that the same server started again knows its launches from other
    replicas' (docs/decisions.md); and the file, locked for as long as the server runs: two
    servers on one data directory would share that name and each start the other's launches."""
    handle = open(data_dir / "instance", "a+")  # noqa: SIM115 - held, locked, until the server stops
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(f"data_dir: {data_dir} is in use by another cgsvc server; give each server (each "
                          "replica) a data directory of its own") from None
    handle.seek(0)
    name = handle.read().strip()
    if not name:
        name = uuid.uuid4().hex[:12]
        handle.write(name + "\n")
        handle.flush()
    return name, handle


def check_tls_settings(cfg: ServerConfig) -> None:
    if not cfg.secure:
        if cfg.tls_cert or cfg.tls_key:
            raise ConfigError("TLS needs both tls_cert and tls_key")
        if cfg.tls_client_ca:
            raise ConfigError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")


@dataclass
class Running:
    """A started server and what it owns."""

    server: grpc.aio.Server
    port: int
    store: AuditStore
    writer: Writer
    health: health.HealthServicer
    extras: dict[str, Any] = field(default_factory=dict)

    async def stop(self, grace: float) -> None:
        self.health.enter_graceful_shutdown()
        if (lease := self.extras.get("lease")) is not None:
            lease.cancel()  # its row stays: a server restarted in time takes its launches back itself
        for task in ("credentials_poll", "retention"):
            if (running := self.extras.get(task)) is not None:
                running.cancel()
        pipeline = self.extras["pipeline"]
        pipeline.shutting_down()
        await self.server.stop(grace)
        if not await pipeline.drained(5.0):  # the calls it cut append their records before the writer closes
            log.warning("calls still unwinding at shutdown; their audit records may be missing",
                        calls=pipeline.inflight)
        await self.extras["experiments"].close()
        if metrics.LAUNCHES.launches is self.extras["launches"]:  # a scrape from now on reads no closed store
            metrics.LAUNCHES.launches = metrics.LAUNCHES.experiments = None
        await self.extras["launches"].close()
        await self.writer.aclose()
        self.store.close()
        self.extras["instance_lock"].close()  # the data directory is free for the next server


@dataclass
class Prepared:
    """What a start settles before it opens the database: every check of the configuration passed."""

    loopback: bool  # is_loopback(cfg.address), resolved once: every rule and warning of a start sees one answer
    inventory: Inventory
    authenticator: Authenticator
    admits: credentials.Credentials
    creds: grpc.ServerCredentials | None
    key_path: Path
    signing_key: Ed25519PrivateKey | None  # None only for a dry run where the file is absent (a start makes it)
    previous_key: Ed25519PrivateKey | None
    model_roots: catalog.ModelRoots
    notes: list[str] = field(default_factory=list)  # a dry run: what a start would make, or would meet


def _data_dir_problem(path: Path) -> str | None:
    """Why a start could not use `path` as its data directory, as a check can tell without making
    it: a file in its place, or a file (or a directory it may not write) where it would be made."""
    if path.exists():
        return None if path.is_dir() else f"{path} is a file, not a directory"
    above = next((p for p in path.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        return f"cannot make {path}: {os.strerror(errno.ENOTDIR)}"
    if above is not None and not os.access(above, os.W_OK | os.X_OK):
        return f"cannot make {path}: {os.strerror(errno.EACCES)}"
    return None


def prepare(cfg: ServerConfig, dry: bool = False) -> Prepared:
    """Every check a start makes before it opens the database, in its order; ConfigError at the
    first that fails. `dry` (serve --check) makes nothing: no data directory, no key file, and
    an address in use now (by the server a restart replaces) is noted rather than refused."""
    notes: list[str] = []
    loopback = is_loopback(cfg.address)
    check_exposure(cfg, loopback)
    check_tls_settings(cfg)
    try:
        cfg.check()  # as load_config does: a configuration made otherwise is checked all the same
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if why := cannot_listen(cfg.address):  # before anything is made or opened
        if not (dry and why == os.strerror(errno.EADDRINUSE)):
            raise ConfigError(f"address: cannot listen on {cfg.address}: {why}")
        notes.append(f"address {cfg.address} is in use now: a start succeeds once whatever listens there stops")
    if problem := _data_dir_problem(Path(cfg.data_dir)):
        raise ConfigError(f"data_dir: {problem}")
    if dry:
        if not Path(cfg.data_dir).is_dir():
            notes.append(f"data_dir {cfg.data_dir} does not exist: a start makes it (mode 0700)")
    else:
        try:
            os.makedirs(cfg.data_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"data_dir: cannot make {cfg.data_dir}: {exc.strerror or exc}") from None
    try:
        inventory = Inventory.local(cfg.local_devices, cfg.local_slots)
    except (DeviceListError, OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    authenticator = Authenticator(require=cfg.authenticated, anonymous="local" if loopback else "anonymous")
    try:  # before anything is opened: a bad token file or TLS file touches no database
        admits = credentials.Credentials(cfg, authenticator)
    except credentials.CredentialsError as exc:
        raise ConfigError(str(exc)) from None
    key_path = Path(cfg.signing_key or Path(cfg.data_dir) / "signing_key.pem")
    signing_key = None
    if dry and not key_path.exists():
        notes.append(f"signing key {key_path} does not exist: a start generates one (mode 0600)")
    else:
        try:
            signing_key = checkpoint.load_or_create_key(key_path)
        except (checkpoint.CheckpointError, OSError) as exc:
            raise ConfigError(f"signing_key: {exc}") from None
    previous_key = None
    if cfg.previous_signing_key:
        if cfg.replace_lost_signing_key:
            raise ConfigError("replace_lost_signing_key: give it or previous_signing_key, not both: a key that is "
                              "at hand endorses its successor")
        if not Path(cfg.previous_signing_key).is_file():
            raise ConfigError(f"previous_signing_key: {cfg.previous_signing_key}: no such file (the log's key until "
                              "now, a PEM Ed25519 private key)")
        try:
            previous_key = checkpoint.load_or_create_key(cfg.previous_signing_key)
        except (checkpoint.CheckpointError, OSError) as exc:
            raise ConfigError(f"previous_signing_key: {exc}") from None
    try:
        model_roots = catalog.ModelRoots.of([r.strip() for r in cfg.model_roots.split(",") if r.strip()])
    except ValueError as exc:
        raise ConfigError(f"model_roots: {exc}; give existing directories, comma-separated") from None
    return Prepared(loopback, inventory, authenticator, admits, admits.server_credentials(), key_path, signing_key,
                    previous_key, model_roots, notes)


async def start(cfg: ServerConfig) -> Running:
    """Start serving; returns once the port is bound. Raises ConfigError on a bad configuration."""
    p = prepare(cfg)
    loopback, inventory, authenticator, admits, creds = p.loopback, p.inventory, p.authenticator, p.admits, p.creds
    key_path, previous_key, model_roots = p.key_path, p.previous_key, p.model_roots
    assert p.signing_key is not None  # made when absent, as this start is not a dry one
    signing_key = p.signing_key
    instance, instance_lock = server_instance(Path(cfg.data_dir))  # before the database is touched
    try:
        store = AuditStore(cfg.effective_database_url)
    except sa.exc.SQLAlchemyError as exc:  # down, refused, or not a database: as `serve --check` says it
        instance_lock.close()
        raise ConfigError(f"database: cannot read {mask_secrets(cfg.effective_database_url)}: "
                          f"{str(exc).splitlines()[0]}") from None
    writer: Writer = (
        ProcessAuditWriter(store, cfg.audit_max_batch, metrics.observe_batch, cfg.audit_cohort_wait_ms / 1000,
                           cfg.audit_cohort_gap_ms / 1000)
        if cfg.audit_writer == "process" else AuditWriter(store, cfg.audit_max_batch, metrics.observe_batch))
    auditor = Auditor(store, writer)
    try:  # before anything is served: a replica must not sign with a key that is not the log's
        settled = await signing.settle(store, auditor, signing_key, previous_key, cfg.replace_lost_signing_key)
    except signing.SigningKeyError as exc:
        await writer.aclose()
        store.close()
        instance_lock.close()
        raise ConfigError(str(exc)) from None
    pipeline = Pipeline(authenticator, on_rejected=rejection_auditor(auditor))

    options = [("grpc.max_receive_message_length", cfg.max_message_bytes),
               ("grpc.max_send_message_length", cfg.max_message_bytes),
               ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=cfg.max_concurrent_rpcs)
    plans = Plans(auditor, model_roots)
    dispatchers = [LocalDispatcher(inventory, cfg.unfollowed_group_seconds)]
    if cfg.ray_address:
        dispatchers.append(RayDispatcher(cfg.ray_address, cfg.ray_slots, cfg.ray_gpus_per_rank,
                                         cfg.unfollowed_group_seconds))
    launches = Launches(LaunchStore(store), auditor, Path(cfg.data_dir).resolve() / "launches", dispatchers,
                        instance=instance, shared=store.dialect != "sqlite", lease_seconds=cfg.lease_seconds)
    experiments = Experiments(ExperimentStore(store), launches, plans)
    metrics.LAUNCHES.launches, metrics.LAUNCHES.experiments = launches, experiments
    metrics.launch_series(launches.dispatchers)
    launches.on_ended.append(metrics.observe_launch)
    facts = ServerFacts(instance, HOST, store.dialect, tuple(d.name for d in dispatchers), settled.key_id,
                        tuple(f"/{name}/{m.name}" for name, svc in SERVICES.items() for m in svc.methods))
    servicers: dict[str, Any] = {
        "cgsvc.v1.PlanService": PlanService(plans, cfg.max_message_bytes),
        "cgsvc.v1.AuditService": AuditService(store, signing_key, settled.key_id, cfg.max_message_bytes),
        "cgsvc.v1.DiagnosticsService": DiagnosticsService(facts),
        "cgsvc.v1.LaunchService": LaunchService(launches, plans, cfg.max_message_bytes),
        "cgsvc.v1.ExperimentService": ExperimentService(experiments, cfg.max_message_bytes),
    }
    descriptors = dict(SERVICES)
    server.add_generic_rpc_handlers([pipeline.service_handler(descriptors[name], servicers[name])
                                     for name in descriptors])
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*descriptors, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable(server, [*descriptors, health.SERVICE_NAME])
    try:
        port = server.add_secure_port(cfg.address, creds) if creds else server.add_insecure_port(cfg.address)
    except RuntimeError:  # taken since cannot_listen looked: gRPC's own "Failed to bind"
        port = 0
    if port == 0:
        await writer.aclose()
        store.close()
        instance_lock.close()
        raise ConfigError(f"address: cannot listen on {cfg.address} (taken as the server started?)")
    await server.start()
    launches.address = cfg.advertise_address or advertised(cfg.address, port, HOST)
    lease = None
    if launches.shared:  # other replicas may use the database: say this one is here, then watch theirs
        await asyncio.to_thread(launches.leases.renew, instance, HOST, launches.address)
        lease = asyncio.create_task(keep_lease(launches, experiments))
    recovered = await launches.recover() + await experiments.recover()
    poll = None
    if cfg.credentials_poll_seconds > 0 and admits.paths:
        poll = asyncio.create_task(admits.poll(auditor, cfg.credentials_poll_seconds))
    retention = asyncio.create_task(keep_retention(launches, cfg.launch_retention_days)) \
        if cfg.launch_retention_days > 0 else None
    return Running(server, port, store, writer, health_servicer,
                   {"servicers": servicers, "auditor": auditor, "launches": launches, "experiments": experiments,
                    "lease": lease, "recovered": recovered, "devices": inventory, "model_roots": model_roots,
                    "instance_lock": instance_lock, "loopback": loopback, "signing_key_path": key_path,
                    "credentials": admits, "credentials_poll": poll, "retention": retention, "pipeline": pipeline,
                    "key_id": settled.key_id, "signing": settled})


async def keep_retention(launches: Launches, days: float) -> None:
    """Remove the logs of launches ended `days` ago (Launches.remove_old_logs): at start, then
    every quarter of that time, at least every second and at most every hour."""
    while True:
        try:
            removed = await launches.remove_old_logs(days)
            metrics.LOGS_REMOVED.inc(len(removed))
            if removed:
                log.info("removed the logs of ended launches (launch_retention_days)", launches=removed, days=days)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a database or disk away for a while: try again next time
            log.exception("removing old launch logs failed; trying again")
        await asyncio.sleep(min(3600.0, max(1.0, days * 86400 / 4)))


FORGET_LEASES_AFTER = 24 * 3600.0  # seconds: a lapsed lease of a replica with nothing active is then deleted


async def keep_lease(launches: Launches, experiments: Experiments) -> None:
    """Renew this replica's lease every third of its lease time, and take over the launches and
    experiments of every replica whose lease has lapsed (docs/decisions.md)."""
    me, leases, seconds = launches.instance, launches.leases, launches.lease_seconds
    while True:
        await asyncio.sleep(seconds / 3)
        try:
            gap = await asyncio.to_thread(leases.renew, me, HOST, launches.address)
            if gap is not None:
                metrics.LEASE_GAP.set(gap)
            if gap is not None and gap >= seconds:
                metrics.LEASE_LAPSES.inc()
                log.warning("this replica's lease lapsed: other replicas may have taken over its launches, and it "
                            "lets go of each one they did", unrenewed_seconds=round(gap, 1), lease_seconds=seconds)
            for lease in await asyncio.to_thread(leases.lapsed, seconds, me, ACTIVE):
                before = launches.taken_over, experiments.taken_over
                for note in await launches.take_over(lease) + await experiments.take_over(lease):
                    log.warning(note, lapsed_owner=lease.owner)
                metrics.REPLICA_TAKEOVERS.labels("launch").inc(launches.taken_over - before[0])
                metrics.REPLICA_TAKEOVERS.labels("experiment").inc(experiments.taken_over - before[1])
            for owner in await asyncio.to_thread(leases.forget, max(FORGET_LEASES_AFTER, seconds), ACTIVE):
                log.info("forgot a replica's lease: it has not renewed it for a day and supervises nothing",
                         lapsed_owner=owner)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the database may be away for a while: try again next time
            log.exception("lease renewal or takeover failed; trying again", retry_seconds=round(seconds / 3, 1))
