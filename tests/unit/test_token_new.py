"""`cgsvc token new`: a fresh bearer token for a principal, its token-file entry, and (with
--append) the entry added to a token file that is checked as `serve` would check it, or left
untouched."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from cgsvc.server.auth import hash_token, load_token_file
from tests.conftest import ROOT


def token(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "new", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_a_new_token_is_random_prefixed_and_printed_alone_with_its_entry_on_stderr() -> None:
    one, two = token("--principal", "ci-bot", "--role", "resolver"), token("--principal", "ci-bot", "--role", "resolver")
    assert one.returncode == two.returncode == 0, one.stderr
    secret = one.stdout.strip()
    assert one.stdout == secret + "\n" and secret.startswith("cgsvc_") and len(secret) >= 40
    assert secret != two.stdout.strip()
    assert f'sha256 = "{hash_token(secret)}"' in one.stderr and secret not in one.stderr  # the file holds the hash
    assert 'principal = "ci-bot"' in one.stderr and 'roles = ["resolver"]' in one.stderr


def test_append_adds_an_entry_serve_admits_to_a_private_file(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    first = as_json(token("--principal", "ci-bot", "--role", "resolver", "--role", "auditor", "--append", str(tf),
                          "-o", "json"))["token"]
    assert stat.S_IMODE(tf.stat().st_mode) == 0o600  # made here: readable by its owner only
    second = as_json(token("--principal", 'ops "night"', "--role", "admin", "--expires", "2099-01-31T00:00:00Z",
                           "--append", str(tf), "-o", "json"))["token"]
    tokens, _ = load_token_file(str(tf))
    assert tokens[hash_token(first["token"])].name == "ci-bot"
    assert tokens[hash_token(first["token"])].roles == ("resolver", "auditor")
    night = tokens[hash_token(second["token"])]
    assert (night.name, night.roles, night.expiry()) == ('ops "night"', ("admin",), "2099-01-31T00:00:00+00:00")
    assert second["sha256"] == hash_token(second["token"]) and second["appended_to"] == str(tf)
    assert second["expires"] == "2099-01-31T00:00:00+00:00" and first["token"] not in tf.read_text()


def test_bad_input_names_the_field_and_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('[[tokens]]\nprincipal = "x"\nroles = ["resolver"]\n')  # no sha256: serve refuses it
    before = broken.read_text()
    for args, field in ((("--principal", "a", "--role", "resolver", "--append", str(broken)), "append"),
                        (("--principal", " ", "--role", "resolver"), "principal"),
                        (("--principal", "a", "--role", "resolver", "--expires", "2027-01-31"), "expires"),
                        (("--principal", "a", "--role", "resolver", "--expires", "2001-01-31T00:00:00Z"), "expires"),
                        (("--principal", "a", "--role", "resolver", "--expires-in-days", "0"), "expires_in_days"),
                        # regression: OverflowError and "cannot convert float NaN" tracebacks
                        (("--principal", "a", "--role", "resolver", "--expires-in-days", "99999999999"), "expires_in_days"),
                        (("--principal", "a", "--role", "resolver", "--expires-in-days", "nan"), "expires_in_days"),
                        (("--principal", "a", "--role", "resolver", "--expires-in-days", "3",
                          "--expires", "2099-01-31T00:00:00Z"), "expires")):
        proc = token(*args, "-o", "json")
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert as_json(proc)["error"]["field_violations"][0]["field"] == field, (args, proc.stdout)
    assert broken.read_text() == before
    assert "tokens[0].sha256: missing" in as_json(token("--principal", "a", "--role", "resolver", "--append",
                                                        str(broken), "-o", "json"))["error"]["message"]
    unknown_role = token("--principal", "a", "--role", "root")
    assert unknown_role.returncode == 2 and "invalid choice: 'root'" in unknown_role.stderr


def revoke(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "revoke", *args, "-o", "json"],
                          input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_revoke_removes_tokens_by_hash_by_token_or_by_principal_and_keeps_the_rest(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    tf.write_text("# cgsvc tokens, kept by ops\n")
    made = {}
    for key, principal, role in (("ci1", "ci-bot", "resolver"), ("ci2", "ci-bot", "resolver"), ("ops", "ops", "admin")):
        made[key] = as_json(token("--principal", principal, "--role", role, "--append", str(tf), "-o",
                                  "json"))["token"]["token"]
    with tf.open("a") as fh:
        fh.write('\n[[certificates]]\ncommon_name = "orchestrator"\nroles = ["launcher"]\n')
    tf.chmod(0o640)
    by_hash = revoke("--file", str(tf), "--sha256", hash_token(made["ops"])[:12])
    assert by_hash.returncode == 0, by_hash.stdout + by_hash.stderr
    assert [g["principal"] for g in as_json(by_hash)["revoked"]] == ["ops"] and as_json(by_hash)["tokens_left"] == 2
    by_token = revoke("--file", str(tf), "--token", "-", stdin=made["ci1"] + "\n")  # a leaked token you hold
    assert as_json(by_token)["revoked"][0]["sha256"] == hash_token(made["ci1"])
    by_principal = revoke("--file", str(tf), "--principal", "ci-bot")
    assert as_json(by_principal)["revoked"][0]["sha256"] == hash_token(made["ci2"])
    tokens, certificates = load_token_file(str(tf))
    assert tokens == {} and list(certificates) == ["orchestrator"]  # the certificate entry stays
    assert tf.read_text().startswith("# cgsvc tokens, kept by ops\n") and stat.S_IMODE(tf.stat().st_mode) == 0o640


def test_revoke_refuses_what_names_no_token_or_several_and_changes_nothing(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    tf.write_text("".join(f'[[tokens]]\nprincipal = "p{i}"\nroles = ["resolver"]\nsha256 = "abcdef01{d * 56}"\n\n'
                          for i, d in enumerate("01")))
    before = tf.read_text()
    for args, field, words in ((("--principal", "nobody"), "principal", "no token of principal 'nobody'"),
                               (("--sha256", "abcdef01"), "sha256", "names 2 tokens (p0, p1)"),
                               (("--sha256", "abc"), "sha256", "8 to 64 hex digits"),
                               (("--token", "t0ken"), "token", "shell's history"),
                               ((), "principal", "give one of"),
                               (("--principal", "p0", "--sha256", "abcdef01"), "principal", "give one of")):
        proc = revoke("--file", str(tf), *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        (violation,) = as_json(proc)["error"]["field_violations"]
        assert violation["field"] == field and words in violation["description"], (args, violation)
    assert tf.read_text() == before
    missing = revoke("--file", str(tmp_path / "absent.toml"), "--principal", "p0")
    assert missing.returncode == 2 and as_json(missing)["error"]["field_violations"][0]["field"] == "file"


def closed_stdout(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`cgsvc ...` whose standard output is a pipe its reader closed before a byte was written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "cgsvc.server.main", *args], input=stdin, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT)
    finally:
        os.close(write_end)


def test_a_token_nobody_received_fails_and_says_how_to_take_its_entry_back(tmp_path: Path) -> None:
    tf = tmp_path / "tokens.toml"
    lost = closed_stdout("token", "new", "--principal", "ci-bot", "--role", "resolver", "--append", str(tf))
    assert lost.returncode == 1 and "Traceback" not in lost.stderr, lost.stderr
    assert "the token could not be printed (standard output was closed)" in lost.stderr
    (digest,) = load_token_file(str(tf))[0]  # the entry was added before the token was printed
    undo = lost.stderr.split(": ", 2)[-1].strip()
    assert undo == f"cgsvc token revoke --file {tf} --sha256 {digest[:16]}", lost.stderr
    revoked = subprocess.run([sys.executable, "-m", "cgsvc.server.main", *undo.split()[1:]], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
    assert revoked.returncode == 0, revoked.stderr
    assert load_token_file(str(tf))[0] == {}
    hashed = closed_stdout("token", "hash", stdin="cgsvc_abc\n")  # output nobody wanted: quiet, exit 0
    assert (hashed.returncode, hashed.stderr) == (0, "")


def test_an_empty_token_is_never_a_credential(tmp_path: Path) -> None:
    """`cgsvc token hash` with nothing on stdin printed the SHA-256 of the empty string; put in a
    token file, it would have admitted `authorization: Bearer  ` (a blank token, which the
    server stripped to nothing before hashing). Each step now refuses it."""
    from cgsvc.server.auth import Authenticator, AuthError, TokenFileError

    empty = hash_token("")
    hashed = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "token", "hash"], input="\n",
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert hashed.returncode == 2 and hashed.stdout == "", hashed.stdout
    assert "token: empty" in hashed.stderr, hashed.stderr
    tf = tmp_path / "tokens.toml"
    tf.write_text(f'[[tokens]]\nprincipal = "nobody"\nroles = ["admin"]\nsha256 = "{empty}"\n')
    try:
        load_token_file(str(tf))
        raise AssertionError("a token file holding the empty token's hash was admitted")
    except TokenFileError as exc:
        assert "tokens[0].sha256" in str(exc) and "empty token" in str(exc), exc
    auth = Authenticator(require=True)
    auth.tokens = {empty: auth.anonymous}  # as if it had been admitted: the blank token still is not
    for header in ("Bearer  ", "Bearer \t"):
        try:
            auth.authenticate({"authorization": header}, None)
            raise AssertionError(f"{header!r} authenticated")
        except AuthError as exc:
            assert "Bearer <token>" in str(exc), exc


def test_revoke_from_a_file_in_another_toml_form_rewrites_it_when_asked(tmp_path: Path) -> None:
    """A token file written as an inline array (`tokens = [{...}, ...]`), which `serve` admits,
    could not be revoked from: "edit it by hand". `--rewrite` writes it anew as tables, the
    revoked entry left out; without it the refusal says so, and the file is untouched."""
    tf = tmp_path / "tokens.toml"
    a, b = hash_token("cgsvc_a"), hash_token("cgsvc_b")
    tf.write_text(f'# the fleet\'s tokens\ntokens = [\n  {{principal = "a", roles = ["resolver"], sha256 = "{a}"}},\n'
                  f'  {{principal = "b", roles = ["auditor"], sha256 = "{b}", expires = 2099-01-01T00:00:00Z}},\n]\n'
                  '[[certificates]]\ncommon_name = "orchestrator"\nroles = ["launcher"]\n')
    before = tf.read_text()
    refused = revoke("--file", str(tf), "--principal", "a")
    assert refused.returncode == 2 and tf.read_text() == before, refused.stdout
    assert "--rewrite" in as_json(refused)["error"]["field_violations"][0]["description"]
    done = revoke("--file", str(tf), "--principal", "a", "--rewrite")
    assert done.returncode == 0, done.stdout + done.stderr
    assert as_json(done)["revoked"][0]["principal"] == "a" and as_json(done)["rewritten"] is True
    tokens, certificates = load_token_file(str(tf))
    assert [(p.name, p.roles) for p in tokens.values()] == [("b", ("auditor",))] and tokens[b].expiry()
    assert list(certificates) == ["orchestrator"]
    assert tf.read_text().startswith("[[tokens]]\n")  # tables now: the next revoke needs no --rewrite


def test_new_appends_to_a_file_in_another_toml_form_when_asked_to_rewrite_it(tmp_path: Path) -> None:
    """Appending a [[tokens]] table to a file that lists tokens as an inline array failed with
    tomllib's "Cannot mutate immutable namespace". The refusal now names --rewrite, which writes
    the file anew as tables with the new entry."""
    tf = tmp_path / "tokens.toml"
    old = hash_token("cgsvc_old")
    tf.write_text(f'tokens = [{{principal = "old", roles = ["resolver"], sha256 = "{old}"}}]\n')
    before = tf.read_text()
    refused = token("--principal", "new", "--role", "auditor", "--append", str(tf), "-o", "json")
    assert refused.returncode == 2 and tf.read_text() == before, refused.stdout
    assert "--rewrite" in as_json(refused)["error"]["field_violations"][0]["description"]
    made = token("--principal", "new", "--role", "auditor", "--append", str(tf), "--rewrite", "-o", "json")
    assert made.returncode == 0, made.stdout + made.stderr
    tokens, _ = load_token_file(str(tf))
    assert sorted(p.name for p in tokens.values()) == ["new", "old"]
    assert hash_token(as_json(made)["token"]["token"]) in tokens and tokens[old].name == "old"
