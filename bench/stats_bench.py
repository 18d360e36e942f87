"""An experiment's statistics at large sample counts: time and peak memory of one result.

    .venv/bin/python bench/stats_bench.py [--sizes 2000,10000,30000,100000] [--before-up-to 10000]

Each measurement runs in a fresh process (so that its peak resident memory is its own): the
server's `cgsvc.domain.stats.analyse` over two arms of N samples of TTFT and TPOT, as an
experiment's result is made after each launch. `before` is the method this replaced, measured
side by side in the same run: BCa on every size, with every resample held at once (up to
`--before-up-to` samples an arm; past that it needs more memory than this machine has). Prints
Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings

import numpy as np


def samples(n: int) -> dict[str, dict[str, list[float]]]:
    rng = np.random.default_rng(1)
    return {arm: {"ttft_ms": list(rng.normal(50 + shift, 5, n)), "tpot_ms": list(rng.normal(10, 1, n))}
            for arm, shift in (("A", 0.0), ("B", 1.0))}


def before(data: dict[str, dict[str, list[float]]]) -> None:
    """The replaced method: BCa over every size, all 9999 resamples (and the n x n jackknife) at once."""
    from scipy import stats as sp

    from cgsvc.domain.stats import RESAMPLES, SEED
    for metric in ("ttft_ms", "tpot_ms"):
        a, b = (np.asarray(data[arm][metric]) for arm in ("A", "B"))
        for sample, statistic in (((a,), np.mean), ((b,), np.mean),
                                  ((b, a), lambda y, x, axis=-1: np.mean(y, axis=axis) - np.mean(x, axis=axis))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sp.bootstrap(sample, statistic, n_resamples=RESAMPLES, method="BCa", vectorized=True, axis=-1,
                             rng=np.random.default_rng(SEED))


def one(method: str, n: int) -> None:
    """Measure one result in this process; print {"seconds", "peak_mib"}."""
    from cgsvc.domain import stats

    data = samples(n)
    t0 = time.perf_counter()
    if method == "now":
        stats.analyse(data)
    else:
        before(data)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": round(seconds, 2),
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2000,10000,30000,100000", help="samples an arm, comma-separated")
    ap.add_argument("--before-up-to", type=int, default=10_000,
                    help="measure the replaced method up to this many samples an arm (default 10,000)")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.one:
        one(ns.one[0], int(ns.one[1]))
        return
    rows = []
    for n in (int(x) for x in ns.sizes.split(",")):
        got = {}
        for method in ("before", "now"):
            if method == "before" and n > ns.before_up_to:
                continue
            print(f"{method}: {n} samples an arm ...", file=sys.stderr, flush=True)
            out = subprocess.run([sys.executable, __file__, "--one", method, str(n)], capture_output=True, text=True,
                                 check=True)
            got[method] = json.loads(out.stdout)
        rows.append((n, got))
    print("| samples an arm | before: s | before: peak MiB | now: s | now: peak MiB | now: interval |")
    print("|---|---|---|---|---|---|")
    from cgsvc.domain.stats import BCA_MAX, BOOTSTRAP_MAX
    for n, got in rows:
        kind = "BCa" if n <= BCA_MAX else "percentile" if n <= BOOTSTRAP_MAX else "normal approximation"
        b = got.get("before", {})
        print(f"| {n:,} | {b.get('seconds', '-')} | {b.get('peak_mib', '-')} | {got['now']['seconds']} | "
              f"{got['now']['peak_mib']} | {kind} |")


if __name__ == "__main__":
    main()
