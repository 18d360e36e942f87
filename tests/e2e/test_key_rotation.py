"""One log, one signing key at a time: a server whose key is not the log's does not start; a
rotation the old key signs is followed by `audit witness` and `audit verify --checkpoint`; a key
declared lost is recorded unendorsed and refused by both; a replica left on the retired key
stops signing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from cgsvc_client.client import Client
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cgsvc.audit import checkpoint, keys
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess, serve_refused
from tests.e2e.test_store_copy import store_verify
from tests.e2e.test_trust import checkpoint_file, cli, resolve_n
from tests.e2e.test_witness import witness
from tests.integration.pg import pg_url_or_skip


def key_file(path: Path) -> str:
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return str(path)


def key_id_of(path: Path | str) -> str:
    return keys.own_key_id(checkpoint.load_or_create_key(path))


def rotation_records(srv: ServerProcess) -> list[Any]:
    with Client(srv.address) as c:
        return list(c.list_audit_records(filter=f'method = "{keys.METHOD}"').records)


def test_a_rotation_signed_by_the_old_key_is_followed_and_a_server_with_another_key_does_not_start(
        tmp_path: Path) -> None:
    data, kept = tmp_path / "srv", tmp_path / "witness"
    with ServerProcess(data) as srv:
        assert any("(the first key of this log)" in line for line in srv.output), srv.output
        resolve_n(srv, 3)
        assert witness(srv, kept)[0] == 0
        old = checkpoint_file(srv, tmp_path / "old.json")
        none = cli(srv, "audit", "keys")
        listed = json.loads(none.stdout)["keys"]
        assert none.returncode == 0 and listed["rotations"] == [], none.stdout
        assert listed["first_key_id"] == listed["current_key_id"] == old["key_id"]
    old_key = str(data / "signing_key.pem")
    new_key = key_file(tmp_path / "new.pem")
    new_id = key_id_of(new_key)
    assert old["key_id"] == key_id_of(old_key)

    # another key alone: refused, naming the log's key, this one, and the ways on; nothing written
    err = serve_refused(data, "--signing-key", new_key)
    assert f"this log's checkpoints are signed by key {old['key_id']}" in err and new_id in err, err
    assert "--previous-signing-key" in err and "--replace-lost-signing-key" in err, err
    # a "previous" key that is not the log's: refused by name
    other = key_file(tmp_path / "other.pem")
    err = serve_refused(data, "--signing-key", new_key, "--previous-signing-key", other)
    assert f"previous_signing_key: its key {key_id_of(other)} is not this log's key {old['key_id']}" in err, err

    rotate = ("--signing-key", new_key, "--previous-signing-key", old_key)
    with ServerProcess(data, *rotate) as srv:
        assert any(f"key {new_id} (rotated at auditRecords/4)" in line for line in srv.output), srv.output
        [record] = rotation_records(srv)
        assert record.sequence == 4 and record.principal == "cgsvc" and "endorsed by it" in record.outcome_message
        rot = keys.Rotation.from_record(record.sequence, record.spec_json)
        keys.check(rot)  # the old key's signature over the tree it handed over
        assert rot.endorsement is not None and rot.endorsement["tree_size"] == 3
        resolve_n(srv, 2)
        rc, [seen] = witness(srv, kept)
        assert rc == 0 and seen["ok"] and seen["key_id"] == new_id, seen
        assert seen["key_rotations"] == [{"record": "auditRecords/4", "from_key_id": old["key_id"],
                                          "to_key_id": new_id, "endorsed_tree_size": 3}]
        assert (seen["previous_size"], seen["tree_size"]) == (3, 6)
        done = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "old.json"))
        verification = json.loads(done.stdout)["verification"]
        assert done.returncode == 0 and verification["ok"], done.stdout
        assert [r["record"] for r in verification["key_rotations"]] == ["auditRecords/4"]
        shown = cli(srv, "audit", "keys")
        listed = json.loads(shown.stdout)["keys"]
        assert shown.returncode == 0 and listed["ok"], shown.stdout
        assert (listed["first_key_id"], listed["current_key_id"]) == (old["key_id"], new_id)
        assert [(r["record"], r["reason"], r["endorsed"]) for r in listed["rotations"]] == [
            ("auditRecords/4", "rotated", True)]
        table = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "keys", "-o", "table",
                                "--server", srv.address],
                               capture_output=True, text=True, timeout=60, cwd=ROOT).stdout
        assert "auditRecords/4" in table and f"signs today {new_id}" in table, table
        # the directory was pinned to the old key: it followed the rotation, so the pin still holds
        assert witness(srv, kept, "--key-id", old["key_id"])[0] == 0
        rc, [error] = witness(srv, kept, "--key-id", key_id_of(other))
        assert rc == 2 and error["error"]["field_violations"][0]["field"] == "key_id", error

    # the same flags again (a manifest not yet edited) change nothing; the new key alone serves
    for args in (rotate, ("--signing-key", new_key)):
        with ServerProcess(data, *args) as srv:
            assert any(f"key {new_id} (the log's key since auditRecords/4)" in line for line in srv.output)
            assert len(rotation_records(srv)) == 1
    err = serve_refused(data)  # the retired key (data_dir's) no longer signs this log
    assert f"signed by key {new_id}" in err and f"this server's key is {old['key_id']}" in err, err
    # with no server, the log where it lies follows the same rotation from the old checkpoint
    proc = store_verify(data, "--checkpoint", str(tmp_path / "old.json"), "-o", "json")
    verification = json.loads(proc.stdout)["verification"]
    assert proc.returncode == 0 and verification["ok"] and verification["key_known"], proc.stdout
    assert (verification["key_id"], verification["current_key_id"]) == (old["key_id"], new_id), verification
    assert verification["key_rotations"] == [{"record": "auditRecords/4", "from_key_id": old["key_id"],
                                              "to_key_id": new_id, "endorsed_tree_size": 3}], verification
    table = store_verify(data, "--checkpoint", str(tmp_path / "old.json")).stdout
    assert f"key rotated to {new_id[:16]} at auditRecords/4, signed by {old['key_id'][:16]}" in table, table


def test_a_key_declared_lost_is_recorded_unendorsed_and_every_checkpoint_holder_refuses_it(tmp_path: Path) -> None:
    data, kept = tmp_path / "srv", tmp_path / "witness"
    with ServerProcess(data) as srv:
        resolve_n(srv, 2)
        assert witness(srv, kept)[0] == 0
        old = checkpoint_file(srv, tmp_path / "old.json")
    (data / "signing_key.pem").unlink()  # lost: the next start would generate a new one
    assert f"signed by key {old['key_id']}" in serve_refused(data)
    assert "give it or previous_signing_key, not both" in serve_refused(
        data, "--replace-lost-signing-key", "--previous-signing-key", key_file(tmp_path / "k.pem"))
    assert "previous_signing_key: " in serve_refused(data, "--previous-signing-key", str(tmp_path / "no-such.pem"))
    with ServerProcess(data, "--replace-lost-signing-key") as srv:
        new_id = key_id_of(data / "signing_key.pem")
        assert any(line.startswith(f"WARNING: --replace-lost-signing-key: key {new_id} now signs this log")
                   for line in srv.output), srv.output
        [record] = rotation_records(srv)
        assert "WITHOUT its endorsement" in record.outcome_message
        rc, [refusal] = witness(srv, kept)
        assert rc == 3 and "without its signature" in refusal["reason"], refusal
        assert json.loads(Path(refusal["evidence"]).read_text())["presented"]["key_id"] == new_id
        done = cli(srv, "audit", "verify", "--checkpoint", str(tmp_path / "old.json"))
        assert done.returncode == 3 and "without its signature" in json.loads(done.stdout)["verification"]["reason"]
        shown = cli(srv, "audit", "keys")
        listed = json.loads(shown.stdout)["keys"]
        assert shown.returncode == 3 and not listed["ok"] and "without its signature" in listed["reason"], shown.stdout
        assert [(r["reason"], r["endorsed"]) for r in listed["rotations"]] == [("replaced", False)]
        # whoever accepts the new key says so: a new directory pinned to it
        rc, [fresh] = witness(srv, tmp_path / "repinned", "--key-id", new_id)
        assert rc == 0 and fresh["trust"] == "pinned by --key-id"
    proc = store_verify(data, "--checkpoint", str(tmp_path / "old.json"), "-o", "json")  # nor a backup of it
    verification = json.loads(proc.stdout)["verification"]
    assert proc.returncode == 3 and not verification["ok"] and "without its signature" in verification["reason"], \
        proc.stdout


def test_replicas_share_the_log_key_and_one_left_on_a_retired_key_stops_signing(tmp_path: Path) -> None:
    url = pg_url_or_skip(f"keys_{uuid.uuid4().hex[:10]}")
    shared = str(tmp_path / "log-key.pem")
    a = ServerProcess(tmp_path / "a", "--database-url", url, "--signing-key", shared).start()
    try:
        # a replica with a key of its own (its data_dir's, generated) is refused: one log, one key
        assert "this log's checkpoints are signed by key" in serve_refused(tmp_path / "b", "--database-url", url)
        new_key = key_file(tmp_path / "new.pem")
        with ServerProcess(tmp_path / "b", "--database-url", url, "--signing-key", new_key,
                           "--previous-signing-key", shared) as b:
            assert len(rotation_records(b)) == 1
            with Client(a.address) as c:  # a still holds the retired key: it answers, and no longer signs
                assert c.verify_audit_log().ok
                try:
                    c.get_checkpoint()
                    raise AssertionError("a replica on a retired key signed a checkpoint")
                except Exception as exc:  # noqa: BLE001 - the client's ServiceError
                    assert getattr(exc, "code", "") == "FAILED_PRECONDITION", exc
                    assert f"replaced it at auditRecords/{rotation_records(b)[0].sequence}" in str(exc), exc
            # a witness that reaches it gets no checkpoint: said, not a verdict, and tried again
            rc, [check] = witness(a, tmp_path / "w", "--every", "0.1", "--count", "1")
            assert rc == 1 and check["checked"] is False and check["reachable"] is True, check
            assert check["reason"].startswith("FAILED_PRECONDITION: this server's signing key"), check
            assert not (tmp_path / "w" / "latest.json").exists()
            with Client(b.address) as c:
                assert c.get_checkpoint().key_id == key_id_of(new_key)
    finally:
        a.stop()
