"""The workload driver: runs requests through an Engine with continuous batching and reports
per-request TTFT/TPOT, aggregate throughput and percentiles, and what really ran.

Closed loop: at most `concurrency` requests are in flight; a request arrives when a slot
frees (all arrive at the start when concurrency >= requests). TTFT runs from arrival to the
first generated token, TPOT is the mean time between later tokens.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cgsvc_worker.engine import Engine
from cgsvc_worker.kv_cache import KVCacheExhausted


@dataclass
class Progress:
    """How far a workload has got: tokens generated, requests finished, prompt tokens prefilled."""

    tokens_done: int = 0
    tokens_total: int = 0
    requests_done: int = 0
    requests_total: int = 0
    prompt_done: int = 0
    prompt_total: int = 0

    @property
    def finished(self) -> bool:
        return self.tokens_done == self.tokens_total


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    token_times: list[float] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    prefill_chunks: int = 0
    waited: bool = False  # it waited for room in the KV cache before entering the engine

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens

    def metrics(self) -> dict[str, Any]:
        ttft = (self.token_times[0] - self.arrival) * 1000 if self.token_times else None
        gaps = [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]
        tpot = statistics.mean(gaps) * 1000 if gaps else None
        return {"id": self.rid, "prompt_tokens": len(self.prompt), "prefill_chunks": self.prefill_chunks,
                "output_tokens": self.output, "tokens": len(self.output), "ttft_ms": _r(ttft), "tpot_ms": _r(tpot)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def percentiles(values: list[float]) -> dict[str, float]:
    """Mean and p50 / p90 / p99, interpolated linearly between the two nearest ranks (numpy's
    default, which serving benchmarks report): the p50 of two waves lies between them."""
    if not values:
        return {}
    v = sorted(values)

    def pct(p: float) -> float:
        at = p / 100 * (len(v) - 1)
        lo = int(at)
        hi = min(lo + 1, len(v) - 1)
        return round(v[lo] + (v[hi] - v[lo]) * (at - lo), 3)

    return {"mean": round(statistics.mean(v), 3), "p50": pct(50), "p90": pct(90), "p99": pct(99)}


class Sampler:
    """Greedy by default; temperature sampling from a seeded generator (identical on every rank)."""

    def __init__(self, temperature: float = 0.0, seed: int = 0) -> None:
        self.temperature = temperature
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> list[int]:
        if self.temperature <= 0:
            return logits.argmax(-1).tolist()  # type: ignore[no-any-return]
        probs = torch.softmax(logits.cpu() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1).tolist()  # type: ignore[no-any-return]


def run(engine: Engine, prompts: list[list[int]], max_new_tokens: int, concurrency: int, sampler: Sampler,
        progress: Callable[[Progress], None] | None = None,
        finished_request: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Serve every prompt; returns the report's workload part. Raises on engine errors.
    `progress(Progress)` after each step, a prefill chunk included; `finished_request(metrics)`
    as each request ends (its entry of the report's `requests`)."""
    pending = [Request(i, p, max_new_tokens) for i, p in enumerate(prompts)]
    pending.reverse()
    active: list[Request] = []
    finished: list[Request] = []
    now_at = Progress(tokens_total=len(prompts) * max_new_tokens, requests_total=len(prompts),
                      prompt_total=sum(len(p) for p in prompts))

    def prefilled(tokens: int) -> None:
        now_at.prompt_done += tokens
        if progress is not None:
            progress(now_at)

    # KV admission, as a serving engine's scheduler does it: a request enters the engine once the
    # cache has room for its prompt and all its new tokens beside those of the requests running,
    # and waits in order until then (its TTFT counts the wait), so no step runs out of pages.
    page, usable = engine.cache.page_size, engine.cache.num_pages - 1  # page 0 is the scratch page

    def pages_of(r: Request) -> int:
        return -(-(len(r.prompt) + r.max_new_tokens) // page)

    for r in reversed(pending):
        if pages_of(r) > usable:
            raise KVCacheExhausted(
                f"KV cache exhausted: request {r.rid} needs {len(r.prompt) + r.max_new_tokens} tokens (its "
                f"{len(r.prompt)} prompt tokens and {r.max_new_tokens} new), {pages_of(r)} pages of {page}; the cache "
                f"holds {usable} pages ({usable * page} tokens) on this rank; shorten the workload or give the cache "
                "more memory")
    waiting: deque[Request] = deque()
    held = 0
    t_start = time.perf_counter()
    while pending or waiting or active:
        while pending and len(active) + len(waiting) < concurrency:
            r = pending.pop()
            r.arrival = time.perf_counter()
            waiting.append(r)
        admitted: list[Request] = []
        while waiting and held + pages_of(waiting[0]) <= usable:
            admitted.append(waiting.popleft())
            held += pages_of(admitted[-1])
        for r in waiting:
            r.waited = True
        if admitted:
            logits = engine.prefill([r.rid for r in admitted], [r.prompt for r in admitted], prefilled)
            # timed once sampled: on a GPU the step's kernels run until the sampler reads them back
            tokens = sampler(logits)
            now = time.perf_counter()
            for r, tok in zip(admitted, tokens, strict=True):
                r.output.append(tok)
                r.token_times.append(now)
                r.prefill_chunks = engine.prefill_chunks[r.rid]
            now_at.tokens_done += len(admitted)
            active += admitted
        else:
            logits = engine.decode([r.rid for r in active], [r.output[-1] for r in active])
            tokens = sampler(logits)
            now = time.perf_counter()
            for r, tok in zip(active, tokens, strict=True):
                r.output.append(tok)
                r.token_times.append(now)
            now_at.tokens_done += len(active)
        for r in [r for r in active if r.done]:
            active.remove(r)
            engine.release(r.rid)
            held -= pages_of(r)
            finished.append(r)
            now_at.requests_done += 1
            if finished_request is not None:
                finished_request(r.metrics())
        if progress is not None:
            progress(now_at)
    wall = time.perf_counter() - t_start
    finished.sort(key=lambda r: r.rid)
    reqs = [r.metrics() for r in finished]
    return {
        "requests": reqs,
        "aggregate": {
            "requests": len(reqs), "wall_s": round(wall, 4),
            "output_tokens": sum(r["tokens"] for r in reqs), "waited_for_kv": sum(r.waited for r in finished),
            "throughput_tok_s": round(sum(r["tokens"] for r in reqs) / wall, 3) if wall else 0.0,
            "ttft_ms": percentiles([r["ttft_ms"] for r in reqs if r["ttft_ms"] is not None]),
            "tpot_ms": percentiles([r["tpot_ms"] for r in reqs if r["tpot_ms"] is not None]),
        },
    }
