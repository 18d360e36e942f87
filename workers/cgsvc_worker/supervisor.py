"""The supervisor of a local worker group: one process per rank, forked from a fork server
that has imported torch once (and touched no CUDA), each on its own device; when one rank dies
the others are stopped, and the report names every failed rank.

    spawn_group(ns)   start ns.tp ranks (rank r on ns.devices[r] when given: it sees the
                      group's devices, its own as cuda:r; rank_environment says why)

The server's local dispatcher runs `cgsvc-worker bench ...` as this supervisor, in its own
session, so that a restarted server finds the group again and cancels it with one signal.

A group is followed: the server that follows it touches a file in its run directory about once
a second (`--follow-file`). With `--unfollowed-after SECONDS`, a group whose file nobody has
touched for that long (its server is down and has not come back, or its replica is gone for
good) is stopped here, with a report saying so (Unfollowed): a group nobody can reach does not
hold its devices for ever.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import sys
import time

from cgsvc.contract import ContractError, RankError, WorkerReport, read_report, write_report
from cgsvc_worker.runtime import EXIT_FAILED, rank_entry, rank_error_path


def rank_environment(rank: int, world: int, port: int, devices: list[str]) -> dict[str, str]:
    """The environment a rank starts with: torch.distributed's variables and, when the group
    was given GPUs, the group's GPUs visible, the rank's own being cuda:LOCAL_RANK (a CPU slot
    sees no GPU). All of them, not its own alone: NCCL reaches a peer GPU over NVLink through
    CUDA IPC, which needs the peer visible; with one GPU a process it falls back to the host's
    shared memory (vLLM and sglang show every rank the group's GPUs for the same reason).
    Another group's GPUs stay invisible."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    if devices:
        if devices[rank].startswith("cpu"):
            env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"] = "", "0"
        else:
            # the server's inventory numbers GPUs as nvidia-smi does (PCI order); CUDA's own default
            # order (fastest first) may differ on a machine of mixed GPUs
            env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"] = ",".join(devices), "PCI_BUS_ID"
    return env


# What the fork server imports once, so that each rank forked from it need not (each import of
# torch is ~2 s of CPU: four ranks on two cores waited ~4 s for theirs). Nothing here may touch
# CUDA: a rank's CUDA_VISIBLE_DEVICES is set after the fork, before CUDA starts in it.
PRELOAD = ["torch", "torch.distributed"]


def _spawned(ns: argparse.Namespace, rank: int, world: int, port: int) -> None:
    # Set before CUDA starts in this process (torch is imported, CUDA is not initialised), so
    # CUDA sees the group's devices and no other.
    os.environ.update(rank_environment(rank, world, port, device_list(ns)))
    sys.exit(rank_entry(ns))


def device_list(ns: argparse.Namespace) -> list[str]:
    return [d for d in (getattr(ns, "devices", "") or "").split(",") if d]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Unfollowed:
    """Whether the server still follows this group: the age of the follow file's last touch
    (counted from the start while it has none)."""

    KIND = "Unfollowed"  # the error_kind of the report of a group stopped for it

    def __init__(self, path: str, seconds: float) -> None:
        self.path, self.seconds = path, seconds
        self.since = time.time()

    def age(self) -> float:
        try:
            touched = os.stat(self.path).st_mtime
        except OSError:
            touched = 0.0
        return time.time() - max(self.since, touched)

    def lapsed(self) -> str:
        """Why the group is to stop, or '' while it is followed (or no limit is set)."""
        if not self.path or self.seconds <= 0 or (age := self.age()) <= self.seconds:
            return ""
        return (f"stopped by its supervisor: no cgsvc server followed this group for {age:.0f} s (the limit is "
                f"{self.seconds:g} s, the server's unfollowed_group_seconds): the server that started it stopped "
                "and did not come back, or its replica is gone")


def watch_for(ns: argparse.Namespace) -> Unfollowed:
    """The watch a group's `--follow-file` and `--unfollowed-after` ask for."""
    return Unfollowed(ns.follow_file, ns.unfollowed_after)


def spawn_group(ns: argparse.Namespace) -> int:
    """Start ns.tp ranks (from the fork server); when one fails (or nobody follows the group any more:
    Unfollowed), stop the others and report."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    watch = watch_for(ns)
    port = free_port()
    if device_list(ns) and len(device_list(ns)) != ns.tp:
        print(f"cgsvc-worker: --devices names {len(device_list(ns))} devices for --tp {ns.tp}", file=sys.stderr)
        return 2
    procs = [ctx.Process(target=_spawned, args=(ns, r, ns.tp, port), name=f"rank{r}") for r in range(ns.tp)]
    for p in procs:
        p.start()
    code, checked, why = 0, time.monotonic(), ""
    while any(p.is_alive() for p in procs):
        if time.monotonic() - checked >= 1.0:
            checked, why = time.monotonic(), watch.lapsed()
            if why:
                for p in procs:
                    p.terminate()
                break
        dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            code = dead[0].exitcode or EXIT_FAILED
            time.sleep(1.0)  # let the failed rank's report land, then stop the rest
            for p in procs:
                if p.is_alive():
                    p.terminate()
            break
        time.sleep(0.05)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    if why:
        print(f"cgsvc-worker: {why}", file=sys.stderr, flush=True)
        if ns.output:
            write_report(ns.output, WorkerReport.failed(why, Unfollowed.KIND))
            for r in range(ns.tp):  # the ranks' own reports say only that they were stopped
                with contextlib.suppress(OSError):
                    os.remove(rank_error_path(ns.output, r))
        return EXIT_FAILED
    codes = [p.exitcode for p in procs]
    failed: list[tuple[int, int | None]] = [(i, c) for i, c in enumerate(codes) if c not in (0, None)]
    if failed and ns.output:
        _merge_rank_errors(ns.output, failed)
    return code or next((c for _, c in failed if c and c > 0), EXIT_FAILED if failed else 0)


def _merge_rank_errors(output: str, failed: list[tuple[int, int | None]]) -> None:
    """Make sure the report says the run failed, naming each failed rank and its error."""
    errors = []
    for rank, code in failed:
        path = rank_error_path(output, rank)
        detail = ""
        if os.path.exists(path):
            try:
                detail = read_report(path).error
            except ContractError as exc:
                detail = f"its report is unreadable: {exc}"
            os.remove(path)
        errors.append(RankError(rank, code, detail))
    try:
        report = read_report(output)
    except ContractError:
        report = WorkerReport.failed("")
    if report.ok or not report.error:
        first = next((e for e in errors if e.error), errors[0])
        message = first.error or f"rank {first.rank} exited with code {first.exit_code}"
        report = WorkerReport.failed(message, report.error_kind)
    write_report(output, WorkerReport.failed(report.error, report.error_kind, tuple(errors),
                                             **{k: v for k, v in report.body.items()
                                                if k not in ("schema", "status", "error", "error_kind",
                                                             "rank_errors")}))
