"""`cgsvc-cli version`: this client's release and, from a real server, its release, replica,
store, dispatchers and log key, and who it takes the caller for (GetServerInfo)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from cgsvc import __version__
from cgsvc.server.app import SERVICES
from cgsvc.server.auth import hash_token
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess

RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)


def version_json(*args: str) -> dict[str, Any]:
    proc = cli("version", *args, "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout)["version"])


def test_every_program_says_its_release() -> None:
    assert __version__ == RELEASE  # one release: the package's and the distribution's
    for module, prog in (("cgsvc_client.cli", "cgsvc-cli"), ("cgsvc.server.main", "cgsvc"),
                         ("cgsvc_worker.cli", "cgsvc-worker")):
        proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert proc.returncode == 0 and proc.stdout.strip() == f"{prog} {RELEASE}", (prog, proc.stdout, proc.stderr)
    offline = version_json("--server", "")
    assert offline["client"]["version"] == RELEASE and offline["server"] is None


def test_a_local_server_names_itself_and_takes_its_caller_for_local_admin(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as srv:
        info = version_json("--server", srv.address)
        server = info["server"]
        assert server["version"] == RELEASE and server["address"] == srv.address
        assert server["replica"] == (srv.data_dir / "instance").read_text().strip()
        assert server["store"] == "sqlite" and server["dispatchers"] == ["local"]
        assert server["event_loop"] in ("uvloop", "asyncio") and server["start_time"].endswith("Z")
        checkpoint = json.loads(cli("audit", "checkpoint", "--server", srv.address, "-o", "json").stdout)
        assert server["log_key_id"] == checkpoint["checkpoint"]["key_id"]
        caller = server["caller"]
        assert (caller["principal"], caller["roles"], caller["credential"]) == ("local", ["admin"], "none")
        every_rpc = [f"{name.removeprefix('cgsvc.v1.')}/{m.name}" for name, svc in SERVICES.items() for m in svc.methods]
        assert caller["may_call"] == every_rpc  # admin
        assert info["warnings"] == []
        table = cli("version", "--server", srv.address, "-o", "table").stdout
        assert f"cgsvc {RELEASE} at {srv.address}" in table and "you are" in table and "local" in table


def test_a_token_names_its_principal_roles_expiry_and_what_it_may_call(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[tokens]]\nprincipal = "ci-bot"\nroles = ["resolver"]\nsha256 = "{hash_token("t-ci")}"\n'
                      "expires = 2099-01-31T00:00:00Z\n")
    with ServerProcess(tmp_path / "srv", "--token-file", str(tokens)) as srv:
        caller = version_json("--server", srv.address, "--token", "t-ci")["server"]["caller"]
        assert (caller["principal"], caller["roles"], caller["credential"]) == ("ci-bot", ["resolver"], "bearer token")
        assert caller["token_expires"].startswith("2099-01-31T00:00:00")
        assert {"PlanService/ResolvePlan", "PlanService/ListModels", "DiagnosticsService/GetServerInfo"} <= set(
            caller["may_call"])
        assert not {"LaunchService/CreateLaunch", "AuditService/VerifyAuditLog"} & set(caller["may_call"])
        nobody = cli("version", "--server", srv.address, "-o", "json")
        assert nobody.returncode == 1 and json.loads(nobody.stdout)["error"]["code"] == "UNAUTHENTICATED"


def test_a_token_from_token_new_is_admitted_on_the_next_reload(tmp_path: Path) -> None:
    """The operator's path end to end: `cgsvc token new --append`, SIGHUP, and the new principal
    calls, as `cgsvc-cli version` shows."""
    def new_token(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "new", *args, "--append",
                               str(tokens), "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return str(json.loads(proc.stdout)["token"]["token"])

    tokens = tmp_path / "tokens.toml"
    first = new_token("--principal", "ci-bot", "--role", "resolver")
    with ServerProcess(tmp_path / "srv", "--token-file", str(tokens)) as srv:
        assert version_json("--server", srv.address, "--token", first)["server"]["caller"]["principal"] == "ci-bot"
        second = new_token("--principal", "night-ops", "--role", "auditor", "--expires-in-days", "30")
        assert cli("version", "--server", srv.address, "--token", second, "-o", "json").returncode == 1  # not yet
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (proc := cli("version", "--server", srv.address, "--token", second, "-o", "json")).returncode != 0:
            assert time.monotonic() < deadline, proc.stdout
            time.sleep(0.2)
        caller = json.loads(proc.stdout)["version"]["server"]["caller"]
        assert (caller["principal"], caller["roles"]) == ("night-ops", ["auditor"]) and caller["token_expires"]
        assert version_json("--server", srv.address, "--token", first)["server"]["caller"]["principal"] == "ci-bot"
        # the first token leaks: revoked from the file, refused after the next reload
        revoked = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "revoke", "--file", str(tokens),
                                  "--token", "-"], input=first, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert revoked.returncode == 0 and "revoked a token of principal 'ci-bot'" in revoked.stdout, revoked.stderr
        assert f"{tokens}: 1 token left;" in revoked.stdout, revoked.stdout  # not "1 tokens left"
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (proc := cli("version", "--server", srv.address, "--token", first, "-o", "json")).returncode == 0:
            assert time.monotonic() < deadline, proc.stdout
            time.sleep(0.2)
        assert json.loads(proc.stdout)["error"]["code"] == "UNAUTHENTICATED"
        assert version_json("--server", srv.address, "--token", second)["server"]["caller"]["principal"] == "night-ops"


def test_a_server_older_than_get_server_info_is_said_so(tmp_path: Path) -> None:
    """A server that does not know GetServerInfo (an older release; here a gRPC server with no
    cgsvc services) answers UNIMPLEMENTED: `version` still prints the client's release, and says
    why the server's is unknown, exit 0."""
    import concurrent.futures

    import grpc

    old = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    port = old.add_insecure_port("127.0.0.1:0")
    old.start()
    try:
        info = version_json("--server", f"127.0.0.1:{port}")
        assert info["client"]["version"] == RELEASE
        assert info["server"] == {"address": f"127.0.0.1:{port}", "version": ""}
        assert len(info["warnings"]) == 1 and "older than GetServerInfo" in info["warnings"][0]
        table = cli("version", "--server", f"127.0.0.1:{port}", "-o", "table")
        assert table.returncode == 0 and "release unknown" in table.stdout and "WARNING" in table.stderr
    finally:
        old.stop(0)
