"""PostgreSQL test databases: a fresh schema per test on the server at 127.0.0.1:5432."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

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


class Proxy:
    """A TCP forwarder between the server and PostgreSQL: stopping it is the database going away
    (its listener closed, every connection through it cut), starting it again its return."""

    def __init__(self, port: int, to: tuple[str, int]) -> None:
        self.port, self.to = port, to
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                near, _ = listener.accept()
                far = socket.create_connection(self.to)
            except OSError:
                return
            self.open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        assert self.listener is not None
        with contextlib.suppress(OSError):  # wakes the accept (a close alone leaves it listening on Linux)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.open = []
