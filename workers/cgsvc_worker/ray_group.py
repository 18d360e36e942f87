"""A launch's worker group on a Ray cluster: a placement group of one bundle per rank
(STRICT_PACK: one node for a TP group), one actor per rank running the same worker code.

    python -m cgsvc_worker.ray_group --address HOST:PORT --launch-id ID --run-dir DIR \\
        [--gpus-per-rank 1] -- <cgsvc-worker bench arguments>

Started by the server's Ray dispatcher as a supervisor in its own session, like the local
one. It follows rank 0's events into DIR/events.jsonl, stops every actor when one dies or
when it is told to stop (SIGTERM), removes the placement group, and writes DIR/report.json.
Actors are owned by this driver, so if it is killed they die with it.
"""

from __future__ import annotations

import argparse
import json
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

from cgsvc_worker.cli import free_port, parser, rank_entry, write_report


@ray.remote
class RankActor:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events = os.path.join(tempfile.mkdtemp(prefix=f"cgsvc-rank{rank}-"), "events.jsonl")

    def endpoint(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

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
        os.environ.update(env)
        ns = parser().parse_args(argv)
        ns.events = self.events
        out = os.path.join(os.path.dirname(self.events), "report.json")
        ns.output = out
        code = rank_entry(ns)
        report: dict[str, Any] = {}
        for path in (out, f"{out}.rank{self.rank}.error.json"):
            if os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    report = json.load(fh)
        return code, report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="cgsvc_worker.ray_group")
    ap.add_argument("--address", required=True)
    ap.add_argument("--launch-id", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--gpus-per-rank", type=float, default=0.0)
    ap.add_argument("--place-timeout", type=float, default=60.0)
    ns = ap.parse_args(argv[:split])
    worker_argv = argv[split + 1:]
    tp = int(worker_argv[worker_argv.index("--tp") + 1])
    run_dir = Path(ns.run_dir)
    report_path = str(run_dir / "report.json")
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        ray.init(address=ns.address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - any failure to connect ends here, reported
        write_report(report_path, {"status": "failed", "error": f"Ray cluster at {ns.address} is not reachable: {exc}"})
        return 1
    bundle: dict[str, float] = {"CPU": 1.0, **({"GPU": ns.gpus_per_rank} if ns.gpus_per_rank else {})}
    pg = placement_group([bundle] * tp, strategy="STRICT_PACK", name=f"cgsvc-{ns.launch_id}")
    actors: list[Any] = []
    try:
        try:
            ray.get(pg.ready(), timeout=ns.place_timeout)
        except ray.exceptions.GetTimeoutError:
            write_report(report_path, {"status": "failed", "error": f"cannot place {tp} x {bundle} on one node of "
                                                                     f"the Ray cluster within {ns.place_timeout:.0f} s"})
            return 1
        actors = [RankActor.options(  # type: ignore[attr-defined]
            num_cpus=1, num_gpus=ns.gpus_per_rank or 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)).remote(r)
            for r in range(tp)]
        host, port = ray.get(actors[0].endpoint.remote())
        env = {"WORLD_SIZE": str(tp), "MASTER_ADDR": host, "MASTER_PORT": str(port)}
        logs = ["--log-dir", str(run_dir / "logs")]
        refs = {actors[r].run.remote(worker_argv + logs, {**env, "RANK": str(r), "LOCAL_RANK": str(r)}): r
                for r in range(tp)}
        offset, results = 0, {}
        events = run_dir / "events.jsonl"
        while refs:
            if stop["flag"]:
                write_report(report_path, {"status": "failed", "error": "stopped by the supervisor's owner"})
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
                    results[rank] = (-9, {"status": "failed", "error": f"rank {rank} actor died: {type(exc).__name__}"})
                code, rep = results[rank]
                if code != 0:
                    errors = [{"rank": rank, "exit_code": code, "error": rep.get("error", "")}]
                    write_report(report_path, {"status": "failed", "error": rep.get("error") or
                                               f"rank {rank} exited with code {code}", "rank_errors": errors})
                    return 1
        text, offset = ray.get(actors[0].read_events.remote(offset), timeout=5)
        if text:
            with open(events, "a", encoding="utf-8") as fh:
                fh.write(text)
        write_report(report_path, results[0][1])
        return 0
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
        ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
