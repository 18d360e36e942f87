"""The workload driver: percentiles as serving benchmarks report them, and requests admitted as
the KV cache has room."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from cgsvc_worker import driver, tp
from cgsvc_worker.driver import percentiles
from cgsvc_worker.engine import Engine, EngineOptions, PlanView
from cgsvc_worker.kv_cache import KVCacheExhausted


def test_p50_of_an_even_count_is_the_midpoint_not_the_upper_half() -> None:
    # Two waves of four requests, as `--requests 8 --concurrency 4` gives: the median lies
    # between them, not on the slower wave (it read 175.0 here, as p99 did).
    ttft = [175.0] * 4 + [103.0] * 4
    assert percentiles(ttft)["p50"] == 139.0


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0], list(map(float, range(1, 101))),
                                    [0.5, 9.0, 2.25, 7.0, 7.0, 1.0, 30.0]])
def test_percentiles_match_numpys_linear_interpolation(values: list[float]) -> None:
    got = percentiles(values)
    for key, p in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert got[key] == round(float(np.percentile(values, p)), 3), key
    assert got["mean"] == round(float(np.mean(values)), 3)


def test_no_values_no_percentiles() -> None:
    assert percentiles([]) == {}


def _engine(path: str, pages: int = 0) -> Engine:
    """An engine on the tiny checkpoint with pages of 4 tokens: `pages` in its KV cache (the
    scratch page among them), or the default budget."""
    if not pages:
        return Engine(path, tp.single(), PlanView(), EngineOptions(page_size=4))
    probe = Engine(path, tp.single(), PlanView(), EngineOptions(page_size=4))
    per_page = probe.cache.bytes_per_token * 4
    return Engine(path, tp.single(), PlanView(), EngineOptions(page_size=4, kv_cache_bytes=pages * per_page))


def test_requests_that_do_not_all_fit_in_the_kv_cache_wait_their_turn(checkpoints: dict[str, str]) -> None:
    """Concurrency 0 (all at once) with a cache that holds two requests at a time: the whole
    workload failed "KV cache exhausted" part way. As a serving engine's scheduler does, a
    request now enters the engine once its prompt and its new tokens have room, and waits (its
    TTFT counting the wait) until then; the tokens are those of a cache that holds them all."""
    prompts = [[3 + i, 4, 5, 6, 7, 8] for i in range(4)]  # 6 + 4 new tokens: 3 pages of 4 each
    small = driver.run(_engine(checkpoints["tiny"], pages=7), prompts, 4, len(prompts), driver.Sampler())
    roomy = driver.run(_engine(checkpoints["tiny"]), prompts, 4, len(prompts), driver.Sampler())
    assert [r["output_tokens"] for r in small["requests"]] == [r["output_tokens"] for r in roomy["requests"]]
    assert small["aggregate"]["waited_for_kv"] == 2 and roomy["aggregate"]["waited_for_kv"] == 0
    waited = {r["id"] for r in small["requests"] if r["ttft_ms"] > max(x["ttft_ms"] for x in small["requests"][:2])}
    assert waited == {2, 3}  # in order: the first two ran first


def test_a_request_the_kv_cache_cannot_hold_alone_fails_before_any_step(checkpoints: dict[str, str]) -> None:
    engine = _engine(checkpoints["tiny"], pages=3)  # 2 usable pages: 8 tokens
    with pytest.raises(KVCacheExhausted) as err:
        driver.run(engine, [[5, 6, 7]] + [[5, 6, 7, 8, 9, 10]], 4, 2, driver.Sampler())
    assert str(err.value) == ("KV cache exhausted: request 1 needs 10 tokens (its 6 prompt tokens and 4 new), 3 pages "
                              "of 4; the cache holds 2 pages (8 tokens) on this rank; shorten the workload or give "
                              "the cache more memory")
    assert engine.stats["prefill"].eager == {}  # nothing ran


def test_the_kv_budget_is_256_mib_on_a_cpu_and_half_the_free_memory_on_a_gpu() -> None:
    """A launch passes no --kv-cache-mb: every rank had 256 MiB of KV cache, on an H200 too (a
    few thousand tokens of a 61-layer model). auto keeps 256 MiB on a CPU and takes half of what
    the GPU has free once the weights are loaded, leaving the rest to activations and graphs."""
    import torch
    from cgsvc_worker.engine import kv_budget

    assert kv_budget(None, torch.device("cpu")) == (256 << 20, "auto: 256 MiB on cpu")
    free = 100 << 30
    assert kv_budget(None, torch.device("cuda", 0), lambda: free) == (
        50 << 30, "auto: half of the 100.0 GiB free on cuda:0 once the weights were loaded (the rest for "
                  "activations and captured graphs)")
    assert kv_budget(64 << 20, torch.device("cuda", 0), lambda: free) == (64 << 20, "asked for: --kv-cache-mb 64")


def test_the_report_says_what_the_kv_budget_was_and_why(checkpoints: dict[str, str]) -> None:
    kv = _engine(checkpoints["tiny"]).describe()["kv_cache"]
    assert (kv["budget_bytes"], kv["budget_reason"]) == (256 << 20, "auto: 256 MiB on cpu")
    assert kv["pages"] == (256 << 20) // (kv["bytes_per_token"] * kv["page_size"])


class SlowToSample(driver.Sampler):
    """Greedy, but its first call (the prefill's) takes 0.2 s: as a GPU step does, whose kernels
    run after the call that queued them returned, until the sampler reads the tokens back."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self, logits: Any) -> list[int]:
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.2)
        return super().__call__(logits)


def test_a_token_is_timed_once_it_has_been_read_back_not_when_its_step_was_queued(
        checkpoints: dict[str, str]) -> None:
    """On a GPU engine.prefill returns once the kernels are queued; the token exists when the
    sampler has read the logits back (its .tolist() waits for the device). The driver took the
    time before sampling, so TTFT left out the device's prefill time: here the 0.2 s stands for it."""
    out = driver.run(_engine(checkpoints["tiny"]), [[3, 4, 5, 6]], 3, 1, SlowToSample())
    (request,) = out["requests"]
    assert request["ttft_ms"] >= 200, request  # the sleep lies between arrival and the first token's time


def test_a_warm_up_request_runs_before_the_timed_run_and_leaves_nothing_behind(checkpoints: dict[str, str]) -> None:
    """The first request's TTFT carried whatever a path does once (a GPU's lazily loaded and
    FlashInfer's JIT-compiled kernels, cuBLAS handles, the allocator's first blocks), as serving
    benchmarks warm up first. One untimed request of a prompt and a decode step runs before the
    workload, then is forgotten: its pages freed, the step counts and cache counters as they were,
    and the workload's tokens those of an engine that never warmed up."""
    prompts = [[3 + i, 4, 5, 6, 7, 8] for i in range(3)]
    cold = driver.run(_engine(checkpoints["tiny"]), prompts, 4, 2, driver.Sampler())
    engine = _engine(checkpoints["tiny"])
    free, saturated = sorted(engine.cache.free), int(engine.cache.saturated.item())
    seconds = engine.warm_up(tokens=5)
    assert seconds > 0
    assert sorted(engine.cache.free) == free and not engine.cache.seqs and int(engine.cache.saturated.item()) == saturated
    assert engine.describe()["steps"] == _engine(checkpoints["tiny"]).describe()["steps"]  # nothing counted
    warm = driver.run(engine, prompts, 4, 2, driver.Sampler())
    assert [r["output_tokens"] for r in warm["requests"]] == [r["output_tokens"] for r in cold["requests"]]
    assert warm["aggregate"]["output_tokens"] == cold["aggregate"]["output_tokens"]
