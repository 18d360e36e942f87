"""Tokens, roles, TLS and mutual TLS against real server processes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cgsvc_client.client import Client

from cgsvc.errors import ServiceError
from cgsvc.server.auth import hash_token
from tests.conftest import ROOT, llama_dir
from tests.e2e.certs import ThrowawayPKI
from tests.e2e.server import ServerProcess

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4}, "parallelism": {"tp": 4}}
TOKENS = {"resolver": "tok-resolver-3f9a", "auditor": "tok-auditor-77c1", "admin": "tok-admin-0b2e"}


def token_file(path: Path, certificates: dict[str, list[str]] | None = None) -> str:
    lines = []
    for role, tok in TOKENS.items():
        lines += ["[[tokens]]", f'principal = "{role}-bot"', f'roles = ["{role}"]', f'sha256 = "{hash_token(tok)}"', ""]
    for cn, roles in (certificates or {}).items():
        lines += ["[[certificates]]", f'common_name = "{cn}"', f"roles = {roles!r}".replace("'", '"'), ""]
    path.write_text("\n".join(lines))
    return str(path)


def test_tokens_and_roles(tmp_path: Path) -> None:
    tf = token_file(tmp_path / "tokens.toml")
    with ServerProcess(tmp_path / "srv", "--token-file", tf) as srv:
        with Client(srv.address, token="") as anon:
            anon.token = None
            with pytest.raises(ServiceError) as e:
                anon.resolve(KIMI)
            assert e.value.code == "UNAUTHENTICATED"
        with Client(srv.address, token="wrong") as c, pytest.raises(ServiceError) as e:
            c.resolve(KIMI)
        assert e.value.code == "UNAUTHENTICATED"
        with Client(srv.address, token=TOKENS["resolver"]) as c:
            plan = c.resolve_proto(KIMI)
            assert plan.name
            with pytest.raises(ServiceError) as e:
                c.verify_audit_log()
            assert e.value.code == "PERMISSION_DENIED" and "resolver-bot" in e.value.message
            assert len(c.list_policies().policies) == 4  # anyone authenticated
            assert "moonshotai/Kimi-K2.6" in [m.name for m in c.list_models().models]
            for denied_call in (lambda: c.policy_impact("sglang-0.5.17"),  # the whole history: auditors only
                                lambda: c.create_experiment([plan.name, plan.name], "/tmp", {}, 1)):
                with pytest.raises(ServiceError) as e:
                    denied_call()
                assert e.value.code == "PERMISSION_DENIED"
        with Client(srv.address, token=TOKENS["auditor"]) as c:
            for denied_call in (lambda: c.resolve(KIMI),
                                lambda: c.cancel_experiment("experiments/x"),  # auditors read experiments only
                                lambda: c.label_launch("launches/x", {"a": "b"}),  # ... and launches, labels too
                                lambda: c.label_experiment("experiments/x", {"a": "b"})):
                with pytest.raises(ServiceError) as e:
                    denied_call()
                assert e.value.code == "PERMISSION_DENIED"
            assert c.get_plan(plan.name).plan_hash == plan.plan_hash
            assert c.list_models().models  # anyone authenticated
            assert c.policy_impact("sglang-0.5.17")["specs_examined"] == 1  # every attempt carried the one spec
            denied = c.list_audit_records("outcome = PERMISSION_DENIED").records
            assert {r.principal for r in denied} == {"resolver-bot", "auditor-bot"}
            assert any(r.method.endswith("ResolvePlan") and r.spec_json for r in denied)
            unauth = c.list_audit_records("outcome = UNAUTHENTICATED").records
            assert len(unauth) == 2 and all(r.principal == "" for r in unauth)
            accepted = c.get_audit_record(plan.audit_record)
            assert accepted.principal == "resolver-bot"
            assert c.verify_audit_log().ok
        assert "insecure local mode" not in "".join(srv.output)
    # Secrets never reach the logs or the database.
    log = (tmp_path / "srv" / "server.log").read_text()
    db = sqlite3.connect(tmp_path / "srv" / "cgsvc.db").execute("SELECT * FROM audit_records").fetchall()
    for tok in TOKENS.values():
        assert tok not in log and tok not in repr(db)


def test_insecure_mode_refuses_non_loopback_and_says_so(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "a", env={"CGSVC_TOKEN_FIL": str(tmp_path / "tokens.toml")})
    with srv:
        assert any("insecure local mode" in line for line in srv.output)
        # the token file the operator meant to give, misspelt: said at start, beside the warning it explains
        assert ("WARNING: $CGSVC_TOKEN_FIL is not a setting and is ignored; did you mean CGSVC_TOKEN_FILE?\n"
                in srv.output), srv.output
    bad = ServerProcess(tmp_path / "b")
    bad.port = 0
    import subprocess
    import sys

    from tests.conftest import ROOT
    proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "0.0.0.0:0",
                           "--data-dir", str(tmp_path / "b")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "refusing to serve" in proc.stderr


def test_tls_and_mutual_tls(tmp_path: Path) -> None:
    pki = ThrowawayPKI(tmp_path)
    cert, key = pki.issue("server", "localhost", server=True)
    with ServerProcess(tmp_path / "tls", "--tls-cert", cert, "--tls-key", key) as srv:
        with Client(srv.address, tls_ca=pki.ca_path) as c:
            assert c.resolve(KIMI).prefill_backend == "disabled"
        with Client(srv.address, timeout=3) as plain, pytest.raises(ServiceError) as e:
            plain.resolve(KIMI)
        assert e.value.code == "UNAVAILABLE"

    tf = token_file(tmp_path / "tokens.toml", certificates={"orchestrator": ["resolver"]})
    ccert, ckey = pki.issue("client", "orchestrator", server=False)
    scert, skey = pki.issue("stranger", "stranger", server=False)
    with ServerProcess(tmp_path / "mtls", "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki.ca_path,
                       "--token-file", tf) as srv:
        with Client(srv.address, tls_ca=pki.ca_path, tls_cert=ccert, tls_key=ckey) as c:
            plan = c.resolve_proto(KIMI)
            assert plan.name
        with Client(srv.address, tls_ca=pki.ca_path, timeout=3) as nocert, pytest.raises(ServiceError) as e:
            nocert.resolve(KIMI)
        assert e.value.code == "UNAVAILABLE"  # handshake refused without a client certificate
        with Client(srv.address, tls_ca=pki.ca_path, tls_cert=scert, tls_key=skey) as c, pytest.raises(ServiceError) as e:
            c.resolve(KIMI)
        assert e.value.code == "UNAUTHENTICATED"  # a valid certificate, but no roles for it
        with Client(srv.address, tls_ca=pki.ca_path, tls_cert=scert, tls_key=skey, token=TOKENS["admin"]) as c:
            assert c.get_audit_record(plan.audit_record).principal == "orchestrator"


def test_model_roots_confine_checkpoint_paths(tmp_path: Path) -> None:
    """With --model-roots, a caller's model.path / model_path must lie under a root (after
    symlinks and '..'); otherwise INVALID_ARGUMENT naming the field and the roots, without saying
    whether the path exists, and nothing is read or launched."""
    root = tmp_path / "models"
    inside = llama_dir(root / "llama")
    outside = llama_dir(tmp_path / "outside")
    (root / "escape").symlink_to(outside)
    spec = {"hardware": {"gpu": "B200"}}
    with ServerProcess(tmp_path / "srv", "--model-roots", str(root)) as srv, Client(srv.address) as c:
        assert c.resolve({**spec, "model": {"path": str(inside)}}).attention_prefill == "trtllm_mha"
        for path in (outside, root / "escape", root / ".." / "outside", Path("/etc"), tmp_path / "missing"):
            with pytest.raises(ServiceError) as e:
                c.resolve({**spec, "model": {"path": str(path)}})
            assert e.value.code == "INVALID_ARGUMENT", path
            (v,) = e.value.violations
            assert v.field == "model.path" and str(root) in v.description, v
            assert "config.json" not in v.description and "exist" not in v.description  # nothing learned
        with pytest.raises(ServiceError) as e:
            c.create_launch(str(outside), {"input_len": 4, "output_len": 2, "requests": 1}, spec=KIMI)
        assert e.value.code == "INVALID_ARGUMENT" and [v.field for v in e.value.violations] == ["model_path"]
        assert not c.list_launches().launches
        assert c.verify_audit_log().ok
    with pytest.raises(RuntimeError) as err:
        ServerProcess(tmp_path / "srv2", "--model-roots", str(tmp_path / "nowhere")).start()
    assert "model_roots" in str(err.value) and "nowhere" in str(err.value)


def _this_machines_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (a UDP connect sends nothing)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        host = str(s.getsockname()[0])
    return None if host.startswith("127.") else host


def test_the_client_sends_no_token_in_plaintext_beyond_loopback(tmp_path: Path) -> None:
    import json
    import select
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT
    host = _this_machines_address()
    if host is None:
        pytest.skip("this machine has no IPv4 address beyond loopback to listen on")
    with socket.socket() as listener:  # a plaintext listener beyond loopback: someone else's, for all we know
        listener.bind((host, 0))
        listener.listen()
        target = f"{host}:{listener.getsockname()[1]}"

        def cli(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "list", "--server", target,
                                   "--timeout", "2", "-o", "json", *extra], capture_output=True, text=True,
                                  timeout=60, cwd=ROOT, env={"PATH": "/usr/bin:/bin"})

        refused = cli("--token", TOKENS["admin"])
        error = json.loads(refused.stdout)["error"]
        assert refused.returncode == 2 and error["field_violations"][0]["field"] == "token", refused.stdout
        assert "only over TLS" in error["message"] and target in error["message"]
        assert select.select([listener], [], [], 0.5)[0] == [], "the refused client must not even connect"
        cli()  # without a token the client connects (and times out on a listener that speaks no gRPC)
        assert select.select([listener], [], [], 0.5)[0] == [listener]
    with pytest.raises(ServiceError) as err:  # the library refuses the same way
        Client(target, token=TOKENS["admin"])
    assert err.value.code == "INVALID_ARGUMENT"
    with Client("127.0.0.1:1", token=TOKENS["admin"]) as c:
        assert c.token == TOKENS["admin"]  # loopback: allowed, as the server allows it


def test_a_bad_token_file_stops_the_start_by_name_and_touches_nothing(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT
    tf = tmp_path / "tokens.toml"
    tf.write_text('[[tokens]]\nprincipal = "ci-bot"\nroles = ["resolver"]\nsha256 = "tok-resolver-3f9a"\n')
    proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                           "--data-dir", str(tmp_path / "d"), "--token-file", str(tf)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"token_file {tf}: tokens[0].sha256: the token's SHA-256 as 64 hex digits" in proc.stderr
    assert not (tmp_path / "d" / "cgsvc.db").exists(), "refused before the database was opened"


def test_token_check_lists_who_a_file_admits_or_names_the_bad_entry(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    def check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "check", str(path), *extra],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)

    good = Path(token_file(tmp_path / "good.toml", certificates={"orchestrator": ["launcher"]}))
    listed = check(good, "-o", "json")
    principals = {(p["kind"], p["principal"]): p for p in json.loads(listed.stdout)["principals"]}
    assert listed.returncode == 0 and principals[("token", "admin-bot")]["sha256"] == hash_token(TOKENS["admin"])
    assert principals[("certificate", "orchestrator")]["roles"] == ["launcher"] and len(principals) == 4
    table = check(good)
    assert table.returncode == 0 and "resolver-bot" in table.stdout and "3 tokens, 1 certificate name" in table.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('roles = ["auditor"]', 'roles = ["auditors"]'))
    refused = check(bad, "-o", "json")
    assert refused.returncode == 2 and "tokens[1].roles" in json.loads(refused.stdout)["error"]["message"]
    (violation,) = json.loads(refused.stdout)["error"]["field_violations"]
    assert violation["field"] == "token_file" and violation["description"].startswith(f"{bad}: tokens[1].roles")
    said = check(bad)  # the same refusal, said once, on stderr
    assert said.returncode == 2 and said.stdout == ""
    assert said.stderr.startswith(f"cgsvc: token_file: {bad}: tokens[1].roles"), said.stderr
    # a principal with no roles is admitted, and said to be able to call nothing
    unroled = tmp_path / "unroled.toml"
    unroled.write_text(good.read_text().replace('roles = ["auditor"]', "roles = []"))
    warned = check(unroled, "-o", "json")
    assert warned.returncode == 0 and json.loads(warned.stdout)["warnings"] == [
        "token principal 'auditor-bot' has no roles: it is authenticated but may call no cgsvc method (health and "
        "reflection need no token)"]
    assert "WARNING: token principal 'auditor-bot' has no roles" in check(unroled).stdout
    assert json.loads(listed.stdout)["warnings"] == []


def test_every_log_line_is_json_at_every_level(tmp_path: Path) -> None:
    """Regression: at --log-level debug the libraries' own loggers (asyncio's "Using selector",
    gRPC's "Loaded running loop") wrote plain text among the JSON lines, which a log shipper
    parsing one object a line drops or chokes on. Every line is now one JSON object, naming its
    logger."""
    with ServerProcess(tmp_path / "srv", "--log-level", "debug", "--event-loop", "asyncio") as srv, \
            Client(srv.address) as c:
        c.resolve_proto(KIMI)
    lines = [line for line in srv.log_path.read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # raises on the first line that is not JSON
    assert any(p.get("logger") == "asyncio" for p in parsed), lines[:5]  # a library's line, as JSON
    assert all(isinstance(p, dict) and "level" in p and "event" in p for p in parsed), lines[:5]


def test_a_tls_mismatch_says_which_side_to_fix_without_grpc_noise(tmp_path: Path) -> None:
    """Plaintext to a TLS server reads 'Socket closed', TLS to a plaintext one a handshake error:
    the CLI says which flag to change, and gRPC's own log lines stay out of the way."""
    pki = ThrowawayPKI(tmp_path)
    cert, key = pki.issue("server", "localhost", server=True)

    def verify(srv: ServerProcess, *args: str) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "verify", "--server", srv.address,
                               *args, "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        return proc.returncode, json.loads(proc.stdout)["error"]["message"], proc.stderr

    with ServerProcess(tmp_path / "tls", "--tls-cert", cert, "--tls-key", key) as srv:
        rc, message, stderr = verify(srv)
        assert rc == 1 and "serves TLS" in message and "--tls-ca" in message, message
        assert stderr == ""
    # the server's log stayed JSON, a line each: no line of gRPC's own about the failed handshake
    lines = [line for line in srv.log_path.read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines), lines[-3:]
    with ServerProcess(tmp_path / "plain") as srv:
        rc, message, stderr = verify(srv, "--tls-ca", pki.ca_path)
        assert rc == 1 and "does not speak TLS" in message and "drop --tls-ca" in message, message
        assert "ssl_transport_security" not in stderr and stderr == ""
