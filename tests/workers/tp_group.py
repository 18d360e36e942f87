"""Run an Engine on N real processes over gloo and bring rank 0's greedy tokens and logits back."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path
from typing import Any

import torch


def _rank(rank: int, world: int, port: int, path: str, prompts: list[list[int]], steps: int, dtype: str, out: str,
          plan: dict[str, Any], page_size: int) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    from cgsvc_worker import tp
    from cgsvc_worker.engine import Engine, EngineOptions, PlanView

    group = tp.init_from_env("cpu")
    engine = Engine(path, group, PlanView(**plan), EngineOptions(dtype=dtype, page_size=page_size))
    ids = list(range(len(prompts)))
    logits = [engine.prefill(ids, prompts)]
    for _ in range(steps - 1):
        logits.append(engine.decode(ids, logits[-1].argmax(-1).tolist()))
    if rank == 0:
        torch.save({"logits": torch.stack(logits), "report": engine.describe()}, out)
    tp.shutdown()


def run_tp(world: int, path: str, prompts: list[list[int]], steps: int, tmp: Path, dtype: str = "float32",
           plan: dict[str, Any] | None = None, page_size: int = 16) -> torch.Tensor:
    """Logits [steps, batch, vocab] of a greedy run on `world` processes (PlanView fields in `plan`)."""
    return run_tp_report(world, path, prompts, steps, tmp, dtype, plan, page_size)[0]


def run_tp_report(world: int, path: str, prompts: list[list[int]], steps: int, tmp: Path, dtype: str = "float32",
                  plan: dict[str, Any] | None = None, page_size: int = 16) -> tuple[torch.Tensor, dict[str, Any]]:
    """Rank 0's logits and its engine's report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp / f"logits_tp{world}.pt")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, path, prompts, steps, dtype, out, plan or {}, page_size))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    got = torch.load(out)
    return got["logits"], got["report"]
