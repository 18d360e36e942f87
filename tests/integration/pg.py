"""PostgreSQL test databases: a fresh schema per test on the server at 127.0.0.1:5432."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

PG_BASE = os.environ.get("CGSVC_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CREATED: list[str] = []  # schemas this test session made; dropped when it ends (tests/conftest.py)


def pg_available() -> bool:
    try:
        eng = sa.create_engine(PG_BASE, connect_args={"connect_timeout": 3})
        with eng.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        eng.dispose()
        return True
    except sa.exc.OperationalError:
        return False


def drop_created() -> None:
    if not CREATED:
        return
    eng = sa.create_engine(PG_BASE)
    with eng.begin() as conn:
        for schema in CREATED:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    eng.dispose()
    CREATED.clear()


def pg_url_or_skip(schema: str) -> str:
    """A URL whose search_path is a new, empty schema; skips where no server answers."""
    if not pg_available():
        pytest.skip(f"no PostgreSQL server answers at {PG_BASE} (set CGSVC_TEST_PG to point at one)")
    eng = sa.create_engine(PG_BASE)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    eng.dispose()
    CREATED.append(schema)
    return f"{PG_BASE}?options=-csearch_path%3D{schema}"
