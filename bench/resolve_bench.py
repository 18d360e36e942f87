"""In-process resolve time: median and p99 for the Kimi example and for a batch of varied specs.

    .venv/bin/python bench/resolve_bench.py [--n 5000]

Prints a Markdown table row set for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time
from typing import Any

from cgsvc import catalog
from cgsvc.resolve import resolve
from cgsvc.spec import parse_spec

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}


def varied_specs() -> list[dict[str, Any]]:
    models = catalog.canonical_model_names()
    gpus = [g for g in catalog.gpus() if g != "cpu"]
    extras: list[dict[str, Any]] = [
        {}, {"overrides": {"enforce_piecewise_cuda_graph": True}},
        {"features": {"speculative_algorithm": "EAGLE"}},
        {"parallelism": {"tp": 8, "dp": 8, "enable_dp_attention": True}},
        {"overrides": {"cuda_graph": {"decode": {"max_bs": 160}}}},
        {"features": {"kv_cache_dtype": "fp8_e4m3", "max_total_tokens": 3000}},
    ]
    specs = []
    for model, gpu, extra in itertools.product(models, gpus, extras):
        spec = {"model": {"name": model}, "hardware": {"gpu": gpu, "gpu_count": 8}, "parallelism": {"tp": 8}}
        for k, v in extra.items():
            spec[k] = {**spec.get(k, {}), **v}
        specs.append(spec)
    return specs


def measure(specs: list[dict[str, Any]], n: int) -> tuple[float, float, int]:
    """Median and p99 microseconds of parse + resolve; refused specs count too."""
    times = []
    refused = 0
    for spec in itertools.islice(itertools.cycle(specs), n):
        t0 = time.perf_counter_ns()
        try:
            resolve(parse_spec(spec))
        except Exception:  # noqa: BLE001 - a refusal is a normal outcome here
            refused += 1
        times.append((time.perf_counter_ns() - t0) / 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1], refused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ns = ap.parse_args()
    resolve(parse_spec(KIMI))  # warm caches (catalog load, policy hash)
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, n={ns.n}")
    print("| workload | median µs | p99 µs | refused |")
    print("|---|---|---|---|")
    med, p99, _ = measure([KIMI], ns.n)
    print(f"| Kimi-K2.6-NVFP4 on 4xGB300 TP4 | {med:.0f} | {p99:.0f} | 0 |")
    specs = varied_specs()
    med, p99, refused = measure(specs, ns.n)
    print(f"| {len(specs)} varied specs (models x GPUs x features) | {med:.0f} | {p99:.0f} | {refused} of {ns.n} |")


if __name__ == "__main__":
    main()
