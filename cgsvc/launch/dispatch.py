"""Dispatchers: how a launch's worker group is started, found again, and stopped.

The local dispatcher starts `cgsvc-worker` as a supervisor in its own session (never a fork
of the gRPC server: `subprocess` execs at once); the supervisor spawns one process per rank
with `spawn`, stops the whole group when a rank dies, and writes a report. Because the group
lives in its own session, a restarted server can find it again by pid and command line, and
cancellation reaches every rank with one signal to the process group.
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
from pathlib import Path


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    requests: int
    concurrency: int
    seed: int = 0


@dataclass(frozen=True)
class RunHandle:
    """Enough to find a running group again after a server restart."""

    dispatcher: str
    launch_id: str
    pid: int
    pgid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunHandle:
        return cls(**json.loads(text))


class DispatchError(Exception):
    """The dispatcher could not start a group (nothing was left running)."""


def bench_args(launch_id: str, run_dir: Path, model_path: str, tp: int, workload: Workload) -> list[str]:
    """`cgsvc-worker bench` arguments for a launch (every dispatcher runs the same worker code)."""
    return ["bench", "--model-path", model_path, "--tp", str(tp), "--plan", str(run_dir / "plan.json"),
            "--input-len", str(workload.input_len), "--output-len", str(workload.output_len),
            "--requests", str(workload.requests), "--concurrency", str(workload.concurrency),
            "--seed", str(workload.seed), "--launch-id", launch_id]


def worker_command(launch_id: str, run_dir: Path, model_path: str, tp: int, workload: Workload,
                   python: str = sys.executable) -> list[str]:
    return [python, "-m", "cgsvc_worker.cli", *bench_args(launch_id, run_dir, model_path, tp, workload),
            "--output", str(run_dir / "report.json"), "--events", str(run_dir / "events.jsonl"),
            "--log-dir", str(run_dir / "logs")]


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
    """Worker groups as local processes; capacity counted in ranks (devices)."""

    name = "local"

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def command(self, launch_id: str, run_dir: Path, model_path: str, tp: int, workload: Workload) -> list[str]:
        return worker_command(launch_id, run_dir, model_path, tp, workload)

    def check(self) -> str:
        """Why this dispatcher cannot take a launch now, or ''."""
        return ""

    def start(self, launch_id: str, run_dir: Path, model_path: str, tp: int, workload: Workload) -> RunHandle:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        log = open(run_dir / "logs" / "supervisor.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            proc = subprocess.Popen(self.command(launch_id, run_dir, model_path, tp, workload),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        except OSError as exc:
            raise DispatchError(f"cannot start the worker supervisor: {exc}") from None
        finally:
            log.close()
        self.procs[launch_id] = proc
        return RunHandle(self.name, launch_id, proc.pid, proc.pid)

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
    by a supervisor process in its own session; the server itself never imports Ray."""

    name = "ray"

    def __init__(self, address: str, slots: int, gpus_per_rank: float = 0.0) -> None:
        super().__init__(slots)
        self.address, self.gpus_per_rank = address, gpus_per_rank

    def command(self, launch_id: str, run_dir: Path, model_path: str, tp: int, workload: Workload) -> list[str]:
        return [sys.executable, "-m", "cgsvc_worker.ray_group", "--address", self.address, "--launch-id", launch_id,
                "--run-dir", str(run_dir), "--gpus-per-rank", str(self.gpus_per_rank), "--",
                *bench_args(launch_id, run_dir, model_path, tp, workload)]

    def check(self) -> str:
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                return ""
        except (OSError, ValueError) as exc:
            return f"the Ray cluster at {self.address} is not reachable ({exc})"
