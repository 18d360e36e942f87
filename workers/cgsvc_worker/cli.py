"""`cgsvc-worker`: run a plan on a checkpoint with a TP group of ranks.

    cgsvc-worker generate --model-path DIR --tp N --plan PLAN.json --prompts PROMPTS.json \\
                          --max-new-tokens K --output OUT.json [--temperature T --seed S]
    cgsvc-worker bench    --model-path DIR --tp N --plan PLAN.json --input-len 1024 --output-len 1024 \\
                          --requests 4 --concurrency 1 --output OUT.json
    cgsvc-worker check-graphs --model-path DIR --plan PLAN.json [--device cpu|cuda] --output OUT.json
    cgsvc-worker make-checkpoint --out DIR [--preset tiny|tiny-qproj|tiny-v2|tiny-kimi|flashinfer|bench]

With --tp N and no WORLD_SIZE in the environment, N ranks are spawned on this machine; under
`torchrun` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) this process is one rank. Rank 0
writes the report; a failure writes a report with status "failed" and exits non-zero.
`--events FILE` appends JSON lines (state changes and progress) for a supervisor to follow;
`--log-dir DIR` sends each rank's stdout and stderr to DIR/rank{N}.log.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
CPU_DECODE = ("eager", "trace", "inductor")  # how a CPU runs planned `full` decode steps (graphs.py)


class BadInput(ValueError):
    """Input that can never work: report it and exit 2."""


def emit(ns: argparse.Namespace, rank: int, event: dict[str, Any]) -> None:
    if ns.events and rank == 0:
        with open(ns.events, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"time": time.time(), **event}) + "\n")


def redirect_logs(ns: argparse.Namespace, rank: int) -> None:
    """Send this rank's stdout and stderr (fds 1 and 2, so native libraries too) to its log file."""
    if not ns.log_dir:
        return
    os.makedirs(ns.log_dir, exist_ok=True)
    fd = os.open(os.path.join(ns.log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def load_prompts(ns: argparse.Namespace, vocab: int, context: int) -> list[list[int]]:
    prompts: Any
    if ns.command == "bench":
        rng = random.Random(ns.seed)
        prompts = [[rng.randrange(2, vocab) for _ in range(ns.input_len)] for _ in range(ns.requests)]
    else:
        try:
            with open(ns.prompts, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise BadInput(f"--prompts {ns.prompts!r}: {exc}") from None
        prompts = data.get("prompts") if isinstance(data, dict) else data
        if not isinstance(prompts, list) or not prompts or not all(
                isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
                for p in prompts):
            raise BadInput("--prompts must be a non-empty JSON list of non-empty token-id lists")
    for i, p in enumerate(prompts):
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise BadInput(f"prompt {i}: token ids {bad[:3]} outside the vocabulary [0, {vocab})")
        if len(p) + ns.max_new_tokens > context:
            raise BadInput(f"prompt {i}: {len(p)} prompt tokens + {ns.max_new_tokens} new tokens exceed the "
                           f"context of {context} tokens")
    return prompts


def engine_options(ns: argparse.Namespace, allow_compile: bool = True) -> Any:
    from cgsvc_worker.engine import EngineOptions

    return EngineOptions(dtype=ns.dtype, kv_cache_bytes=int(ns.kv_cache_mb * 1024 * 1024), page_size=ns.page_size,
                         allow_compile=allow_compile and not getattr(ns, "no_compile", False),
                         max_context=ns.context_length, cpu_decode=ns.cpu_decode, graph_context=ns.graph_context)


def read_plan(ns: argparse.Namespace) -> Any:
    from cgsvc_worker.engine import PlanView

    if not ns.plan:
        return PlanView()
    try:
        with open(ns.plan, encoding="utf-8") as fh:
            return PlanView.from_json(json.load(fh))
    except (OSError, ValueError) as exc:
        raise BadInput(f"--plan {ns.plan!r}: {exc}") from None


def run_rank(ns: argparse.Namespace) -> dict[str, Any]:
    """The work of one rank; returns the report (meaningful on rank 0)."""
    import torch

    from cgsvc_worker import driver, tp
    from cgsvc_worker.engine import Engine

    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != ns.tp:
        raise BadInput(f"--tp {ns.tp} but WORLD_SIZE={world}")
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    group = tp.init_from_env(ns.device)
    t_group = time.perf_counter() - t0
    emit(ns, group.rank, {"event": "state", "state": "loading"})
    plan_view = read_plan(ns)
    engine = Engine(ns.model_path, group, plan_view, engine_options(ns))
    prompts = load_prompts(ns, engine.cfg.vocab_size, engine.max_context)
    emit(ns, group.rank, {"event": "state", "state": "capturing"})
    t_cap = time.perf_counter()
    engine.capture()
    capture_s = time.perf_counter() - t_cap
    emit(ns, group.rank, {"event": "state", "state": "running"})
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] > 0.25 or done == total:
            last[0] = now
            emit(ns, group.rank, {"event": "progress", "tokens_done": done, "tokens_total": total})

    sampler = driver.Sampler(ns.temperature, ns.seed)
    concurrency = ns.concurrency or len(prompts)
    workload = driver.run(engine, prompts, ns.max_new_tokens, concurrency, sampler, progress)
    described = engine.describe()
    report = {"status": "ok", "command": ns.command, **described, **workload,
              "workload": {"requests": len(prompts), "concurrency": concurrency, "max_new_tokens": ns.max_new_tokens,
                           "input_lens": sorted({len(p) for p in prompts}), "temperature": ns.temperature,
                           "seed": ns.seed},
              "timings": {"process_group_s": round(t_group, 3), "load_s": described["load"]["seconds"],
                          "capture_s": round(capture_s, 3), "total_s": round(time.perf_counter() - t0, 3)}}
    tp.shutdown()
    return report


def check_graphs_command(ns: argparse.Namespace) -> int:
    """Exit 0 when every planned size captures (or compiles without a break), 1 when one does
    not, 2 on bad input."""
    import torch

    from cgsvc_worker import tp
    from cgsvc_worker.check_graphs import check_graphs
    from cgsvc_worker.engine import Engine

    try:
        plan = read_plan(ns)
        use_cuda = torch.cuda.is_available() if ns.device == "auto" else ns.device == "cuda"
        if use_cuda and not torch.cuda.is_available():
            raise BadInput("--device cuda but torch sees no CUDA device")
        # The engine only sets up contexts here (eager); the check compiles and captures itself.
        ns.cpu_decode = "eager"
        engine = Engine(ns.model_path, tp.single("cuda" if use_cuda else "cpu"), plan,
                        engine_options(ns, allow_compile=False))
        result = check_graphs(engine, ns.compile_backend,
                              lambda what: print(f"check-graphs: {what}", file=sys.stderr, flush=True))
    except Exception as exc:  # noqa: BLE001 - the command's answer is a report and an exit code
        report, code = failure(exc)
        write_report(ns.output, report)
        print(f"cgsvc-worker check-graphs: {report['error']}", file=sys.stderr)
        return code
    write_report(ns.output, result)
    bad = [r for r in result["decode"] + result["prefill"] if not r["capturable"]]
    for r in bad:
        size = f"decode bs={r['bs']}" if "bs" in r else f"prefill num_tokens={r['num_tokens']}"
        print(f"not capturable: {size}: {r['reason']}", file=sys.stderr)
    print(f"check-graphs: {result['checked'] - len(bad)} of {result['checked']} planned sizes capturable on "
          f"{result['device']}", file=sys.stderr)
    return 0 if not bad else EXIT_FAILED


def fidelity_lines(report: dict[str, Any]) -> list[str]:
    """The plan fields a run did not honour, one line each, for a person reading stderr."""
    rows = [f for f in report.get("plan_fidelity", []) if f["status"] != "honoured"]
    return [f"{f['field']:<27} {f['status']:<15} {f['requested']} -> {f['effective']}: {f['reason']}" for f in rows]


def write_report(path: str | None, report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)  # never a half-written report
    else:
        print(text)


def failure(exc: BaseException) -> tuple[dict[str, Any], int]:
    """Input that can never work (BadInput, CheckpointError, PlanMismatch: all ValueErrors) exits 2;
    anything else, an exhausted KV cache included, exits 1."""
    code = EXIT_BAD_INPUT if isinstance(exc, ValueError) else EXIT_FAILED
    kind = type(exc).__name__
    return {"status": "failed", "error": f"{kind}: {exc}", "error_kind": kind}, code


def rank_entry(ns: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    redirect_logs(ns, rank)
    try:
        report = run_rank(ns)
    except BaseException as exc:  # noqa: BLE001 - every failure must end in a report and an exit code
        report, code = failure(exc)
        report["rank"] = rank
        if ns.debug:
            report["traceback"] = traceback.format_exc()
        emit(ns, rank, {"event": "state", "state": "failed", "error": report["error"]})
        if rank == 0:
            write_report(ns.output, report)
        else:
            write_report(f"{ns.output}.rank{rank}.error.json" if ns.output else None, report)
        return code
    if rank == 0:
        write_report(ns.output, report)
        if ns.output:
            lines = fidelity_lines(report)
            print("plan fidelity: every field honoured" if not lines else
                  "plan fidelity (fields not honoured as planned):\n  " + "\n  ".join(lines), file=sys.stderr)
        emit(ns, rank, {"event": "state", "state": "succeeded"})
    return 0


def _spawned(ns: argparse.Namespace, rank: int, world: int, port: int) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    sys.exit(rank_entry(ns))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_group(ns: argparse.Namespace) -> int:
    """Start ns.tp ranks with `spawn`; when one fails, stop the others and report."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_spawned, args=(ns, r, ns.tp, port), name=f"rank{r}") for r in range(ns.tp)]
    for p in procs:
        p.start()
    code = 0
    while any(p.is_alive() for p in procs):
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
    codes = [p.exitcode for p in procs]
    failed: list[tuple[int, int | None]] = [(i, c) for i, c in enumerate(codes) if c not in (0, None)]
    if failed and ns.output:
        _merge_rank_errors(ns.output, failed)
    return code or next((c for _, c in failed if c and c > 0), EXIT_FAILED if failed else 0)


def _merge_rank_errors(output: str, failed: list[tuple[int, int | None]]) -> None:
    """Make sure the report says the run failed, naming each failed rank and its error."""
    errors = []
    for rank, code in failed:
        path = f"{output}.rank{rank}.error.json"
        detail = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                detail = json.load(fh).get("error", "")
            os.remove(path)
        errors.append({"rank": rank, "exit_code": code, "error": detail})
    report: dict[str, Any] = {}
    if os.path.exists(output):
        with open(output, encoding="utf-8") as fh:
            report = json.load(fh)
    if report.get("status") != "failed":
        first = next((e for e in errors if e["error"]), errors[0])
        report = {"status": "failed", "error": first["error"] or f"rank {first['rank']} exited with code "
                                                                  f"{first['exit_code']}"}
    report["rank_errors"] = errors
    write_report(output, report)


def _engine_args(p: argparse.ArgumentParser) -> None:
    """Options every command that builds an engine takes."""
    p.add_argument("--model-path", required=True, help="checkpoint directory (config.json + *.safetensors, hub names)")
    p.add_argument("--plan", help="plan JSON from `cgsvc-cli resolve -o json` ({'plan': ..., 'spec': ...}, or the "
                                  "plan alone); without one every phase runs eagerly on torch_native")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="model and activation dtype (default float32)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when available, else CPU")
    p.add_argument("--kv-cache-mb", type=float, default=256.0, help="KV cache budget per rank, MiB (default 256)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (default 16)")
    p.add_argument("--context-length", type=int, default=0, help="context limit; 0: the model's max_position_embeddings")
    p.add_argument("--cpu-decode", choices=CPU_DECODE, default="eager",
                   help="how a CPU runs a plan's `full` decode steps, padded to the planned sizes: eager (default; "
                        "starts at once), trace (torch.compile fullgraph with eager kernels: proves each size "
                        "compiles, ~3 s per size), inductor (compiled kernels: fastest steps, ~15-30 s per size)")
    p.add_argument("--graph-context", type=int, default=4096,
                   help="context positions a captured torch_native decode graph attends over (GPU; default 4096)")
    p.add_argument("--debug", action="store_true", help="include tracebacks in failure reports")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cgsvc-worker", description=__doc__.split("\n")[0],
                                 epilog="Report format: docs/worker-report.md in the cgsvc repository.")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("generate", "run prompts from a file through the plan and report tokens and timings"),
                       ("bench", "run a synthetic workload through the plan and report TTFT, TPOT and throughput")):
        p = sub.add_parser(name, help=text, description=text)
        _engine_args(p)
        p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (spawned here unless under torchrun)")
        p.add_argument("--output", help="report path (stdout when absent)")
        p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); >0: seeded sampling")
        p.add_argument("--seed", type=int, default=0, help="sampling and synthetic-prompt seed")
        p.add_argument("--concurrency", type=int, default=0, help="requests in flight (0: all)")
        p.add_argument("--no-compile", action="store_true", help="do not torch.compile tc_piecewise prefill")
        p.add_argument("--events", help="append JSON-lines state and progress events to this file")
        p.add_argument("--log-dir", help="write each rank's output to DIR/rank{N}.log")
        p.add_argument("--launch-id", help="a tag on the command line by which a supervisor finds this group")
        if name == "generate":
            p.add_argument("--prompts", required=True, help="JSON list of token-id lists")
            p.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate per prompt")
        else:
            p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request")
            p.add_argument("--output-len", type=int, dest="max_new_tokens", default=1024,
                           help="tokens to generate per request")
            p.add_argument("--requests", type=int, default=4, help="number of requests")
    text = "prove that every planned decode bs and prefill num_tokens size can be captured (exit 0) or say why not"
    cg = sub.add_parser("check-graphs", help=text, description=text)
    _engine_args(cg)
    cg.add_argument("--output", help="result JSON path (stdout when absent)")
    cg.add_argument("--compile-backend", choices=("inductor", "trace"), default="inductor",
                    help="CPU: the torch.compile backend the steps are compiled with (default inductor)")
    mk = sub.add_parser("make-checkpoint", help="write a small random checkpoint in hub format",
                        description="write a small random checkpoint in hub format")
    mk.add_argument("--out", required=True, help="directory to write config.json and model.safetensors to")
    mk.add_argument("--preset", default="tiny", help="tiny (default), tiny-qproj, tiny-v2, tiny-kimi, flashinfer, bench")
    mk.add_argument("--seed", type=int, default=0, help="weights seed")
    mk.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="tensor dtype in the file")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.command == "make-checkpoint":
        from cgsvc_worker.checkpoint import make_checkpoint

        try:
            print(make_checkpoint(ns.out, ns.preset, ns.seed, ns.dtype))
        except ValueError as exc:
            print(f"cgsvc-worker: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return 0
    if ns.command == "check-graphs":
        return check_graphs_command(ns)
    if ns.tp < 1:
        print("cgsvc-worker: --tp must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if "WORLD_SIZE" in os.environ or ns.tp == 1:
        os.environ.setdefault("WORLD_SIZE", str(ns.tp))
        return rank_entry(ns)
    return spawn_group(ns)


if __name__ == "__main__":
    raise SystemExit(main())
