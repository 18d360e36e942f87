"""A launch's worker group on a Ray cluster: a placement group of one bundle per rank
(STRICT_PACK: one node for a TP group), one actor per rank running the same worker code.

    python -m cgsvc_worker.ray_group --address HOST:PORT --launch-id ID --run-dir DIR \\
        [--gpus-per-rank 1] -- <cgsvc-worker bench arguments>

Started by the server's Ray dispatcher as a supervisor in its own session, like the local
one. It follows rank 0's events into DIR/events.jsonl, stops every actor when one dies or
when it is told to stop (SIGTERM), removes the placement group, and writes DIR/report.json
(cgsvc.contract). Actors are owned by this driver, so if it is killed they die with it.
Each actor's device is the one Ray assigned it; every rank is shown the group's GPUs (as the
local supervisor does, so that NCCL reaches its peers over NVLink) and takes its own as
cuda:rank, and reports it in its `placed` event.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cgsvc.contract import ContractError, RankError, RunDir, WorkerReport, read_report, write_report
from cgsvc_worker.cli import parser
from cgsvc_worker.runtime import rank_entry, rank_error_path
from cgsvc_worker.supervisor import Unfollowed, free_port, watch_for


# read_events has a thread of its own: an actor runs one call at a time in its default group,
# and run() lasts the whole workload, so the driver could read no event (a state, progress)
# until the run had ended.
@ray.remote(concurrency_groups={"events": 1})  # type: ignore[call-overload]  # the stubs omit it
class RankActor:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events = os.path.join(tempfile.mkdtemp(prefix=f"cgsvc-rank{rank}-"), "events.jsonl")

    def endpoint(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

    def assigned_gpus(self) -> str:
        """The GPU ids Ray assigned this actor ("" for a CPU bundle), as its CUDA_VISIBLE_DEVICES."""
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    @ray.method(concurrency_group="events")
    def read_events(self, offset: int) -> tuple[str, int]:
        try:
            with open(self.events, encoding="utf-8") as fh:
                fh.seek(offset)
                text = fh.read()
        except FileNotFoundError:
            return "", offset
        text = text[: text.rfind("\n") + 1]
        return text, offset + len(text.encode())

    def run(self, argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any]]:
        # Ray gave this actor its own CUDA_VISIBLE_DEVICES; `env` widens it to the group's GPUs
        # (its own is cuda:LOCAL_RANK) before CUDA starts here, as the local supervisor does.
        os.environ.update({"LOCAL_RANK": "0", **env})
        ns = parser().parse_args(argv)
        ns.events = self.events
        out = os.path.join(os.path.dirname(self.events), "report.json")
        ns.output = out
        code = rank_entry(ns)
        for path in (out, rank_error_path(out, self.rank)):
            if os.path.exists(path):
                try:
                    return code, read_report(path).to_dict()
                except ContractError as exc:
                    return code, WorkerReport.failed(f"rank {self.rank} wrote an unreadable report: {exc}").to_dict()
        return code, {}


def group_gpus(assigned: list[str], rank: int) -> dict[str, str]:
    """Rank `rank`'s view of the group's GPUs, from what Ray assigned each actor (in rank order):
    every GPU of the group visible, its own as cuda:rank, so that NCCL reaches the others over
    NVLink (supervisor.rank_environment says why). Nothing for CPU bundles, or an actor given
    other than one GPU."""
    if not all(a and "," not in a for a in assigned):
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(assigned), "LOCAL_RANK": str(rank)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="cgsvc_worker.ray_group", description=__doc__.split("\n")[0],
                                 epilog="After --: the `cgsvc-worker bench` arguments every rank runs.")
    ap.add_argument("--address", required=True, help="HOST:PORT of the Ray cluster's GCS")
    ap.add_argument("--launch-id", required=True, help="the launch this group runs (names the placement group)")
    ap.add_argument("--run-dir", required=True, help="the launch's run directory (events, report, logs)")
    ap.add_argument("--gpus-per-rank", type=float, default=0.0, help="GPUs per rank bundle (0: CPU bundles)")
    ap.add_argument("--place-timeout", type=float, default=60.0, help="seconds to wait for the placement group")
    ns = ap.parse_args(argv[:split])
    worker_argv = argv[split + 1:]
    ranks = parser().parse_args(worker_argv)  # what every rank runs
    tp, watch = ranks.tp, watch_for(ranks)  # the ranks' own flags say when nobody follows them
    run_dir = Path(ns.run_dir)
    report_path = str(RunDir(run_dir).report)
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        ray.init(address=ns.address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - any failure to connect ends here, reported
        write_report(report_path, WorkerReport.failed(f"Ray cluster at {ns.address} is not reachable: {exc}"))
        return 1
    bundle: dict[str, float] = {"CPU": 1.0, **({"GPU": ns.gpus_per_rank} if ns.gpus_per_rank else {})}
    pg = placement_group([bundle] * tp, strategy="STRICT_PACK", name=f"cgsvc-{ns.launch_id}")
    actors: list[Any] = []
    try:
        try:
            ray.get(pg.ready(), timeout=ns.place_timeout)
        except ray.exceptions.GetTimeoutError:
            write_report(report_path, WorkerReport.failed(f"cannot place {tp} x {bundle} on one node of the Ray "
                                                          f"cluster within {ns.place_timeout:.0f} s"))
            return 1
        actors = [RankActor.options(  # type: ignore[attr-defined]
            num_cpus=1, num_gpus=ns.gpus_per_rank or 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)).remote(r)
            for r in range(tp)]
        host, port = ray.get(actors[0].endpoint.remote())
        env = {"WORLD_SIZE": str(tp), "MASTER_ADDR": host, "MASTER_PORT": str(port)}
        logs = ["--log-dir", str(run_dir / "logs")]
        assigned = ray.get([a.assigned_gpus.remote() for a in actors])
        refs = {actors[r].run.remote(worker_argv + logs, {**env, **group_gpus(assigned, r), "RANK": str(r)}): r
                for r in range(tp)}
        offset, results = 0, {}
        events = run_dir / "events.jsonl"
        while refs:
            if stop["flag"]:
                write_report(report_path, WorkerReport.failed("stopped by the supervisor's owner"))
                return 1
            if why := watch.lapsed():
                write_report(report_path, WorkerReport.failed(why, Unfollowed.KIND))
                return 1
            try:
                text, offset = ray.get(actors[0].read_events.remote(offset), timeout=5)
            except ray.exceptions.RayError:
                text = ""
            if text:
                with open(events, "a", encoding="utf-8") as fh:
                    fh.write(text)
            done, _ = ray.wait(list(refs), timeout=0.25)
            for ref in done:
                rank = refs.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    results[rank] = (-9, WorkerReport.failed(f"rank {rank} actor died: {type(exc).__name__}").to_dict())
                code, rep = results[rank]
                if code != 0:
                    error = str(rep.get("error") or "")
                    write_report(report_path, WorkerReport.failed(error or f"rank {rank} exited with code {code}",
                                                                  str(rep.get("error_kind") or ""),
                                                                  (RankError(rank, code, error),)))
                    return 1
        text, offset = ray.get(actors[0].read_events.remote(offset), timeout=5)
        if text:
            with open(events, "a", encoding="utf-8") as fh:
                fh.write(text)
        try:
            write_report(report_path, WorkerReport.from_dict(results[0][1]))
        except ContractError as exc:
            write_report(report_path, WorkerReport.failed(f"rank 0's report does not follow the contract: {exc}"))
            return 1
        return 0
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
        ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
