"""The durable-path target line of bench/resolve_load.py names each row that misses it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("resolve_load", Path(__file__).parents[2] / "bench" / "resolve_load.py")
assert spec is not None and spec.loader is not None
resolve_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resolve_load)


def test_rows_that_miss_the_target_are_named() -> None:
    echo = (2000.0, 3.0, 10.0, 0)
    assert resolve_load.target_misses("sqlite", 8, echo, (1000.0, 6.0, 30.0, 0)) == []  # 50 %: met
    assert resolve_load.target_misses("sqlite", 8, echo, (990.0, 6.0, 30.0, 0)) == [
        "sqlite at 8 callers 49.5% of Echo"]
    assert resolve_load.target_misses("postgresql", 32, echo, (1200.0, 9.0, 20.0, 0)) == []  # 20 ms floor
    assert resolve_load.target_misses("postgresql", 32, (2000.0, 3.0, 30.0, 0), (900.0, 9.0, 61.0, 0)) == [
        "postgresql at 32 callers 45.0% of Echo", "postgresql p99 at 32 callers 61.0 ms > 60.0"]
    assert resolve_load.target_misses("sqlite", 1, echo, (100.0, 1.0, 99.0, 0)) == []  # not a target row
