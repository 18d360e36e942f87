"""Experiment statistics: bootstrap intervals from scipy, and verdicts that say when they cannot tell."""

from __future__ import annotations

import random

from cgsvc.domain import stats


def test_a_clear_difference_has_an_interval_away_from_zero() -> None:
    r = random.Random(7)
    a = [100 + r.gauss(0, 5) for _ in range(20)]
    b = [300 + r.gauss(0, 20) for _ in range(20)]
    out = stats.analyse({"A": {"ttft_ms": a, "tpot_ms": a}, "B": {"ttft_ms": b, "tpot_ms": a}})
    d = out["difference"]["ttft_ms"]
    assert d["ci"][0] > 150 and d["ci"][1] < 250 and 1.5 < d["relative"] < 2.5
    lo, hi = out["arms"]["A"]["ttft_ms"]["ci"]
    assert lo < out["arms"]["A"]["ttft_ms"]["mean"] < hi
    assert out["verdict"].startswith("TTFT: B is slower by")
    assert "TPOT: cannot tell" in out["verdict"]  # the same samples on both sides: nothing to tell apart
    same = stats.verdict_part("TPOT", stats.difference([10.0] * 4, [10.0] * 4))
    assert same == "TPOT: no difference (every sample equal)"


def test_noise_is_called_noise() -> None:
    r = random.Random(3)
    a = [100 + r.gauss(0, 30) for _ in range(6)]
    b = [102 + r.gauss(0, 30) for _ in range(6)]
    part = stats.verdict_part("TTFT", stats.difference(a, b))
    assert part.startswith("TTFT: cannot tell") and "spans zero" in part


def test_too_few_samples_say_so() -> None:
    assert stats.summary([]) == {"n": 0, "mean": None, "ci": None}
    assert stats.summary([5.0])["ci"] is None
    assert "too few samples" in stats.verdict_part("TPOT", stats.difference([1.0], [2.0]))
    assert stats.verdict_part("TPOT", stats.difference([], [2.0])) == "TPOT: no samples"


def test_results_are_reproducible() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 3.5, 4.0, 6.0]
    assert stats.difference(a, b) == stats.difference(a, b)
