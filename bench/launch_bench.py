"""Time from CreateLaunch to first token for TP4 on this CPU, next to a bare
`torchrun --nproc-per-node 4` start of the same worker, in the same run.

    .venv/bin/python bench/launch_bench.py [--repeat 3]

First token = the worker's first progress event (written right after the first prefill).
Where the time goes comes from the worker's events and report: ranks_start_s (until the
"loading" event, less process-group init: spawning the ranks and their imports under torchrun,
forks from the fork server that imported torch once under cgsvc's supervisor; the RESULTS tables of
2026-12-03 and before call it spawn_import_s), process-group init, checkpoint load, capture,
first prefill.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}
WORKLOAD = {"input_len": 16, "output_len": 4, "requests": 1, "concurrency": 1, "seed": 0}


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def breakdown(t0: float, evs: list[dict[str, Any]], report: dict[str, Any]) -> dict[str, float]:
    loading = next(e["time"] for e in evs if e.get("state") == "loading")
    running = next(e["time"] for e in evs if e.get("state") == "running")  # after the capture and the warm-up
    # the first token as the worker timed it (progress events are throttled to one each 0.25 s,
    # and the first may count prompt tokens prefilled or sizes captured, not a token)
    first = running + report["requests"][0]["ttft_ms"] / 1000
    t = report["timings"]
    return {"first_token_s": first - t0, "ranks_start_s": loading - t0 - t["process_group_s"],
            "process_group_s": t["process_group_s"], "load_s": t["load_s"], "capture_s": t["capture_s"],
            "warmup_s": t.get("warmup_s", 0.0), "first_prefill_s": first - running}


def bare_torchrun(ckpt: str, plan: Path, work: Path) -> dict[str, float]:
    ev, out = work / "bare-events.jsonl", work / "bare.json"
    for p in (ev, out):
        p.unlink(missing_ok=True)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    from cgsvc_worker.supervisor import free_port

    port = str(free_port())  # torchrun's --master-port 0 does not rendezvous
    t0 = time.time()
    subprocess.run([torchrun, "--nproc-per-node", "4", "--master-port", port, "-m", "cgsvc_worker.cli", "bench",
                    "--model-path", ckpt, "--tp", "4", "--plan", str(plan), "--input-len", "16", "--output-len", "4",
                    "--requests", "1", "--events", str(ev), "--output", str(out)], check=True, cwd=ROOT,
                   capture_output=True)
    return breakdown(t0, events(ev), json.loads(out.read_text()))


def via_service(address: str, ckpt: str, data_dir: Path) -> dict[str, float]:
    from cgsvc_client.client import Client

    with Client(address) as c:
        t0 = time.time()
        op = c.create_launch(ckpt, WORKLOAD, spec=KIMI)
        for e in c.watch_launch(op.metadata.name):
            if e.launch.state in ("SUCCEEDED", "FAILED"):
                break
        launch = c.get_launch(op.metadata.name)
        assert launch.state == "SUCCEEDED", launch.error
    run = data_dir / "launches" / op.metadata.name.split("/")[1]
    return breakdown(t0, events(run / "events.jsonl"), json.loads(launch.report_json))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    from cgsvc_worker.checkpoint import make_checkpoint

    from cgsvc import codec
    from cgsvc.resolve import resolve
    from cgsvc.spec import parse_spec

    work = Path(tempfile.mkdtemp(prefix="cgsvc-launch-bench-"))
    ckpt = make_checkpoint(str(work / "tiny-kimi"), "tiny-kimi")
    plan = work / "plan.json"
    plan.write_text(json.dumps({"plan": codec.plan_from_proto(codec.plan_to_proto(resolve(parse_spec(KIMI)))).to_dict()}))
    data = work / "srv"
    proc = subprocess.Popen([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                             "--data-dir", str(data), "--metrics-address", "", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert proc.stdout is not None
    address = ""
    for line in proc.stdout:
        m = re.search(r"listening on (\S+)", line)
        if m:
            address = m.group(1)
            break
    try:
        rows: dict[str, list[dict[str, float]]] = {"bare torchrun": [], "CreateLaunch (local dispatcher)": []}
        for _ in range(ns.repeat):
            rows["bare torchrun"].append(bare_torchrun(ckpt, plan, work))
            rows["CreateLaunch (local dispatcher)"].append(via_service(address, ckpt, data))
    finally:
        proc.terminate()
        proc.wait(30)
    keys = ["first_token_s", "ranks_start_s", "process_group_s", "load_s", "capture_s", "warmup_s", "first_prefill_s"]
    print(f"# TP4 on {ns.repeat} runs each, medians in seconds; tiny-kimi checkpoint, 16-token prompt")
    print("| start | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    med = {name: {k: statistics.median(r[k] for r in runs) for k in keys} for name, runs in rows.items()}
    for name, m in med.items():
        print(f"| {name} | " + " | ".join(f"{m[k]:.2f}" for k in keys) + " |")
    ratio = med["CreateLaunch (local dispatcher)"]["first_token_s"] / med["bare torchrun"]["first_token_s"]
    print(f"\nCreateLaunch to first token / bare torchrun: {ratio:.2f}x (goal <= 1.5x)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
