"""Shared test fixtures and paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CASES = ROOT / "tests" / "cases"


@pytest.fixture(scope="session", autouse=True)
def _drop_postgres_schemas() -> Iterator[None]:
    """Leave the shared PostgreSQL database as we found it."""
    yield
    from tests.integration.pg import drop_created

    drop_created()
