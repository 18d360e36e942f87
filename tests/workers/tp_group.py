"""Run an Engine on N real processes over gloo and bring rank 0's greedy tokens and logits back."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import torch


def _rank(rank: int, world: int, port: int, path: str, prompts: list[list[int]], steps: int, dtype: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    from cgsvc_worker import tp
    from cgsvc_worker.engine import Engine, EngineOptions, PlanView

    group = tp.init_from_env("cpu")
    engine = Engine(path, group, PlanView(), EngineOptions(dtype=dtype))
    ids = list(range(len(prompts)))
    logits = [engine.prefill(ids, prompts)]
    for _ in range(steps - 1):
        logits.append(engine.decode(ids, logits[-1].argmax(-1).tolist()))
    if rank == 0:
        torch.save(torch.stack(logits), out)
    tp.shutdown()


def run_tp(world: int, path: str, prompts: list[list[int]], steps: int, tmp: Path, dtype: str = "float32") -> torch.Tensor:
    """Logits [steps, batch, vocab] of a greedy run on `world` processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp / f"logits_tp{world}.pt")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, path, prompts, steps, dtype, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return torch.load(out)
