"""The statistics of an A/B experiment: means with 95 % bootstrap intervals (scipy.stats.bootstrap).

Per arm, every request of every launch of that arm is one sample of TTFT (and of TPOT, when
it produced more than one token). The difference B - A resamples the two arms
independently. Requests of one launch share its process and placement, so they are not fully
independent: with at least MIN_LAUNCHES launches per arm the difference is also taken over the
launches' means, and a request-level finding that the launches do not bear out is reported as
"cannot tell". A fixed seed makes a stored result reproducible from its samples.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_LAUNCHES = 3  # per arm, for the launch-level check
CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 20261130
# Past these many samples in an arm, BCa's jackknife (n evaluations over n samples) costs more
# than it corrects, and then the bootstrap itself more than the normal approximation, which at
# that size gives the same interval. Resamples go in batches of at most BATCH_VALUES values.
BCA_MAX = 10_000
BOOTSTRAP_MAX = 50_000
BATCH_VALUES = 2_000_000
METHOD = (f"scipy.stats.bootstrap, BCa ({BCA_MAX:,} samples an arm at most; percentile to {BOOTSTRAP_MAX:,}, "
          f"the normal approximation past that), {RESAMPLES} resamples, {int(CONFIDENCE * 100)} % confidence, "
          f"seed {SEED}")


def _finite(lo: float, hi: float) -> list[float] | None:
    return [round(lo, 4), round(hi, 4)] if math.isfinite(lo) and math.isfinite(hi) else None


def _interval(data: tuple[np.ndarray, ...], statistic: Any) -> list[float] | None:
    """The BCa interval, or the percentile one where BCa is degenerate (all samples equal); None
    below two samples per arm."""
    if any(len(d) < 2 for d in data):
        return None
    n = max(len(d) for d in data)
    if n > BOOTSTRAP_MAX:
        return _normal(data)
    from scipy import stats  # here, not at the top: importing it was 60 % of the server's start-up
    for method in ("BCa", "percentile") if n <= BCA_MAX else ("percentile",):
        with warnings.catch_warnings():  # BCa on equal samples divides by zero: that is the fallback's cue
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            res = stats.bootstrap(data, statistic, n_resamples=RESAMPLES, confidence_level=CONFIDENCE,
                                  method=method, vectorized=True, axis=-1, rng=np.random.default_rng(SEED),
                                  batch=max(1, BATCH_VALUES // n))
        ci = _finite(float(res.confidence_interval.low), float(res.confidence_interval.high))
        if ci is not None:
            return ci
    return None


def _normal(data: tuple[np.ndarray, ...]) -> list[float] | None:
    """The interval of a mean (one sample) or of a difference of means (two: b, a) from the normal
    approximation, for samples so many that a bootstrap would only take longer to agree with it."""
    from scipy import stats

    estimate = float(np.mean(data[0]) - (np.mean(data[1]) if len(data) > 1 else 0.0))
    error = math.sqrt(sum(float(np.var(d, ddof=1)) / len(d) for d in data))
    z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))
    return _finite(estimate - z * error, estimate + z * error)


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


def _call(diff: dict[str, Any], launches: dict[str, Any] | None) -> str:
    """What one metric's difference allows to say: no_samples, too_few, equal, spans_zero,
    launches_disagree, slower or faster (B against A)."""
    ci = diff["ci"]
    if diff["mean"] is None:
        return "no_samples"
    if ci is None:
        return "too_few"
    lo, hi = ci
    if lo == hi == 0:
        return "equal"
    if lo <= 0 <= hi:
        return "spans_zero"
    if launches is not None and launches["ci"] is not None and launches["ci"][0] <= 0 <= launches["ci"][1]:
        return "launches_disagree"
    return "slower" if lo > 0 else "faster"


def verdict_part(metric: str, diff: dict[str, Any], launches: dict[str, Any] | None = None) -> str:
    """What one metric's difference says, or why it cannot say. `launches` is the difference
    over launch means (None when an arm has fewer than MIN_LAUNCHES launches)."""
    call = _call(diff, launches)
    if call == "no_samples":
        return f"{metric}: no samples"
    if call == "too_few":
        return f"{metric}: too few samples to tell (need two per arm)"
    if call == "equal":
        return f"{metric}: no difference (every sample equal)"
    lo, hi = diff["ci"]
    span = f"95 % CI [{lo:+.2f}, {hi:+.2f}] ms"
    if call == "spans_zero":
        return f"{metric}: cannot tell, the interval spans zero ({span}); add repeats or requests"
    if call == "launches_disagree":
        llo, lhi = launches["ci"]  # type: ignore[index]
        return (f"{metric}: cannot tell, the requests differ ({span}) but the launches do not agree "
                f"(launch-level 95 % CI [{llo:+.2f}, {lhi:+.2f}] ms spans zero); add repeats")
    note = "" if launches is not None else f"; launch-to-launch variation not checked (under {MIN_LAUNCHES} launches per arm)"
    return f"{metric}: B is {call} by {abs(diff['mean']):.2f} ms{_relative(diff)}, {span}{note}"


def brief_part(metric: str, diff: dict[str, Any], launches: dict[str, Any] | None = None) -> str:
    """The same call in a few words, for a list: "TTFT B faster 8.12 ms (-10 %)", "TPOT cannot tell"."""
    call = _call(diff, launches)
    if call in ("slower", "faster"):
        return f"{metric} B {call} {abs(diff['mean']):.2f} ms{_relative(diff)}"
    return f"{metric} {CALL_WORDS[call]}"


# Each call _call makes, in the words a list or a summary shows it by.
CALL_WORDS = {"slower": "B slower", "faster": "B faster", "no_samples": "no samples", "too_few": "too few samples",
              "equal": "no difference", "spans_zero": "cannot tell", "launches_disagree": "cannot tell (launches disagree)"}


METRICS = ("ttft_ms", "tpot_ms")
DECISIVE = ("slower", "faster")  # the calls that say something about B against A


def metric_call(result: dict[str, Any], metric: str) -> dict[str, Any]:
    """What a stored result says of one metric: its call (as _call names it), the difference's
    mean and interval, and the call in a few words."""
    diff = (result.get("difference") or {}).get(metric) or {"mean": None, "ci": None}
    launches = diff.get("launch_level")
    return {"call": _call(diff, launches), "mean": diff.get("mean"), "ci": diff.get("ci"),
            "brief": brief_part(metric.split("_")[0].upper(), diff, launches)}


def agreement(a: str, b: str) -> str:
    """Whether two calls on one metric agree: held (both say B is faster, or both slower),
    flipped (one says faster, the other slower), neither can tell, or only one tells."""
    if a in DECISIVE and b in DECISIVE:
        return "held" if a == b else "flipped"
    if a in DECISIVE or b in DECISIVE:
        return "only a tells" if a in DECISIVE else "only b tells"
    return "neither can tell"


def reversed_difference(diff: dict[str, Any]) -> dict[str, Any]:
    """A difference B - A as A - B: what an experiment that ran the same plans with its arms the
    other way round says of them (the interval's ends negated and swapped; relative to the other arm)."""
    def flip(d: dict[str, Any] | None) -> dict[str, Any] | None:
        if d is None:
            return None
        mean, ci, rel = d.get("mean"), d.get("ci"), d.get("relative")
        return {**d, "mean": None if mean is None else -mean, "ci": None if ci is None else [-ci[1], -ci[0]],
                "relative": None if rel is None or rel == -1 else -rel / (1 + rel)}
    flipped = flip(diff)
    assert flipped is not None
    flipped["launch_level"] = flip(diff.get("launch_level"))
    return flipped


def compare(a: dict[str, Any], b: dict[str, Any], swapped: bool = False) -> list[dict[str, Any]]:
    """Two experiments' results, metric by metric: each one's call and whether they agree (an
    experiment and its rerun: did the verdict hold?). `swapped`: b ran a's plans with its arms
    the other way round (b's A is a's B), so b's differences are read reversed."""
    if swapped:
        b = {**b, "difference": {m: reversed_difference(d) for m, d in (b.get("difference") or {}).items()}}
    out = []
    for metric in METRICS:
        ca, cb = metric_call(a, metric), metric_call(b, metric)
        out.append({"metric": metric, "a": ca, "b": cb, "agreement": agreement(ca["call"], cb["call"])})
    return out


def _relative(diff: dict[str, Any]) -> str:
    return f" ({diff['relative'] * 100:+.0f} %)" if diff["relative"] is not None else ""


def analyse(samples: dict[str, dict[str, list[float]]],
            launch_means: dict[str, dict[str, list[float]]] | None = None) -> dict[str, Any]:
    """The result of an experiment from its samples {"A": {"ttft_ms": [...], "tpot_ms": [...]}, "B": ...}
    and, per arm and metric, the mean of each launch."""
    out: dict[str, Any] = {"method": METHOD, "arms": {}, "difference": {}}
    means = launch_means or {arm: {"ttft_ms": [], "tpot_ms": []} for arm in ("A", "B")}
    for arm in ("A", "B"):
        out["arms"][arm] = {m: summary(samples[arm][m]) for m in ("ttft_ms", "tpot_ms")}
        out["arms"][arm]["launch_means"] = means[arm]
    parts, briefs = [], []
    for metric in ("ttft_ms", "tpot_ms"):
        diff = difference(samples["A"][metric], samples["B"][metric])
        a, b = means["A"][metric], means["B"][metric]
        launches = difference(a, b) if min(len(a), len(b)) >= MIN_LAUNCHES else None
        out["difference"][metric] = {**diff, "launch_level": launches}
        name = metric.split("_")[0].upper()
        parts.append(verdict_part(name, diff, launches))
        briefs.append(brief_part(name, diff, launches))
    out["verdict"] = "; ".join(parts)
    out["verdict_brief"] = "; ".join(briefs)
    return out
