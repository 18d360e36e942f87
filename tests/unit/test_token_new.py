"""`cgsvc token new`: a fresh bearer token for a principal, its token-file entry, and (with
--append) the entry added to a token file that is checked as `serve` would check it, or left
untouched."""

from __future__ import annotations

import json
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
