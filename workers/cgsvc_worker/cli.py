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

This module parses arguments; the rank runtime is runtime.py, the group's supervisor
supervisor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from cgsvc import __version__
from cgsvc.contract import (
    CPU_DECODE_MODES,
    DTYPES,
    KV_PAGE_TOKENS,
    kv_cache_mib,
    tp_fits,
    tp_misfits,
    write_report,
)
from cgsvc_worker.runtime import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    BadInput,
    engine_options,
    failure,
    rank_entry,
    read_plan,
)
from cgsvc_worker.supervisor import spawn_group


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
        failed, code = failure(exc)
        write_report(ns.output, failed)
        print(f"cgsvc-worker check-graphs: {failed.error}", file=sys.stderr)
        return code
    text = json.dumps(result, indent=2)
    if ns.output:
        with open(ns.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        print(text)
    bad = [r for r in result["decode"] + result["prefill"] if not r["capturable"]]
    for r in bad:
        size = f"decode bs={r['bs']}" if "bs" in r else f"prefill num_tokens={r['num_tokens']}"
        print(f"not capturable: {size}: {r['reason']}", file=sys.stderr)
    print(f"check-graphs: {result['checked'] - len(bad)} of {result['checked']} planned sizes capturable on "
          f"{result['device']}", file=sys.stderr)
    return 0 if not bad else EXIT_FAILED


def _engine_args(p: argparse.ArgumentParser) -> None:
    """Options every command that builds an engine takes."""
    p.add_argument("--model-path", required=True, help="checkpoint directory (config.json + *.safetensors, hub names)")
    p.add_argument("--plan", help="plan JSON from `cgsvc-cli resolve -o json` ({'plan': ..., 'spec': ...}, or the "
                                  "plan alone); without one every phase runs eagerly on torch_native")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="model and activation dtype; auto (default): float32 on a CPU, on a GPU the checkpoint's "
                        "bfloat16 / float16, else bfloat16 (the GPU MLA kernels take 16-bit queries)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when available, else CPU")
    p.add_argument("--kv-cache-mb", type=kv_cache_mib, default=None, metavar="MIB|auto",
                   help="KV cache budget per rank, MiB; auto (default): 256 on a CPU, on a GPU half of the memory "
                        "free once the weights are loaded")
    p.add_argument("--page-size", type=int, default=KV_PAGE_TOKENS,
                   help=f"tokens per KV cache page (default {KV_PAGE_TOKENS})")
    p.add_argument("--context-length", type=int, default=0, help="context limit; 0: the model's max_position_embeddings")
    p.add_argument("--cpu-decode", choices=CPU_DECODE_MODES, default="eager",
                   help="how a CPU runs a plan's `full` decode steps, padded to the planned sizes: eager (default; "
                        "starts at once), trace (torch.compile fullgraph with eager kernels: proves each size "
                        "compiles, ~3 s per size), inductor (compiled kernels: fastest steps, ~15-30 s per size)")
    p.add_argument("--graph-context", type=int, default=4096,
                   help="context positions a captured torch_native decode graph attends over (GPU; default 4096)")
    p.add_argument("--debug", action="store_true", help="include tracebacks in failure reports")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cgsvc-worker", description=__doc__.split("\n")[0],
                                 epilog="Report format: docs/worker-report.md in the cgsvc repository.")
    ap.add_argument("--version", action="version", version=f"cgsvc-worker {__version__}",
                    help="print the release and exit")
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
        p.add_argument("--log-every", type=float, default=5.0,
                       help="seconds between rank 0's progress lines (tokens generated, prompt tokens prefilled); "
                            "0: every step (default 5)")
        p.add_argument("--launch-id", help="a tag on the command line by which a supervisor finds this group")
        p.add_argument("--follow-file", default="",
                       help="a file the server that follows this group touches about once a second")
        p.add_argument("--unfollowed-after", type=float, default=0.0,
                       help="stop the group, reporting why, once --follow-file has gone this many seconds "
                            "untouched (0: never; a group of one rank is then supervised too)")
        p.add_argument("--devices", default="",
                       help="comma-separated devices, one per rank (GPU ids, or cpu0, cpu1, ... for CPU slots): every "
                            "rank sees these GPUs (CUDA_VISIBLE_DEVICES) and rank r takes the r-th, cuda:r")
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


def out_of_bounds(ns: argparse.Namespace) -> str:
    """The first numeric flag of this command line outside what a run can use, said with what
    would be valid; "" when every one is in bounds (checked before a rank starts)."""
    at_least_1 = (1, "at least 1")
    checks: list[tuple[str, float, tuple[float, str]]] = [
        ("--page-size", ns.page_size, at_least_1), ("--context-length", ns.context_length, (0, "0 (the model's) or more")),
        ("--graph-context", ns.graph_context, at_least_1)]
    if ns.command in ("generate", "bench"):
        checks += [("--tp", ns.tp, at_least_1), ("--concurrency", ns.concurrency, (0, "0 (all) or more")),
                   ("--temperature", ns.temperature, (0, "0 (greedy) or more")),
                   ("--log-every", ns.log_every, (0, "0 (every step) or more")),
                   ("--max-new-tokens" if ns.command == "generate" else "--output-len", ns.max_new_tokens, at_least_1)]
    if ns.command == "bench":
        checks += [("--input-len", ns.input_len, at_least_1), ("--requests", ns.requests, at_least_1)]
    for flag, value, (least, valid) in checks:
        if not value >= least:
            return f"{flag} must be {valid}, got {value:g}"
    if ns.kv_cache_mb is not None and not ns.kv_cache_mb > 0:
        return f"--kv-cache-mb must be auto or more than 0, got {ns.kv_cache_mb:g}"
    return ""


def tp_misfit(model_path: str, tp: int) -> str:
    """Why `tp` ranks cannot split the checkpoint's config evenly, before any rank starts and
    loads it; "" when they can, or when the config cannot be read (each rank then says why)."""
    from cgsvc_worker.config import load_model_config

    try:
        cfg = load_model_config(model_path)
    except (OSError, ValueError, KeyError):
        return ""
    sizes = {"num_attention_heads": cfg.num_heads, "vocab_size": cfg.vocab_size, "routed_experts": cfg.n_routed_experts}
    if not (misfits := tp_misfits(tp, sizes)):
        return ""
    fits = ", ".join(map(str, tp_fits(sizes)))
    return f"--tp {tp} does not divide the checkpoint's {' or '.join(misfits)}; valid: {fits}"


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
    if problem := out_of_bounds(ns):
        print(f"cgsvc-worker: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if ns.command == "check-graphs":
        return check_graphs_command(ns)
    if ns.unfollowed_after < 0 or (ns.unfollowed_after and not ns.follow_file):
        print(f"cgsvc-worker: --unfollowed-after {ns.unfollowed_after:g}: give 0 (never) or a number of seconds, "
              "with --follow-file naming the file whose last touch counts", file=sys.stderr)
        return EXIT_BAD_INPUT
    if ns.tp > 1 and "WORLD_SIZE" not in os.environ and (misfit := tp_misfit(ns.model_path, ns.tp)):
        print(f"cgsvc-worker: {misfit}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if "WORLD_SIZE" in os.environ or (ns.tp == 1 and not ns.unfollowed_after):
        os.environ.setdefault("WORLD_SIZE", str(ns.tp))
        return rank_entry(ns)
    return spawn_group(ns)


if __name__ == "__main__":
    raise SystemExit(main())
