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
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=size,
                                timeout=dt.timedelta(seconds=timeout_s))
    return TPGroup(rank, size, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
