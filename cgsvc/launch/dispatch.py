"""Dispatchers: how a launch's worker group is started, found again, and stopped.

The local dispatcher starts `cgsvc-worker` as a supervisor in its own session (never a fork
of the gRPC server: `subprocess` execs at once); the supervisor starts one process per rank,
forked from a fork server that imported torch once, each on its own device (`--devices`:
rank r sees the group's devices and takes the r-th, cuda:r), stops the whole group when a
rank dies (or when no server has followed it for `--unfollowed-after`), and writes a report.
Because the group lives in its own session, a restarted server can find it again by pid and
command line, and cancellation reaches every rank with one signal to the process group.

The Ray dispatcher runs the same worker code as rank actors of a placement group; there the
devices are the ones Ray assigns, and the workers report them (a `placed` event).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from cgsvc.contract import RunDir
from cgsvc.launch.devices import Inventory
from cgsvc.launch.store import LaunchRow

HOST = socket.gethostname()  # the machine a group's supervisor runs on (RunHandle.host)


@dataclass(frozen=True)
class RunHandle:
    """Enough to find a running group again after a server restart, or from another replica on
    the same machine (`host`; empty in handles stored before it was kept)."""

    dispatcher: str
    launch_id: str
    pid: int
    pgid: int
    host: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunHandle:
        return cls(**json.loads(text))


class DispatchError(Exception):
    """The dispatcher could not start a group (nothing was left running)."""


def bench_args(row: LaunchRow, run: RunDir, unfollowed_after: float = 0.0) -> list[str]:
    """`cgsvc-worker bench` arguments for a launch (every dispatcher runs the same worker code).
    `unfollowed_after`: seconds the group runs on with nobody touching run.followed (0: for ever)."""
    w = row.workload
    return ["bench", "--model-path", row.model_path, "--tp", str(row.tp), "--plan", str(run.plan),
            "--input-len", str(w.input_len), "--output-len", str(w.output_len), "--requests", str(w.requests),
            "--concurrency", str(w.concurrency), "--seed", str(w.seed), "--launch-id", row.launch_id,
            "--follow-file", str(run.followed), "--unfollowed-after", f"{unfollowed_after:g}",
            *row.engine.worker_args()]


def _proc_alive(pid: int, marker: str) -> bool:
    """The process exists, is not a zombie, and its command line carries the marker."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace")
    except OSError:
        return False
    return state != "Z" and marker in cmdline


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of a session: a group that left nothing behind has none."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


class LocalDispatcher:
    """Worker groups as local processes, one device per rank from the inventory."""

    name = "local"
    assigns_devices = True  # devices are chosen here, before start (Ray reports its own)

    def __init__(self, inventory: Inventory, unfollowed_after: float = 0.0) -> None:
        """`unfollowed_after`: seconds a group runs on once no server follows it (the server's
        unfollowed_group_seconds; 0: for ever)."""
        self.inventory = inventory
        self.unfollowed_after = unfollowed_after
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def slots(self) -> int:
        return len(self.inventory.devices)

    def command(self, row: LaunchRow, run: RunDir, gpu_plan: bool) -> list[str]:
        return [sys.executable, "-m", "cgsvc_worker.cli", *bench_args(row, run, self.unfollowed_after),
                "--devices", ",".join(row.devices),
                "--output", str(run.report), "--events", str(run.events), "--log-dir", str(run.logs)]

    def placement(self, row: LaunchRow, gpu_plan: bool) -> str:
        """How the devices were chosen, and any substitution of a GPU plan by CPU slots."""
        where = f"local devices {', '.join(row.devices)} ({self.inventory.source})"
        if gpu_plan and all(d.startswith("cpu") for d in row.devices):
            return f"{where}; substituted: the plan is for GPUs, this server has CPU slots only"
        return where

    def check(self) -> str:
        """Why this dispatcher cannot take a launch now, or ''."""
        return ""

    def start(self, row: LaunchRow, run: RunDir, gpu_plan: bool) -> RunHandle:
        run.logs.mkdir(parents=True, exist_ok=True)
        log = open(run.supervisor_log, "ab")  # noqa: SIM115 - owned by the child
        try:
            proc = subprocess.Popen(self.command(row, run, gpu_plan), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True)
        except OSError as exc:
            raise DispatchError(f"cannot start the worker supervisor: {exc}") from None
        finally:
            log.close()
        self.procs[row.launch_id] = proc
        return RunHandle(self.name, row.launch_id, proc.pid, proc.pid, HOST)

    def exit_code(self, handle: RunHandle) -> int | None:
        """The supervisor's exit status when it has ended, else None. A group started by an
        earlier server instance has no status to collect: its report says how it ended."""
        proc = self.procs.get(handle.launch_id)
        if proc is not None:
            code = proc.poll()
            if code is not None:
                self.procs.pop(handle.launch_id, None)
            return code
        return None if _proc_alive(handle.pid, handle.launch_id) else -1

    def alive(self, handle: RunHandle) -> bool:
        return _proc_alive(handle.pid, handle.launch_id)

    def stop(self, handle: RunHandle, grace: float = 5.0) -> None:
        """Stop every process of the group: SIGTERM, then SIGKILL after the grace period."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(handle.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and session_members(handle.pgid):
                self.exit_code(handle)  # reap the supervisor if it is ours
                time.sleep(0.05)
            if not session_members(handle.pgid):
                break
        self.exit_code(handle)


class RayDispatcher(LocalDispatcher):
    """Worker groups as rank actors in a Ray placement group (`cgsvc_worker.ray_group`), driven
    by a supervisor process in its own session; the server itself never imports Ray. A GPU
    plan asks Ray for one GPU per rank unless `gpus_per_rank` says otherwise (>= 0)."""

    name = "ray"
    assigns_devices = False

    def __init__(self, address: str, slots: int, gpus_per_rank: float = -1.0, unfollowed_after: float = 0.0) -> None:
        super().__init__(Inventory(tuple(f"ray{i}" for i in range(slots)), "Ray slots"), unfollowed_after)
        self.address, self.gpus_per_rank = address, gpus_per_rank

    def gpus_for(self, gpu_plan: bool) -> float:
        if self.gpus_per_rank >= 0:
            return self.gpus_per_rank
        return 1.0 if gpu_plan else 0.0

    def command(self, row: LaunchRow, run: RunDir, gpu_plan: bool) -> list[str]:
        return [sys.executable, "-m", "cgsvc_worker.ray_group", "--address", self.address, "--launch-id",
                row.launch_id, "--run-dir", str(run.path), "--gpus-per-rank", str(self.gpus_for(gpu_plan)), "--",
                *bench_args(row, run, self.unfollowed_after)]

    def placement(self, row: LaunchRow, gpu_plan: bool) -> str:
        gpus = self.gpus_for(gpu_plan)
        where = f"Ray placement group at {self.address}, {gpus:g} GPU per rank"
        if gpu_plan and gpus == 0:
            return f"{where}; substituted: the plan is for GPUs, the ranks run on CPU bundles (ray_gpus_per_rank=0)"
        return where

    def check(self) -> str:
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                return ""
        except (OSError, ValueError) as exc:
            return f"the Ray cluster at {self.address} is not reachable ({exc})"
