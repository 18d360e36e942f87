"""The rank runtime: what one rank of a worker group does, from process group to report.

    run_rank(ns)     join the group, load the engine for the plan, capture, run the workload,
                     and return the report (rank 0's is the group's)
    rank_entry(ns)   run_rank with every failure turned into a failed report and an exit code:
                     2 for input that can never work, 1 for anything else

Events (state changes, progress) and the report follow cgsvc.contract, the one contract
with the server; ranks started by the supervisor (supervisor.py), by torchrun, or by a Ray
actor (ray_group.py) run this same code.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import traceback
from typing import Any

from cgsvc.contract import (
    PlacedEvent,
    ProgressEvent,
    StateEvent,
    WorkerReport,
    append_event,
    kv_budget_bytes,
    write_report,
)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class BadInput(ValueError):
    """Input that can never work: report it and exit 2."""


def emit(ns: argparse.Namespace, rank: int, event: StateEvent | ProgressEvent | PlacedEvent) -> None:
    if getattr(ns, "events", None) and rank == 0:
        append_event(ns.events, event)


def say(rank: int, text: str) -> None:
    """A line of progress in this rank's log (its stderr): what it is doing now, so that a
    follower (`cgsvc-cli launches logs --follow`) or a person at a terminal sees each stage."""
    print(f"{time.strftime('%H:%M:%S')} rank {rank}: {text}", file=sys.stderr, flush=True)


def redirect_logs(ns: argparse.Namespace, rank: int) -> None:
    """Send this rank's stdout and stderr (fds 1 and 2, so native libraries too) to its log file."""
    if not getattr(ns, "log_dir", None):
        return
    os.makedirs(ns.log_dir, exist_ok=True)
    fd = os.open(os.path.join(ns.log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# The untimed request each run starts with (Engine.warm_up): enough tokens to take every path a
# prompt takes, few enough to cost a blink on a CPU.
WARM_UP_TOKENS = 16


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

    kv_bytes = None if ns.kv_cache_mb is None else kv_budget_bytes(ns.kv_cache_mb)  # None: auto
    return EngineOptions(dtype=ns.dtype, kv_cache_bytes=kv_bytes, page_size=ns.page_size,
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


def device_name(p: dict[str, Any]) -> str:
    """A rank's device as the server names devices: its own GPU's id among those visible to it,
    or "cpu". (GPU ids given to ranks on a machine without CUDA, as tests do: the rank's own by
    its LOCAL_RANK.)"""
    visible = [d for d in str(p["visible_devices"]).split(",") if d]
    device = str(p["device"])
    if device.startswith("cuda:"):
        index = int(device.split(":")[1])
        return visible[index] if index < len(visible) else str(index)
    if visible:
        return visible[int(p.get("local_rank", 0))] if len(visible) > 1 else visible[0]
    return "cpu"


def placement(group: Any) -> list[dict[str, Any]]:
    """Every rank's device and CUDA_VISIBLE_DEVICES, gathered to every rank: what each rank
    really saw, not what it was meant to see."""
    import torch.distributed as dist

    mine = {"rank": group.rank, "device": str(group.device), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    if group.size == 1:
        return [mine]
    every: list[Any] = [None] * group.size
    dist.all_gather_object(every, mine)
    return sorted(every, key=lambda p: p["rank"])


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
    where = placement(group)
    emit(ns, group.rank, PlacedEvent(tuple(device_name(p) for p in where)))
    emit(ns, group.rank, StateEvent("loading"))
    visible = where[group.rank]["visible_devices"]
    say(group.rank, f"up on {group.device}{f' (CUDA_VISIBLE_DEVICES={visible})' if visible else ''}, one of "
                    f"{world} ranks (process group in {t_group:.1f} s); loading {ns.model_path}")
    plan_view = read_plan(ns)
    engine = Engine(ns.model_path, group, plan_view, engine_options(ns))
    prompts = load_prompts(ns, engine.cfg.vocab_size, engine.max_context)
    emit(ns, group.rank, StateEvent("capturing"))
    concurrency = ns.concurrency or len(prompts)
    rows = min(concurrency, len(prompts))  # the most rows a decode step will have
    say(group.rank, f"loaded in {time.perf_counter() - t0 - t_group:.1f} s; capturing: {engine.capture_work(rows)}")
    t_cap = time.perf_counter()
    tokens_total, prompt_total = len(prompts) * ns.max_new_tokens, sum(len(p) for p in prompts)
    captured = [0, 0]  # sizes captured or compiled, of
    said = [0.0, time.perf_counter()]  # when the last event was written, and the last line

    def on_size(done: int, total: int) -> None:
        """Sizes captured or compiled so far: a capture of hundreds of graphs (or a cold compile
        cache on a CPU) takes minutes, which the launch's bar and rank 0's log count off."""
        now = time.perf_counter()
        captured[:] = done, total
        if done in (0, total) or now - said[0] > 0.25:
            said[0] = now
            emit(ns, group.rank, ProgressEvent(0, tokens_total, 0.0, 0, prompt_total, done, total))
        if group.rank == 0 and 0 < done < total and now - said[1] >= ns.log_every:
            said[1] = now
            say(group.rank, f"captured {done} of {total} sizes")
    engine.capture(decode_rows=rows, on_size=on_size)
    capture_s = time.perf_counter() - t_cap
    say(group.rank, f"captured in {capture_s:.1f} s; warming up")
    warm_tokens = min(WARM_UP_TOKENS, len(prompts[0]))
    warmup_s = engine.warm_up(warm_tokens)
    emit(ns, group.rank, StateEvent("running"))
    say(group.rank, f"warmed up in {warmup_s:.1f} s (one untimed request of {warm_tokens} prompt tokens and a decode "
                    f"step); running {len(prompts)} requests, up to {ns.max_new_tokens} new tokens each")
    last: list[Any] = [0.0, time.perf_counter(), None]  # the last progress event, the last line, its counts
    ended: list[dict[str, Any]] = []  # the requests finished so far, as the report lists them

    def progress(at: driver.Progress) -> None:
        now = time.perf_counter()
        counts = (at.tokens_done, at.prompt_done)
        if (now - last[0] > 0.25 and counts != last[2]) or at.finished:
            last[0], last[2] = now, counts
            emit(ns, group.rank, ProgressEvent(at.tokens_done, at.tokens_total, 0.0, at.prompt_done, at.prompt_total,
                                               captured[0], captured[1]))
        # rank 0 says how far it has got (prompt tokens too: a long prompt is many steps before its
        # first token); every rank says when it has finished, so that a log that ends at "running"
        # is one whose rank stopped there
        if (group.rank == 0 and now - last[1] >= ns.log_every) or at.finished:
            last[1] = now
            ttfts = [m["ttft_ms"] for m in ended if m.get("ttft_ms") is not None]
            median = f" (TTFT median so far {statistics.median(ttfts):.1f} ms)" if ttfts else ""
            say(group.rank, f"{at.tokens_done} of {at.tokens_total} tokens generated, {at.requests_done} of "
                            f"{at.requests_total} requests done, {at.prompt_done} of {at.prompt_total} prompt tokens "
                            f"prefilled{median}")

    sampler = driver.Sampler(ns.temperature, ns.seed)
    workload = driver.run(engine, prompts, ns.max_new_tokens, concurrency, sampler, progress, ended.append)
    described = engine.describe()
    if waited := workload["aggregate"]["waited_for_kv"]:
        cache = engine.cache
        note = (f"{waited} of {len(prompts)} requests waited for room in the KV cache ({cache.num_pages - 1} pages of "
                f"{cache.page_size} tokens on each rank) before their prefill; their TTFT counts the wait")
        described["notes"] = [*described.get("notes", []), note]
        say(group.rank, note)
    report = {"status": "ok", "command": ns.command, **described, **workload, "placement": where,
              "workload": {"requests": len(prompts), "concurrency": concurrency, "max_new_tokens": ns.max_new_tokens,
                           "input_lens": sorted({len(p) for p in prompts}), "temperature": ns.temperature,
                           "seed": ns.seed},
              "timings": {"process_group_s": round(t_group, 3), "load_s": described["load"]["seconds"],
                          "capture_s": round(capture_s, 3), "warmup_s": round(warmup_s, 3),
                          "total_s": round(time.perf_counter() - t0, 3)}}
    tp.shutdown()
    return report


def fidelity_lines(report: dict[str, Any]) -> list[str]:
    """The plan fields a run did not honour, one line each, for a person reading stderr."""
    rows = [f for f in report.get("plan_fidelity", []) if f["status"] != "honoured"]
    # values as the report and `launches show` spell them (JSON: null, "disabled"), not Python's None
    return [f"{f['field']:<27} {f['status']:<15} {json.dumps(f['requested'])} -> {json.dumps(f['effective'])}: "
            f"{f['reason']}" for f in rows]


def failure(exc: BaseException, **extra: Any) -> tuple[WorkerReport, int]:
    """Input that can never work (BadInput, CheckpointError, PlanMismatch: all ValueErrors) exits 2;
    anything else, an exhausted KV cache included, exits 1."""
    code = EXIT_BAD_INPUT if isinstance(exc, ValueError) else EXIT_FAILED
    kind = type(exc).__name__
    return WorkerReport.failed(f"{kind}: {exc}", kind, **extra), code


def rank_entry(ns: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    redirect_logs(ns, rank)
    try:
        report = run_rank(ns)
    except BaseException as exc:  # noqa: BLE001 - every failure must end in a report and an exit code
        failed, code = failure(exc, rank=rank, **({"traceback": traceback.format_exc()} if ns.debug else {}))
        emit(ns, rank, StateEvent("failed", failed.error))
        if rank == 0:
            write_report(ns.output, failed)
        elif ns.output:
            write_report(rank_error_path(ns.output, rank), failed)
        else:  # standard output holds one report, rank 0's: the others say theirs on a line of stderr
            print(f"cgsvc-worker: rank {rank}: {failed.error}", file=sys.stderr, flush=True)
        return code
    if rank == 0:
        write_report(ns.output, report)
        if ns.output:
            lines = fidelity_lines(report)
            print("plan fidelity: every field honoured" if not lines else
                  "plan fidelity (fields not honoured as planned):\n  " + "\n  ".join(lines), file=sys.stderr)
        emit(ns, rank, StateEvent("succeeded"))
    return 0


def rank_error_path(output: str, rank: int) -> str:
    """Where a rank other than 0 leaves its failed report for the supervisor to merge."""
    return f"{output}.rank{rank}.error.json"


