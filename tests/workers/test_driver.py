"""The workload driver's arithmetic: percentiles as serving benchmarks report them."""

from __future__ import annotations

import numpy as np
import pytest
from cgsvc_worker.driver import percentiles


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
