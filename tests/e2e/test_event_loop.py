"""The server's event loop (`--event-loop`): uvloop where installed (every other end-to-end test
runs on it, the default `auto`), asyncio's own loop on request or where uvloop is absent, and a
clear refusal of anything else."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from cgsvc_client.client import Client

from cgsvc.server.main import event_loop
from tests.e2e.server import ServerProcess, serve_refused
from tests.e2e.test_security import KIMI


@pytest.mark.parametrize(("choice", "writer", "named"), [
    ("auto", "process", "event loop: uvloop"), ("asyncio", "process", "event loop: asyncio"),
    ("uvloop", "process", "event loop: uvloop"),
    ("uvloop", "thread", "event loop: uvloop"),  # the writer thread settles answers across threads
])
def test_each_loop_serves_audits_and_stops_gracefully(tmp_path: Path, choice: str, writer: str, named: str) -> None:
    pytest.importorskip("uvloop", reason="uvloop is a dependency on this platform; `make setup` installs it")
    srv = ServerProcess(tmp_path / choice, "--event-loop", choice, "--audit-writer", writer).start()
    try:
        assert any(line.startswith(named) for line in srv.output), srv.output
        running = named.split(": ")[1]  # what the running loop is, as Prometheus is told
        assert re.search(rf'^cgsvc_server_info{{[^}}]*event_loop="{running}"[^}}]*}} 1.0$', srv.metrics_text(), re.M)
        with Client(srv.address) as c:
            plans = [c.resolve_proto(KIMI, request_id=f"loop-{choice}-{k}") for k in range(3)]
            records = [c.get_audit_record(p.audit_record) for p in plans]
            assert [r.request_id for r in records] == [f"loop-{choice}-{k}" for k in range(3)]
            assert all(r.method.endswith("ResolvePlan") and r.plan_hash for r in records)
            assert c.verify_audit_log().ok
    finally:
        assert srv.stop() == 0  # SIGTERM: the loop's signal handler drains and exits 0


@pytest.mark.parametrize("where", ["flag", "env"])
def test_an_unknown_loop_is_refused_naming_the_choices(tmp_path: Path, where: str) -> None:
    args = ["--event-loop", "tokio"] if where == "flag" else []
    env = {"CGSVC_EVENT_LOOP": "tokio"} if where == "env" else {}
    stderr = serve_refused(tmp_path / "x", *args, env=env)
    assert "event_loop must be one of auto, uvloop, asyncio, got 'tokio'" in stderr
    assert not (tmp_path / "x").exists()  # refused before anything was opened


def test_without_uvloop_auto_takes_asyncio_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a machine without it: the import fails
    run, line = event_loop("auto")
    assert run is asyncio.run and line == "event loop: asyncio (uvloop is not installed; --event-loop auto)"
    with pytest.raises(ValueError, match="uvloop is not installed .*choose auto or asyncio"):
        event_loop("uvloop")
