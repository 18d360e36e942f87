"""Trust, tried as an attacker would: who may serve beyond loopback, a truncated, rewritten or
forked log against a signed checkpoint, inclusion proofs, reflection v1, and closed sets in
their one spelling."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from cgsvc_client.client import Client
from grpc_reflection.v1alpha import reflection_pb2

from cgsvc.audit import merkle
from cgsvc.audit.records import AuditRecord
from cgsvc.errors import ServiceError
from tests.conftest import ROOT
from tests.e2e.certs import ThrowawayPKI
from tests.e2e.server import ServerProcess, serve_refused
from tests.e2e.test_security import KIMI, TOKENS, token_file


def test_the_authentication_matrix(tmp_path: Path) -> None:
    pki = ThrowawayPKI(tmp_path)
    cert, key = pki.issue("server", "localhost", server=True)
    tokens = token_file(tmp_path / "tokens.toml")
    remote = ("--address", "0.0.0.0:0")
    tls = ("--tls-cert", cert, "--tls-key", key)
    # Refused: nobody would be authenticated beyond loopback, TLS or not.
    assert "would authenticate nobody" in serve_refused(tmp_path / "x", *remote)
    refused = serve_refused(tmp_path / "x", *remote, *tls)
    assert "would authenticate nobody" in refused and "TLS alone encrypts" in refused
    # Refused: bearer tokens in plaintext, even with the escape flag.
    assert "bearer tokens beyond loopback need TLS" in serve_refused(tmp_path / "x", *remote, "--token-file", tokens)
    assert "does not lift this" in serve_refused(tmp_path / "x", *remote, "--token-file", tokens, "--allow-insecure-remote")
    # Served: tokens over TLS, client certificates, and the explicit escape (warned, anonymous).
    # (Beyond loopback, unconfined checkpoint paths are warned of until --model-roots is set.)
    for name, args in (("tokens", (*tls, "--token-file", tokens)),
                       ("mtls", (*tls, "--tls-client-ca", pki.ca_path, "--model-roots", str(tmp_path)))):
        with ServerProcess(tmp_path / name, *remote, *args) as srv:
            warnings = [line for line in srv.output if "WARNING" in line]
            expected = [] if name == "mtls" else ["WARNING: checkpoint paths unconfined"]
            assert [w[:36] for w in warnings] == expected, warnings
    with ServerProcess(tmp_path / "escape", *remote, "--allow-insecure-remote") as srv, Client(srv.address) as c:
        assert any("--allow-insecure-remote" in line and "'anonymous'" in line for line in srv.output)
        plan = c.resolve_proto(KIMI)
        assert c.get_audit_record(plan.audit_record).principal == "anonymous"
    with ServerProcess(tmp_path / "local") as srv, Client(srv.address) as c:  # loopback: served, warned, "local"
        assert any("insecure local mode" in line for line in srv.output)
        assert c.get_audit_record(c.resolve_proto(KIMI).audit_record).principal == "local"
    with ServerProcess(tmp_path / "local-tokens", "--token-file", tokens) as srv, \
            Client(srv.address, token=TOKENS["resolver"]) as c:  # tokens on loopback need no TLS
        assert c.resolve_proto(KIMI).name


def cli(srv: ServerProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args, "--server", srv.address, "-o", "json"],
                          input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT)


def resolve_n(srv: ServerProcess, n: int) -> None:
    with Client(srv.address) as c:
        for i in range(n):
            c.resolve({**KIMI, "features": {"max_running_requests": 10 + i}})


def checkpoint_file(srv: ServerProcess, path: Path) -> dict[str, Any]:
    proc = cli(srv, "audit", "checkpoint")
    assert proc.returncode == 0, proc.stderr
    path.write_text(proc.stdout)
    return dict(json.loads(proc.stdout)["checkpoint"])


def attack(db: Path, keep: int = 0, rewrite: int = 0) -> None:
    """What anyone with write access to the database can do: cut the log back to `keep` records,
    or rewrite record `rewrite` — then repair the chain, the head and the Merkle tree so that
    the log is self-consistent and `audit verify` without a checkpoint passes."""
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute("PRAGMA table_info(audit_records)")]
    if keep:
        for table in ("audit_records", "idempotency_keys"):
            con.execute(f"DELETE FROM {table} WHERE sequence > ?", (keep,))
    if rewrite:
        con.execute("UPDATE audit_records SET outcome_message = 'nothing to see here' WHERE sequence = ?", (rewrite,))
    prev, leaves = "0" * 64, []
    bodies = {"@" + h: j for h, j in con.execute("SELECT body_hash, plan_json FROM plan_bodies")}
    for row in con.execute("SELECT * FROM audit_records ORDER BY sequence").fetchall():
        d = dict(zip(cols, row, strict=True))
        d["plan_json"] = bodies.get(d["plan_json"], d["plan_json"])  # a plan stored once, by reference
        rec = AuditRecord(**{**{k: d[k] for k in d if k in AuditRecord.__dataclass_fields__},
                             "rule_ids": tuple(json.loads(d["rule_ids"]) if d["rule_ids"].startswith("[")
                                               else [x for x in d["rule_ids"].split(",") if x]),
                             "prev_hash": prev, "record_hash": ""})
        h = rec.compute_hash()
        con.execute("UPDATE audit_records SET prev_hash = ?, record_hash = ? WHERE sequence = ?", (prev, h, d["sequence"]))
        prev = h
        leaves.append(merkle.leaf_hash(bytes.fromhex(h)))
    frontier, made = merkle.append_leaves(0, {}, leaves)
    con.execute("DELETE FROM merkle_nodes")
    con.executemany("INSERT INTO merkle_nodes (pos, hash) VALUES (?, ?)",
                    [(merkle.node_position(lv, i), x.hex()) for lv, i, x in made])
    con.execute("UPDATE chain_head SET sequence = ?, record_hash = ?, frontier = ?",
                (len(leaves), prev, json.dumps({str(k): v.hex() for k, v in sorted(frontier.items())})))
    con.commit()
    con.close()


@pytest.mark.parametrize("how", ["truncated", "rewritten", "forked"])
def test_a_checkpoint_catches_a_truncated_rewritten_or_forked_log(tmp_path: Path, how: str) -> None:
    srv = ServerProcess(tmp_path / "srv").start()
    try:
        resolve_n(srv, 7)
        cp = checkpoint_file(srv, tmp_path / "cp.json")
        assert cp["tree_size"] == 7
        ok = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "cp.json"))
        assert ok.returncode == 0 and json.loads(ok.stdout)["verification"]["ok"], ok.stdout
        srv.stop()
        db = srv.data_dir / "cgsvc.db"
        if how == "truncated":
            attack(db, keep=5)
        elif how == "rewritten":
            attack(db, rewrite=3)
        else:  # a copy of the log (and its key) at 5 records grows another history
            attack(db, keep=5)
        srv.start()
        if how == "forked":
            resolve_n(srv, 4)
        plain = cli(srv, "audit", "verify")
        assert plain.returncode == 0, "the attacker's log is self-consistent: only the checkpoint can tell"
        bad = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "cp.json"))
        result = json.loads(bad.stdout)["verification"]
        assert bad.returncode == 3 and not result["ok"]
        expected = "shorter than the checkpoint" if how == "truncated" else "inconsistent history"
        assert expected in result["reason"], result
        # a record the checkpoint signed: removed (6) or rewritten (3) is not proven, exit 3
        n = {"truncated": 6, "rewritten": 3, "forked": 6}[how]
        proof = cli(srv, "audit", "prove", f"auditRecords/{n}", "--checkpoint", str(tmp_path / "cp.json"))
        inclusion = json.loads(proof.stdout)["inclusion"]
        assert proof.returncode == 3 and not inclusion["ok"], proof.stdout + proof.stderr
        if how == "truncated":
            assert "records were removed" in inclusion["reason"], inclusion
    finally:
        srv.stop()


def test_inclusion_proofs_and_bad_checkpoints(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as srv:
        resolve_n(srv, 6)
        cp = checkpoint_file(srv, tmp_path / "cp.json")
        resolve_n(srv, 3)  # the log grows past the checkpoint: records 1..6 are still proven in it
        for n in (1, 4, 6):
            proc = cli(srv, "audit", "prove", f"auditRecords/{n}", "--checkpoint", str(tmp_path / "cp.json"))
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert json.loads(proc.stdout)["inclusion"]["tree_size"] == cp["tree_size"]
        # in the log but not in the checkpointed tree, and in neither: a definite "no", exit 3
        for n in (8, 999):
            beyond = cli(srv, "audit", "prove", f"auditRecords/{n}", "--checkpoint", str(tmp_path / "cp.json"))
            result = json.loads(beyond.stdout)["inclusion"]
            assert beyond.returncode == 3 and not result["ok"], beyond.stdout + beyond.stderr
            assert result["reason"] == "the checkpoint's tree holds auditRecords/1..6", result
        # a checkpoint piped in (`audit checkpoint -o json | audit verify --checkpoint -`) is read alike
        piped = (tmp_path / "cp.json").read_text()
        assert cli(srv, "audit", "verify", "--checkpoint", "-", stdin=piped).returncode == 0
        assert cli(srv, "audit", "prove", "auditRecords/4", "--checkpoint", "-", stdin=piped).returncode == 0
        beyond = cli(srv, "audit", "prove", "auditRecords/8", "--checkpoint", "-", stdin=piped)
        assert beyond.returncode == 3
        not_one = cli(srv, "audit", "verify", "--checkpoint", "-", stdin="[]")
        assert not_one.returncode == 2 and "standard input is not a cgsvc checkpoint" in not_one.stdout, not_one.stdout
        bad_name = cli(srv, "audit", "prove", "auditRecords/x", "--checkpoint", str(tmp_path / "cp.json"))
        assert bad_name.returncode == 2 and "name" in bad_name.stdout, bad_name.stdout
        (tmp_path / "junk.json").write_text('{"tree_size": "seven"}')
        junk = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "junk.json"))
        assert junk.returncode == 2 and "checkpoint" in json.loads(junk.stdout)["error"]["field_violations"][0]["field"]
        forged = {**cp, "root_hash": "00" * 32}
        (tmp_path / "forged.json").write_text(json.dumps(forged))
        sig = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "forged.json"))
        assert sig.returncode == 3 and "bad signature" in json.loads(sig.stdout)["verification"]["reason"]
        with ServerProcess(tmp_path / "other") as other:  # another server: another key
            resolve_n(other, 7)
            foreign = cli(other, "audit", "verify", "--checkpoint", str(tmp_path / "cp.json"))
            reason = json.loads(foreign.stdout)["verification"]["reason"]
            assert foreign.returncode == 3 and f"expected {cp['key_id'][:16]}" in reason
        after = cli(srv, "audit", "checkpoint")  # bad checkpoints and missing records wrote nothing
        assert json.loads(after.stdout)["checkpoint"]["tree_size"] == 9, after.stdout


def test_reflection_v1_for_a_client_that_asks_only_v1(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as srv, grpc.insecure_channel(srv.address) as channel:
        call = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                     request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        answers = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services=""),
                                  reflection_pb2.ServerReflectionRequest(
                                      file_containing_symbol="cgsvc.v1.PlanService")]), timeout=10))
        names = {s.name for s in answers[0].list_services_response.service}
        assert {"cgsvc.v1.PlanService", "cgsvc.v1.AuditService", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} <= names
        assert answers[1].file_descriptor_response.file_descriptor_proto


def test_closed_sets_are_case_insensitive_and_recorded_in_one_spelling(tmp_path: Path) -> None:
    spec = {"model": {"name": "kimi-k2.6-nvfp4"}, "hardware": {"gpu": "gb300", "gpu_count": 4},
            "parallelism": {"tp": 4}, "features": {"speculative_algorithm": "ngram", "kv_cache_dtype": "FP8_E4M3"},
            "overrides": {"cuda_graph": {"decode": {"backend": "FULL"}}}}
    with ServerProcess(tmp_path / "srv") as srv, Client(srv.address) as c:
        plan = c.resolve_proto(spec)
        stored = json.loads(c.get_audit_record(plan.audit_record).spec_json)
        # a catalog model by an alias, in any case, is recorded by its id: one filter finds it
        assert stored["model"]["name"] == "nvidia/Kimi-K2.6-NVFP4"
        assert [p.name for p in c.list_plans('model = "nvidia/Kimi-K2.6-NVFP4"').plans] == [plan.name]
        assert c.get_audit_record(plan.audit_record).model == "nvidia/Kimi-K2.6-NVFP4"
        assert stored["hardware"]["gpu"] == "GB300" and stored["features"]["speculative_algorithm"] == "NGRAM"
        assert stored["features"]["kv_cache_dtype"] == "fp8_e4m3" and plan.decode.backend == "full"
        assert plan.spec.hardware.gpu == "GB300" and plan.kv_cache_dtype == "fp8_e4m3"
        with pytest.raises(Exception, match="unknown value 'nGrAm2'; valid: EAGLE"):
            c.resolve({**spec, "features": {"speculative_algorithm": "nGrAm2"}})
    shutil.rmtree(tmp_path / "srv")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_nul_character_is_refused_by_name_and_fails_no_one_else(tmp_path: Path, store: str) -> None:
    """Regression: on PostgreSQL a NUL (U+0000) in a request — a request id, a model name, a
    plan name, a filter — answered INTERNAL, went unaudited, and failed every other caller
    whose record shared its commit. Now a request's own text fields refuse it by name, a spec's
    values are refused by the resolver and recorded with the NUL written as \\u0000, and callers
    committed alongside are answered as usual."""
    import asyncio
    import uuid

    from cgsvc import codec
    from cgsvc.spec import parse_spec
    from cgsvc.v1 import plan_service_pb2, plan_service_pb2_grpc
    from tests.integration.pg import pg_url_or_skip

    args = ("--database-url", pg_url_or_skip(f"nul_{uuid.uuid4().hex[:10]}")) if store == "postgresql" else ()
    spec = codec.spec_to_proto(parse_spec(KIMI))
    bad_model = plan_service_pb2.ResolvePlanRequest(spec=spec)
    bad_model.spec.model.name = "deep\x00seek"

    async def burst(address: str) -> list[str]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = plan_service_pb2_grpc.PlanServiceStub(channel)

            async def call(request: Any) -> str:
                try:
                    await stub.ResolvePlan(request, timeout=30)
                    return "OK"
                except grpc.aio.AioRpcError as exc:
                    return f"{exc.code().name} {exc.details()}"
            requests = [plan_service_pb2.ResolvePlanRequest(spec=spec, request_id=uuid.uuid4().hex) for _ in range(24)]
            requests[5::8] = [bad_model, plan_service_pb2.ResolvePlanRequest(spec=spec, request_id="r\x00x"), bad_model]
            return list(await asyncio.gather(*(call(r) for r in requests)))

    with ServerProcess(tmp_path / "srv", *args) as srv:
        answers = asyncio.run(burst(srv.address))
        assert answers.count("OK") == 21, answers
        assert "INVALID_ARGUMENT request_id: must not contain NUL characters (U+0000)" in answers
        assert sum(a.startswith("INVALID_ARGUMENT model.name: unknown model 'deep\\x00seek'") for a in answers) == 2
        with Client(srv.address) as c:
            for call, field in ((lambda: c.get_plan("plans/a\x00b"), "name"),
                                (lambda: c.list_audit_records('model = "a\x00b"'), "filter"),
                                (lambda: c.list_plans('model = "a\x00b"'), "filter")):
                with pytest.raises(ServiceError) as err:
                    call()
                assert err.value.code == "INVALID_ARGUMENT" and field in str(err.value)
            refused = c.list_audit_records('outcome = "INVALID_ARGUMENT"', page_size=100).records
            assert sorted(r.model for r in refused if r.model.startswith("deep")) == ["deep\\u0000seek"] * 2
            assert len(refused) == 3  # the burst's three, one record each (reads are not audited methods)
            assert [r.request_id for r in refused if not r.model.startswith("deep")] == ["r\\u0000x"]
            assert c.verify_audit_log().ok


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_long_values_are_refused_or_recorded_and_the_server_keeps_answering(tmp_path: Path, store: str) -> None:
    """Regressions, found by sending what an attacker would: a 300,000-character model name held
    the event loop for minutes (a backtracking regex masking URL credentials); a refusal that
    echoed a 5,000-character value reached the client as RESOURCE_EXHAUSTED (the status outgrew
    the trailers clients accept); on PostgreSQL a long random model name failed its commit (a
    B-tree key holds about 2.7 KB) and with it everyone's in that commit; a filter of 40,000
    terms was an INTERNAL error after seconds of work; a record number past int64 was an
    INTERNAL OverflowError (past 4,300 digits a ValueError)."""
    import secrets
    import uuid

    from tests.integration.pg import pg_url_or_skip

    args = ("--database-url", pg_url_or_skip(f"long_{uuid.uuid4().hex[:10]}")) if store == "postgresql" else ()
    with ServerProcess(tmp_path / "srv", *args) as srv, Client(srv.address) as c:
        c.timeout = 60  # liveness: before the fix the first call ran for minutes
        for name in ("m" * 300_000, "m" * 5_000, secrets.token_urlsafe(20_000)):
            with pytest.raises(ServiceError) as err:
                c.resolve({**KIMI, "model": {"name": name}})
            assert err.value.code == "INVALID_ARGUMENT" and err.value.violations[0].field == "model.name"
            assert "characters)" in err.value.message and len(err.value.message) < 400
        with pytest.raises(ServiceError) as err:
            c.resolve(KIMI, request_id="r" * 129)
        assert err.value.violations[0].field == "request_id" and "at most 128" in err.value.message
        with pytest.raises(ServiceError) as err:
            c.list_audit_records(" AND ".join(['model = "a"'] * 65))
        assert err.value.violations[0].field == "filter" and "at most 64 terms" in err.value.message
        for name in ("auditRecords/99999999999999999999", "auditRecords/" + "9" * 5000,  # past int64
                     "auditRecords/\u00b2"):  # a digit to str.isdigit(), not to int()
            for call in (c.get_audit_record, c.inclusion_proof):
                with pytest.raises(ServiceError) as err:
                    call(name)
                assert err.value.code == "INVALID_ARGUMENT" and "1 to 2^63-1" in err.value.message
        assert c.resolve(KIMI).prefill_backend == "disabled"  # still answering, still appending
        refused = c.list_audit_records('outcome = "INVALID_ARGUMENT"', page_size=10).records
        assert len(refused) == 4
        longest = next(r for r in refused if len(r.spec_json) > 300_000)
        assert longest.model == "m" * 512 + "... (cut at 512 of 300000 characters)"  # the indexed column cut, saying so
        # the refusal names the value cut, saying so; the record's spec keeps it whole
        assert "(cut at 32 of 300000 characters)" in longest.outcome_message
        assert c.verify_audit_log().ok


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--audit-cohort-wait-ms", "-1", "audit_cohort_wait_ms must be 0 or more, got -1.0"),
    ("--lease-seconds", "0", "lease_seconds must be more than 0, got 0.0"),  # every replica would take every other's
    ("--unfollowed-group-seconds", "-1", "unfollowed_group_seconds must be 0 (never) or more, got -1.0"),
    ("--max-concurrent-rpcs", "0", "max_concurrent_rpcs must be at least 1, got 0"),  # was a traceback
    ("--audit-max-batch", "0", "audit_max_batch must be at least 1, got 0"),
    ("--log-level", "loud", "log_level must be one of debug, info, warning, error, got 'loud'"),
    ("--address", "127.0.0.1:99999", "address must be HOST:PORT (port 0-65535"),  # gRPC bound a random port
])
def test_a_setting_out_of_bounds_is_refused_by_name_before_anything_is_opened(tmp_path: Path, flag: str, value: str,
                                                                              said: str) -> None:
    stderr = serve_refused(tmp_path / "x", flag, value)
    assert said in stderr and "Traceback" not in stderr, stderr
    assert not (tmp_path / "x" / "cgsvc.db").exists() and not (tmp_path / "x" / "instance").exists()


def test_the_audit_log_and_launch_files_are_the_servers_own(tmp_path: Path) -> None:
    """Regression: the SQLite log (and its WAL) were made 0644 in a 0755 data directory, so any
    user of the machine could read every record without the auditor role the API asks for. The
    server makes its files 0600 and a new data directory 0700, and says so of one it finds open."""
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o755)  # as mkdir makes one under the usual umask
    with ServerProcess(tmp_path / "open") as srv:
        resolve_n(srv, 1)
        for name in ("cgsvc.db", "cgsvc.db-wal", "instance"):
            assert (srv.data_dir / name).stat().st_mode & 0o777 == 0o600, name
        assert any(line.startswith(f"WARNING: data_dir {srv.data_dir} is open to other users (mode 0755)")
                   for line in srv.output), srv.output
        assert not any("audit log" in line for line in srv.output), srv.output  # its own file: 0600
    (tmp_path / "open" / "cgsvc.db").chmod(0o644)  # as a release before this one made it
    with ServerProcess(tmp_path / "open") as srv:
        assert any(line.startswith(f"WARNING: audit log {srv.data_dir / 'cgsvc.db'} is readable beyond its owner "
                                   "(mode 0644)") for line in srv.output), srv.output
    (tmp_path / "closed").mkdir(mode=0o700)
    with ServerProcess(tmp_path / "closed") as srv:
        assert not any("data_dir" in line for line in srv.output), srv.output
    made = tmp_path / "made"  # a later --data-dir wins over the harness's: the server makes this one, 0700
    with ServerProcess(tmp_path / "harness", "--data-dir", str(made)) as srv:
        assert made.stat().st_mode & 0o777 == 0o700 and not any("data_dir" in line for line in srv.output)


def test_a_given_signing_key_signs_and_a_bad_one_is_refused_by_name(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    def pem(key: Any, encryption: Any = None) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[no-any-return]
                                 encryption or serialization.NoEncryption())

    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ours.pem").write_bytes(pem(key))
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (tmp_path / "ours.pem").chmod(0o644)
    with ServerProcess(tmp_path / "srv", "--signing-key", str(tmp_path / "ours.pem")) as srv:
        resolve_n(srv, 1)
        cp = checkpoint_file(srv, tmp_path / "cp.json")
        assert any(line.startswith(f"WARNING: signing key {tmp_path / 'ours.pem'} is readable beyond its owner "
                                   "(mode 0644)") for line in srv.output), srv.output
    with ServerProcess(tmp_path / "own") as srv:  # the generated key: 0600, no warning
        assert (srv.data_dir / "signing_key.pem").stat().st_mode & 0o777 == 0o600
        assert not any("signing key" in line for line in srv.output), srv.output
    assert cp["key_id"] == hashlib.sha256(public).hexdigest() and cp["tree_size"] == 1
    assert not (tmp_path / "srv" / "signing_key.pem").exists(), "a given key is used, none generated"
    bad = {"junk.pem": b"not a key\n",
           "ecdsa.pem": pem(ec.generate_private_key(ec.SECP256R1())),
           "locked.pem": pem(ed25519.Ed25519PrivateKey.generate(), serialization.BestAvailableEncryption(b"pw"))}
    for name, body in bad.items():
        (tmp_path / name).write_bytes(body)
        err = serve_refused(tmp_path / "x", "--signing-key", str(tmp_path / name))
        assert f"signing_key: {tmp_path / name}" in err and "unencrypted Ed25519 private key in PEM" in err, (name, err)
    assert "signing_key:" in serve_refused(tmp_path / "x", "--signing-key", str(tmp_path / "no-such-dir" / "k.pem"))


def test_tls_files_that_are_missing_or_wrong_are_refused_by_name(tmp_path: Path) -> None:
    pki = ThrowawayPKI(tmp_path)
    cert, key = pki.issue("server", "localhost", server=True)
    _, other_key = pki.issue("other", "other", server=True)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    junk = str(tmp_path / "junk.pem")
    cases = {  # what gRPC said of each: a traceback, or "Failed to bind to address"
        "tls_cert: /no/such/cert.pem: No such file or directory": ("--tls-cert", "/no/such/cert.pem", "--tls-key", key),
        "tls_cert: not a PEM certificate": ("--tls-cert", junk, "--tls-key", key),
        "tls_key: not an unencrypted PEM private key": ("--tls-cert", cert, "--tls-key", junk),
        "tls_key: not the key of tls_cert's certificate": ("--tls-cert", cert, "--tls-key", other_key),
        "tls_client_ca: not a PEM certificate": ("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", junk),
    }
    for expected, args in cases.items():
        err = serve_refused(tmp_path / "x", "--address", "127.0.0.1:0", *args)
        assert expected in err and "Traceback" not in err, (expected, err)
    assert not (tmp_path / "x" / "cgsvc.db").exists(), "refused before the database was opened"
    # the client's flags the same way, before it connects (gRPC answered UNAVAILABLE, or a traceback)
    client_cases = {
        ("tls_ca", "No such file or directory"): ("--tls-ca", "/no/such/ca.pem"),
        ("tls_ca", "not a PEM certificate"): ("--tls-ca", junk),
        ("tls_key", "needs both --tls-cert and --tls-key"): ("--tls-ca", pki.ca_path, "--tls-cert", cert),
        ("tls_key", "not the key of tls_cert's certificate"): ("--tls-cert", cert, "--tls-key", other_key),
    }
    for (field, expected), args in client_cases.items():
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "list", "--server", "127.0.0.1:1",
                               *args, "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        error = json.loads(proc.stdout)["error"]
        assert proc.returncode == 2 and error["field_violations"][0]["field"] == field, proc.stdout + proc.stderr
        assert expected in error["field_violations"][0]["description"], error


def test_an_address_in_use_or_a_data_dir_that_cannot_be_made_stops_the_start_by_name(tmp_path: Path) -> None:
    """Regression: both were a Python traceback (gRPC's "Failed to bind", after the database was
    opened and the signing key settled; os.makedirs' FileNotFoundError), exit 1."""
    with ServerProcess(tmp_path / "first") as first:
        err = serve_refused(tmp_path / "second", "--address", first.address)
        assert f"address: cannot listen on {first.address}: Address already in use" in err, err
        assert "Traceback" not in err and "add_port" not in err, err
        assert not (tmp_path / "second").exists(), "refused before the data directory was made"
    (tmp_path / "a-file").write_text("")
    err = serve_refused(tmp_path / "a-file" / "data")
    assert f"data_dir: cannot make {tmp_path / 'a-file' / 'data'}: Not a directory" in err and "Traceback" not in err
    err = serve_refused(tmp_path / "x", "--config", str(tmp_path / "none.toml"))
    assert f"config: {tmp_path / 'none.toml'}: No such file or directory" in err, err


def test_a_bad_metrics_address_stops_the_start_and_one_beyond_loopback_is_warned_of(tmp_path: Path) -> None:
    # it was a traceback after the gRPC port was bound and the audit writer started
    for address, expected in (("nonsense", "must be HOST:PORT"), ("127.0.0.1:99999", "must be HOST:PORT"),
                              ("203.0.113.99:0", "cannot listen on 203.0.113.99:0")):
        err = serve_refused(tmp_path / "x", "--address", "127.0.0.1:0", "--metrics-address", address)
        assert f"metrics_address: {expected}" in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists(), "refused before the data directory was made"
    with ServerProcess(tmp_path / "open", "--metrics-address", "0.0.0.0:0") as srv:
        assert any(line.startswith("WARNING: metrics at http://0.0.0.0:") for line in srv.output), srv.output
    with ServerProcess(tmp_path / "closed") as srv:  # the default: loopback, no warning
        assert not any("WARNING: metrics" in line for line in srv.output), srv.output
