"""The statistics of an A/B experiment: means with 95 % bootstrap intervals (scipy.stats.bootstrap).

Per arm, every request of every launch of that arm is one sample of TTFT (and of TPOT, when
it produced more than one token). The difference B - A resamples the two arms
independently. A fixed seed makes a stored result reproducible from its samples.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 20261130
METHOD = f"scipy.stats.bootstrap, BCa, {RESAMPLES} resamples, {int(CONFIDENCE * 100)} % confidence, seed {SEED}"


def _finite(lo: float, hi: float) -> list[float] | None:
    return [round(lo, 4), round(hi, 4)] if math.isfinite(lo) and math.isfinite(hi) else None


def _interval(data: tuple[np.ndarray, ...], statistic: Any) -> list[float] | None:
    """The BCa interval, or the percentile one where BCa is degenerate (all samples equal); None
    below two samples per arm."""
    if any(len(d) < 2 for d in data):
        return None
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():  # BCa on equal samples divides by zero: that is the fallback's cue
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            res = stats.bootstrap(data, statistic, n_resamples=RESAMPLES, confidence_level=CONFIDENCE,
                                  method=method, vectorized=True, axis=-1, rng=np.random.default_rng(SEED))
        ci = _finite(float(res.confidence_interval.low), float(res.confidence_interval.high))
        if ci is not None:
            return ci
    return None


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _mean_diff(b: np.ndarray, a: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(b, axis=axis) - np.mean(a, axis=axis)


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """{"n", "mean", "ci"} of one arm's samples (ci is [low, high], or null below two samples)."""
    x = np.asarray(samples, dtype=float)
    if len(x) == 0:
        return {"n": 0, "mean": None, "ci": None}
    return {"n": int(len(x)), "mean": round(float(x.mean()), 4), "ci": _interval((x,), _mean)}


def difference(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """B - A: the difference of means, its interval, and the change relative to A's mean."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(xa) == 0 or len(xb) == 0:
        return {"mean": None, "ci": None, "relative": None}
    d = float(xb.mean() - xa.mean())
    return {"mean": round(d, 4), "ci": _interval((xb, xa), _mean_diff),
            "relative": round(d / float(xa.mean()), 4) if xa.mean() else None}


def verdict_part(metric: str, diff: dict[str, Any]) -> str:
    """What one metric's difference says, or why it cannot say."""
    ci = diff["ci"]
    if diff["mean"] is None:
        return f"{metric}: no samples"
    if ci is None:
        return f"{metric}: too few samples to tell (need two per arm)"
    lo, hi = ci
    if lo == hi == 0:
        return f"{metric}: no difference (every sample equal)"
    rel = f" ({diff['relative'] * 100:+.0f} %)" if diff["relative"] is not None else ""
    span = f"95 % CI [{lo:+.2f}, {hi:+.2f}] ms"
    if lo > 0:
        return f"{metric}: B is slower by {diff['mean']:.2f} ms{rel}, {span}"
    if hi < 0:
        return f"{metric}: B is faster by {-diff['mean']:.2f} ms{rel}, {span}"
    return f"{metric}: cannot tell, the interval spans zero ({span}); add repeats or requests"


def analyse(samples: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """The result of an experiment from its samples {"A": {"ttft_ms": [...], "tpot_ms": [...]}, "B": ...}."""
    out: dict[str, Any] = {"method": METHOD, "arms": {}, "difference": {}}
    for arm in ("A", "B"):
        out["arms"][arm] = {m: summary(samples[arm][m]) for m in ("ttft_ms", "tpot_ms")}
    parts = []
    for metric in ("ttft_ms", "tpot_ms"):
        diff = difference(samples["A"][metric], samples["B"][metric])
        out["difference"][metric] = diff
        parts.append(verdict_part(metric.split("_")[0].upper(), diff))
    out["verdict"] = "; ".join(parts)
    return out
