"""Tensor parallelism: the process group and the two collectives the model needs.

A rank is started with the usual environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK), so `torchrun` can start a group as well as cgsvc can. NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dimension."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def shard(self, n: int, what: str) -> tuple[int, int]:
        """[start, end) of this rank's part of n items; n must divide evenly."""
        if n % self.size:
            raise ValueError(f"tp={self.size} does not divide the {n} {what}")
        k = n // self.size
        return self.rank * k, (self.rank + 1) * k


def single(device: str | torch.device = "cpu") -> TPGroup:
    return TPGroup(0, 1, torch.device(device))


NCCL_MIN_FOR_GRAPHS = (2, 9, 6)


def nccl_version() -> tuple[int, ...]:
    """The NCCL version torch was built with, e.g. (2, 27, 3); () when it has none."""
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return ()
    return tuple(v) if isinstance(v, tuple) else (v // 1000, v % 1000 // 100, v % 100)


def check_nccl_for_graphs(version: tuple[int, ...] | None = None) -> None:
    """Collectives captured inside CUDA graphs need NCCL 2.9.6 or later: refuse to start below."""
    v = nccl_version() if version is None else version
    if not v or v < NCCL_MIN_FOR_GRAPHS:
        have = ".".join(map(str, v)) or "none"
        raise RuntimeError(f"NCCL {have} is too old for all-reduces inside CUDA graphs (needs "
                           f"{'.'.join(map(str, NCCL_MIN_FOR_GRAPHS))} or later); install a torch built with a newer "
                           "NCCL, or run with decode and prefill graphs disabled")


def init_from_env(device_kind: str = "auto", timeout_s: float = 120.0) -> TPGroup:
    """Join the group described by the environment (a size-1 group when WORLD_SIZE is absent)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    use_cuda = torch.cuda.is_available() if device_kind == "auto" else device_kind == "cuda"
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if size > 1 and not dist.is_initialized():
        if use_cuda:
            check_nccl_for_graphs()
        # NCCL's communicator is created here and warmed by the warm-up step that runs before
        # every capture (graphs.py), so captured all-reduces find it ready.
        timeout = dt.timedelta(seconds=timeout_s)
        if use_cuda:
            dist.init_process_group("nccl", rank=rank, world_size=size, timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timeout)
    return TPGroup(rank, size, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
