"""Experiment statistics: bootstrap intervals from scipy, and verdicts that say when they cannot tell."""

from __future__ import annotations

import random
import statistics

import pytest

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


def test_one_odd_launch_is_not_a_plan_effect() -> None:
    """Requests of B differ (one of its three launches was slow), but the launches do not agree:
    the verdict says it cannot tell."""
    r = random.Random(11)

    def launch(mean: float) -> list[float]:
        return [mean + r.gauss(0, 0.5) for _ in range(10)]

    a = [launch(100), launch(100), launch(100)]
    b = [launch(100), launch(100), launch(130)]
    flat = {"A": {"ttft_ms": sum(a, []), "tpot_ms": []}, "B": {"ttft_ms": sum(b, []), "tpot_ms": []}}
    means = {arm: {"ttft_ms": [sum(x) / len(x) for x in runs], "tpot_ms": []} for arm, runs in (("A", a), ("B", b))}
    out = stats.analyse(flat, means)
    assert out["difference"]["ttft_ms"]["ci"][0] > 0  # the requests alone would say "slower"
    assert out["difference"]["ttft_ms"]["launch_level"]["ci"][0] <= 0
    assert out["verdict"].startswith("TTFT: cannot tell, the requests differ")
    consistent = {arm: {"ttft_ms": [sum(x) / len(x) for x in runs], "tpot_ms": []}
                  for arm, runs in (("A", a), ("B", [launch(130), launch(131), launch(129)]))}
    flat["B"]["ttft_ms"] = [v + 30 for v in sum(a, [])]
    assert stats.analyse(flat, consistent)["verdict"].startswith("TTFT: B is slower by")



def test_large_samples_take_the_cheaper_interval_each_size_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: 10,000 samples an arm took 21 s and 4 GB (BCa's jackknife holds n x n values,
    the resamples 9999 x n) in the server's event loop. Past BCA_MAX samples the interval is the
    percentile bootstrap, in batches; past BOOTSTRAP_MAX the normal approximation, which at that
    size agrees with it. The thresholds are lowered here so that each path runs in a moment."""
    monkeypatch.setattr(stats, "BCA_MAX", 50)
    monkeypatch.setattr(stats, "BOOTSTRAP_MAX", 200)
    rng = random.Random(7)
    for n in (100, 300):  # the percentile bootstrap, then the normal approximation
        a = [rng.gauss(50, 5) for _ in range(n)]
        b = [x + 2 + rng.gauss(0, 1) for x in a]
        diff = stats.difference(a, b)
        lo, hi = diff["ci"]
        assert lo < diff["mean"] < hi and lo > 0 and hi - lo < 4, diff  # about 2 ms, and said to be
    a, b = [float(i % 10) for i in range(300)], [float(i % 10) + 1 for i in range(300)]
    se = (2 * statistics.variance(a) / 300) ** 0.5  # both samples have a's variance
    lo, hi = stats.difference(a, b)["ci"]
    assert abs(lo - (1 - 1.959964 * se)) < 1e-3 and abs(hi - (1 + 1.959964 * se)) < 1e-3, (lo, hi)
    assert "percentile to 50,000, the normal approximation past that" in stats.METHOD  # the stored method says so


def test_an_experiment_keeps_its_first_samples_and_counts_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result kept every sample: an experiment of 100 launches of 10,000 requests would store
    millions, which no GetExperiment answer could carry. It keeps SAMPLES_KEPT of each, says how
    many it left out, and its statistics still count every one."""
    from cgsvc.domain import experiments
    from cgsvc.launch.store import ExperimentRow

    monkeypatch.setattr(experiments, "SAMPLES_KEPT", 10)
    row = ExperimentRow("e1", "RUNNING", "alice", {"plans": ["plans/a", "plans/b"]})
    samples = {arm: {"ttft_ms": [float(i) for i in range(25)], "tpot_ms": [1.0] * 8} for arm in ("A", "B")}
    out = experiments.result_of(row, samples)
    for arm in ("A", "B"):
        assert out["arms"][arm]["samples"]["ttft_ms"] == [float(i) for i in range(10)]
        assert out["arms"][arm]["samples"]["tpot_ms"] == [1.0] * 8
        assert out["arms"][arm]["samples_omitted"] == {"ttft_ms": 15}
        assert out["arms"][arm]["ttft_ms"]["n"] == 25 and out["arms"][arm]["ttft_ms"]["mean"] == 12.0

def test_the_brief_verdict_is_the_verdicts_call_in_a_few_words() -> None:
    """`experiments list` showed the first 80 characters of the verdict: the first metric's
    "cannot tell, the interval spans zero (95 % CI ...)", never the second's. The brief one
    names each metric's call."""
    r = random.Random(7)
    a = [100 + r.gauss(0, 5) for _ in range(20)]
    b = [300 + r.gauss(0, 20) for _ in range(20)]
    out = stats.analyse({"A": {"ttft_ms": a, "tpot_ms": a}, "B": {"ttft_ms": b, "tpot_ms": a}})
    rel = out["difference"]["ttft_ms"]["relative"] * 100
    assert out["verdict_brief"] == (f"TTFT B slower {out['difference']['ttft_ms']['mean']:.2f} ms ({rel:+.0f} %); "
                                    "TPOT cannot tell")
    faster = stats.analyse({"A": {"ttft_ms": b, "tpot_ms": []}, "B": {"ttft_ms": a, "tpot_ms": [1.0]}})
    assert faster["verdict_brief"].startswith("TTFT B faster ") and faster["verdict_brief"].endswith("; TPOT no samples")
    assert stats.brief_part("TPOT", stats.difference([10.0] * 4, [10.0] * 4)) == "TPOT no difference"
    assert stats.brief_part("TPOT", stats.difference([1.0], [2.0])) == "TPOT too few samples"
    r2 = random.Random(11)
    a3 = [[100 + r2.gauss(0, 0.5) for _ in range(10)] for _ in range(3)]
    b3 = [[m + r2.gauss(0, 0.5) for _ in range(10)] for m in (100, 100, 130)]
    means = {arm: {"ttft_ms": [sum(x) / len(x) for x in runs], "tpot_ms": []} for arm, runs in (("A", a3), ("B", b3))}
    odd = stats.analyse({"A": {"ttft_ms": sum(a3, []), "tpot_ms": []}, "B": {"ttft_ms": sum(b3, []), "tpot_ms": []}},
                        means)
    assert odd["verdict_brief"].startswith("TTFT cannot tell (launches disagree); ")
    assert len(out["verdict_brief"]) < 80


def _result(a: list[float], b: list[float]) -> dict[str, object]:
    """A stored result whose TTFT arms are `a` and `b`, and whose TPOT arms are equal."""
    return stats.analyse({"A": {"ttft_ms": a, "tpot_ms": [5.0] * 4}, "B": {"ttft_ms": b, "tpot_ms": [5.0] * 4}})


def test_two_experiments_calls_are_compared_metric_by_metric() -> None:
    """`experiments diff`: whether a verdict held when the experiment ran again."""
    r = random.Random(11)
    slow = [100 + r.gauss(0, 2) for _ in range(20)]
    fast = [50 + r.gauss(0, 2) for _ in range(20)]
    noise = [100 + r.gauss(0, 30) for _ in range(6)]
    b_faster, again, b_slower, unclear = _result(slow, fast), _result(slow, fast), _result(fast, slow), _result(
        noise, [100 + r.gauss(0, 30) for _ in range(6)])
    held = {m["metric"]: m for m in stats.compare(b_faster, again)}
    assert held["ttft_ms"]["agreement"] == "held" and held["ttft_ms"]["a"]["call"] == "faster", held
    assert held["ttft_ms"]["a"]["brief"].startswith("TTFT B faster ") and held["ttft_ms"]["b"]["ci"][1] < 0
    assert held["tpot_ms"]["agreement"] == "neither can tell" and held["tpot_ms"]["a"]["call"] == "equal", held
    assert {m["metric"]: m["agreement"] for m in stats.compare(b_faster, b_slower)}["ttft_ms"] == "flipped"
    assert {m["metric"]: m["agreement"] for m in stats.compare(b_faster, unclear)}["ttft_ms"] == "only a tells"
    assert {m["metric"]: m["agreement"] for m in stats.compare(unclear, b_slower)}["ttft_ms"] == "only b tells"
    nothing = stats.compare({}, b_faster)[0]  # a result with nothing measured yet
    assert (nothing["a"]["call"], nothing["agreement"]) == ("no_samples", "only b tells"), nothing


def test_an_experiment_with_its_arms_swapped_is_compared_with_its_calls_reversed() -> None:
    """B faster in `a` is A faster in `b` when b ran a's plans the other way round: that held."""
    r = random.Random(5)
    slow = [100 + r.gauss(0, 2) for _ in range(20)]
    fast = [50 + r.gauss(0, 2) for _ in range(20)]
    one, swapped = _result(slow, fast), _result(fast, slow)
    (ttft, _) = stats.compare(one, swapped, swapped=True)
    assert (ttft["b"]["call"], ttft["agreement"]) == ("faster", "held"), ttft
    assert ttft["b"]["mean"] < 0 and ttft["b"]["ci"][1] < 0 and ttft["b"]["brief"].startswith("TTFT B faster"), ttft
    assert stats.compare(one, swapped)[0]["agreement"] == "flipped"  # read as given, it flips
