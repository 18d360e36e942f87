"""`cgsvc-cli audit witness`: a directory of checkpoints kept away from the server, each accepted
only when the log extends the last one kept. Tried as an attacker would: the log truncated or
forked between two checks, a checkpoint from another key; and with bad input."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cgsvc.audit import checkpoint, merkle
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess
from tests.e2e.test_trust import attack, cli, resolve_n


def witness(srv: ServerProcess | str, directory: Path | str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run the witness with -o json: its exit code and one result a check (JSON lines)."""
    address = srv if isinstance(srv, str) else srv.address
    proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "witness", "--dir", str(directory),
                           *args, "--server", address, "-o", "json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    if proc.returncode == 2:  # refused as bad input: {"error": ...}, as every command answers, on one line
        assert len(proc.stdout.splitlines()) == 1, proc.stdout
        return 2, [json.loads(proc.stdout)]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert all("witness" in x for x in lines), proc.stdout + proc.stderr
    return proc.returncode, [x["witness"] for x in lines]


def evidence_check(path: Path | str, *args: str) -> tuple[int, dict[str, Any]]:
    """`audit evidence FILE -o json`, offline: its exit code and its answer."""
    proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "evidence", str(path), *args, "-o", "json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    body = json.loads(proc.stdout)
    return proc.returncode, body.get("evidence") or body


def history(directory: Path) -> list[int]:
    return [json.loads(line)["checkpoint"]["tree_size"] for line in (directory / "history.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("how", ["truncated", "forked"])
def test_a_witness_keeps_growing_checkpoints_and_refuses_a_log_cut_back_or_forked(tmp_path: Path, how: str) -> None:
    kept = tmp_path / "witness"
    srv = ServerProcess(tmp_path / "srv").start()
    try:
        resolve_n(srv, 4)
        rc, [first] = witness(srv, kept)
        assert rc == 0 and first["ok"] and first["first"] and first["tree_size"] == 4, first
        assert first["trust"] == "trusted on first use"
        resolve_n(srv, 3)
        rc, [grown] = witness(srv, kept)
        assert rc == 0 and grown["ok"] and not grown["first"], grown
        assert (grown["previous_size"], grown["tree_size"], grown["grew_by"]) == (4, 7, 3)
        assert grown["proof_hashes"] > 0
        rc, [same] = witness(srv, kept)  # nothing new: checked, kept fresher, no history line
        assert rc == 0 and same["grew_by"] == 0 and history(kept) == [4, 7], same
        # latest.json is a checkpoint file the other commands take as it is
        ok = cli(srv, "audit", "verify", "--checkpoint", str(kept / "latest.json"))
        assert ok.returncode == 0 and json.loads(ok.stdout)["verification"]["ok"], ok.stdout
        latest = (kept / "latest.json").read_text()

        srv.stop()
        attack(srv.data_dir / "cgsvc.db", keep=5)  # repaired to be self-consistent, as in test_trust
        srv.start()
        if how == "forked":
            resolve_n(srv, 4)  # another history from record 5 on, longer than the kept tree
        assert cli(srv, "audit", "verify").returncode == 0, "only a checkpoint kept elsewhere can tell"
        rc, [refused] = witness(srv, kept)
        assert rc == 3 and not refused["ok"], refused
        expected = "shorter than the checkpoint" if how == "truncated" else "inconsistent history"
        assert expected in refused["reason"], refused
        # the evidence: two checkpoints signed by the one key that no append-only log can both have made
        evidence = json.loads(Path(refused["evidence"]).read_text())
        old, new = (checkpoint.Checkpoint.from_dict(evidence[k]) for k in ("kept", "presented"))
        for cp in (old, new):
            checkpoint.verify(cp, expected_key_id=first["key_id"])  # both genuine
        if how == "truncated":
            assert (old.tree_size, new.tree_size) == (7, 5)
        else:
            assert (old.tree_size, new.tree_size) == (7, 9)
            assert not merkle.verify_consistency(old.tree_size, new.tree_size, bytes.fromhex(old.root_hash),
                                                 bytes.fromhex(new.root_hash),
                                                 [bytes.fromhex(h) for h in evidence["consistency_proof"]])
        # what the file alone proves, to anyone: a smaller tree signed later is proof; a proof that
        # does not hold is not (a faulty answer looks the same), so the fork is "ask again"
        rc, judged = evidence_check(refused["evidence"], "--key-id", first["key_id"])
        if how == "truncated":
            assert rc == 0 and judged["proven"] and judged["misbehaviour"] == "truncated", judged
        else:
            assert rc == 3 and not judged["proven"] and "ask it again" in judged["reason"], judged
        # refused once, refused again: the kept checkpoint is not replaced by the history it refused
        assert (kept / "latest.json").read_text() == latest
        rc, [again] = witness(srv, kept)
        assert rc == 3 and expected in again["reason"] and again["evidence"] != refused["evidence"]
        assert history(kept) == [4, 7]
    finally:
        srv.stop()


def test_a_witness_loop_reports_each_check_and_rides_out_a_server_that_is_down(tmp_path: Path) -> None:
    kept = tmp_path / "witness"
    with ServerProcess(tmp_path / "srv") as srv:
        resolve_n(srv, 2)
        rc, checks = witness(srv, kept, "--every", "0.2", "--count", "3")
        assert rc == 0 and [c["ok"] for c in checks] == [True, True, True], checks
        assert [c["first"] for c in checks] == [True, False, False]
        address = srv.address
    # the server is gone: each check says so and the witness goes on; the last one decides the exit code
    rc, checks = witness(address, kept, "--every", "0.1", "--count", "2", "--timeout", "1")
    assert rc == 1 and [c["reachable"] for c in checks] == [False, False], checks
    assert "UNAVAILABLE" in checks[0]["reason"] or "DEADLINE_EXCEEDED" in checks[0]["reason"], checks
    assert history(kept) == [2], "a check that could not ask the server keeps nothing"


def test_a_pinned_key_and_bad_input(tmp_path: Path) -> None:
    kept = tmp_path / "witness"
    with ServerProcess(tmp_path / "srv") as srv, ServerProcess(tmp_path / "other") as other:
        resolve_n(srv, 2)
        key = json.loads(cli(srv, "audit", "checkpoint").stdout)["checkpoint"]["key_id"]
        rc, [first] = witness(srv, kept, "--key-id", key.upper())  # hex in either case
        assert rc == 0 and first["trust"] == "pinned by --key-id", first
        # another server, another key: refused against the kept checkpoint, and against a pin on first use
        rc, [foreign] = witness(other, kept)
        assert rc == 3 and f"expected {key[:16]}" in foreign["reason"], foreign
        rc, [pinned] = witness(other, tmp_path / "fresh", "--key-id", key)
        assert rc == 3 and f"expected {key[:16]}" in pinned["reason"], pinned
        assert not (tmp_path / "fresh" / "latest.json").exists()
        # bad input: named, exit 2, nothing kept or changed
        before = (kept / "latest.json").read_text()
        (tmp_path / "afile").write_text("x")
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "latest.json").write_text('{"tree_size": -1}')
        for args, field in (((kept, "--key-id", "abc"), "key_id"),
                            ((kept, "--every", "0"), "every"),
                            ((kept, "--count", "2"), "count"),
                            ((tmp_path / "afile",), "dir"),
                            ((tmp_path / "junk",), "dir")):
            rc, [error] = witness(srv, *map(str, args))
            assert rc == 2 and error["error"]["field_violations"][0]["field"] == field, error
        with open(kept / ".lock", "a") as held:  # another witness on the same directory
            fcntl.flock(held, fcntl.LOCK_EX)
            rc, [error] = witness(srv, kept)
            assert rc == 2 and "another witness is using" in error["error"]["field_violations"][0]["description"]
        assert (kept / "latest.json").read_text() == before


def test_a_checkpoint_dated_before_the_kept_one_is_accepted_with_a_warning(tmp_path: Path) -> None:
    """The proof decides, not the clock: a server whose clock stepped back is still an honest log."""
    kept = tmp_path / "witness"
    with ServerProcess(tmp_path / "srv") as srv:
        resolve_n(srv, 2)
        assert witness(srv, kept)[0] == 0
        latest = checkpoint.Checkpoint.from_dict(json.loads((kept / "latest.json").read_text()))
        # as if the server had signed it with its clock far ahead
        ahead = checkpoint.sign(checkpoint.load_or_create_key(srv.data_dir / "signing_key.pem"), latest.tree_size,
                                bytes.fromhex(latest.root_hash), "2999-01-01T00:00:00.000000Z")
        (kept / "latest.json").write_text(json.dumps({"checkpoint": ahead.to_dict()}))
        resolve_n(srv, 1)
        rc, [check] = witness(srv, kept)
        assert rc == 0 and check["ok"] and check["grew_by"] == 1, check
        assert check["warnings"] == [f"the server's checkpoint is dated {check['checkpoint_time']}, before the kept "
                                     "one's 2999-01-01T00:00:00.000000Z"], check


def test_evidence_of_two_trees_of_one_size_is_a_proven_fork_and_bad_files_are_named(tmp_path: Path) -> None:
    key = checkpoint.load_or_create_key(tmp_path / "log.pem")
    a = checkpoint.sign(key, 5, bytes(32), "2026-12-05T10:00:00.000000Z")
    b = checkpoint.sign(key, 5, bytes([1] * 32), "2026-12-05T10:01:00.000000Z")
    older = checkpoint.sign(key, 3, bytes([2] * 32), "2026-12-05T09:00:00.000000Z")

    def judged(kept: checkpoint.Checkpoint, presented: checkpoint.Checkpoint, *args: str) -> tuple[int, dict[str, Any]]:
        path = tmp_path / "evidence.json"
        path.write_text(json.dumps({"reason": "x", "kept": kept.to_dict(), "presented": presented.to_dict(),
                                    "consistency_proof": []}))
        return evidence_check(path, *args)

    rc, fork = judged(a, b)
    assert rc == 0 and fork["proven"] and fork["misbehaviour"] == "forked", fork
    rc, same = judged(a, a)
    assert rc == 3 and not same["proven"] and "the same tree" in same["reason"], same
    rc, stale = judged(a, older)  # smaller, but dated earlier: an old checkpoint, not a truncation
    assert rc == 3 and "no later than" in stale["reason"], stale
    other = checkpoint.sign(checkpoint.load_or_create_key(tmp_path / "other.pem"), 5, bytes(32), a.time)
    rc, foreign = judged(a, b, "--key-id", other.key_id)
    assert rc == 3 and f"expected {other.key_id[:16]}" in foreign["reason"], foreign
    rc, keys = judged(a, other)
    assert rc == 3 and "different keys" in keys["reason"], keys
    # bad input: named, exit 2
    (tmp_path / "junk.json").write_text("not json")
    (tmp_path / "half.json").write_text(json.dumps({"kept": a.to_dict(), "presented": {"tree_size": "x"}}))
    for name, field in (("junk.json", "file"), ("half.json", "evidence.presented"), ("absent.json", "file")):
        rc, error = evidence_check(tmp_path / name)
        assert rc == 2 and error["error"]["field_violations"][0]["field"] == field, error
