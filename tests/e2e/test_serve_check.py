"""`cgsvc serve --check`: a configuration checked as a start checks it, with nothing made or
written; what stops a start stops the check with the same words; what a running server holds
(its address, its data directory) is a note, since a restart is what a check is run before."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.conftest import ROOT
from tests.e2e.server import ServerProcess, serve_refused
from tests.e2e.test_trust import resolve_n


def check(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "serve", "--check", "--address",
                           "127.0.0.1:0", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def lines(proc: subprocess.CompletedProcess[str], kind: str) -> list[str]:
    return [line.removeprefix(f"{kind}: ") for line in proc.stdout.splitlines() if line.startswith(f"{kind}: ")]


def other_key(path: Path) -> Path:
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def test_a_first_start_is_checked_without_making_anything(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    proc = check(fresh)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok, notes = lines(proc, "ok"), lines(proc, "note")
    assert f"signing key {fresh / 'signing_key.pem'}: generated at start" in ok, ok
    assert any(line.endswith("no cgsvc schema yet: a start makes schema 27") for line in ok), ok
    assert any(line.startswith("local devices: cpu0") for line in ok), ok
    assert f"data_dir {fresh} does not exist: a start makes it (mode 0700)" in notes, notes
    assert any(w.startswith("insecure local mode") for w in lines(proc, "WARNING")), proc.stdout
    assert proc.stdout.splitlines()[-1] == "this configuration starts (see the notes)"
    as_json = json.loads(check(fresh, "-o", "json").stdout)  # the same, for a script
    assert as_json["starts"] and as_json["ok"] == ok and as_json["notes"] == notes, as_json
    assert any(w.startswith("insecure local mode") for w in as_json["warnings"]), as_json
    assert not fresh.exists()  # no directory, no key, no database
    kept = lines(check(fresh, "--launch-retention-days", "30"), "ok")
    assert kept[-1].startswith("launch logs: removed 30 days after an ended launch's last change"), kept


def test_a_log_is_read_and_left_as_it_was(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 3)
        running = check(box.data_dir, "--address", box.address)  # before a restart: the server holds both
        assert running.returncode == 0, running.stdout + running.stderr
        notes = lines(running, "note")
        assert f"address {box.address} is in use now: a start succeeds once whatever listens there stops" in notes
        assert f"data_dir {box.data_dir} is in use by a running cgsvc server: a start is refused until it stops" \
            in notes, notes
    db = box.data_dir / "cgsvc.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    proc = check(box.data_dir)
    assert proc.returncode == 0 and lines(proc, "note") == [], proc.stdout + proc.stderr
    ok = lines(proc, "ok")
    assert any(line.endswith("schema 27 (this release's), 3 audit records") for line in ok), ok
    assert any(line.startswith(f"signing key {box.data_dir / 'signing_key.pem'}: key ") and
               line.endswith(", the log's key") for line in ok), ok
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert proc.stdout.splitlines()[-1] == "this configuration starts"


def test_what_stops_a_start_stops_the_check_in_the_same_words(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 1)
    stranger = other_key(tmp_path / "stranger.pem")
    for args in (("--address", "0.0.0.0:0"),  # beyond loopback, authenticating nobody
                 ("--signing-key", str(stranger)),  # not the log's key
                 ("--tls-cert", str(stranger)),  # TLS needs both files
                 ("--local-devices", "a,a"),
                 ("--database-url", "mysql://a/b"),
                 ("--local-devices", "0-99999999999")):  # regression: the start hung making the list  # regression: a traceback (No module named 'MySQLdb')
        proc = check(box.data_dir, *args)
        said = serve_refused(box.data_dir, *args)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.strip() == said.strip().splitlines()[-1], (args, proc.stderr, said)
    for args, field in ((("--local-devices", "a,a"), "local_devices"), (("--lease-seconds", "0"), "lease_seconds"),
                        (("--signing-key", str(stranger)), "signing_key"), (("--database-url", "bogus"), "database_url")):
        answer = check(box.data_dir, *args, "-o", "json")
        error = json.loads(answer.stdout)["error"]
        assert answer.returncode == 2 and not json.loads(answer.stdout)["starts"], answer.stdout
        assert error["field_violations"][0]["field"] == field, (args, error)
    # the log's key file gone: a start would make another key and refuse; the check says why first
    (box.data_dir / "signing_key.pem").rename(tmp_path / "kept.pem")
    gone = check(box.data_dir)
    assert gone.returncode == 2 and "does not exist, and this log's checkpoints are signed by key" in gone.stderr
    assert not (box.data_dir / "signing_key.pem").exists()
    # a rotation asked for is a note: the old key endorses the new one at start
    rotating = check(box.data_dir, "--signing-key", str(stranger), "--previous-signing-key", str(tmp_path / "kept.pem"))
    assert rotating.returncode == 0, rotating.stderr
    assert any(n.startswith("a start rotates this log's key from ") for n in lines(rotating, "note")), rotating.stdout
    down = check(tmp_path / "pg", "--database-url", "postgresql+psycopg://postgres@127.0.0.1:1/none")
    assert down.returncode == 2 and down.stderr.startswith("cgsvc: database: cannot read postgresql+psycopg://"), \
        down.stderr


def test_a_data_dir_that_is_a_file_or_under_one_stops_the_check_as_it_stops_the_start(tmp_path: Path) -> None:
    """Regression: `serve --check` said "this configuration starts" of a data directory that names
    a file, or lies under one, which a start then refused."""
    (tmp_path / "a-file").write_text("")
    for data_dir, why in ((tmp_path / "a-file", f"data_dir: {tmp_path / 'a-file'} is a file, not a directory"),
                          (tmp_path / "a-file" / "data", f"data_dir: cannot make {tmp_path / 'a-file' / 'data'}: "
                                                         "Not a directory")):
        proc = check(data_dir)
        said = serve_refused(data_dir)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.strip() == said.strip().splitlines()[-1] == f"cgsvc: {why}", (proc.stderr, said)
        error = json.loads(check(data_dir, "-o", "json").stdout)["error"]
        assert error["field_violations"][0]["field"] == "data_dir", error
    assert (tmp_path / "a-file").read_text() == ""


def test_a_database_that_cannot_be_read_stops_the_start_in_the_checks_words(tmp_path: Path) -> None:
    """Regression: a start whose PostgreSQL did not answer, or whose cgsvc.db was not SQLite,
    ended in SQLAlchemy's traceback (exit 1), where the check named the database and why."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cgsvc.db").write_text("not a database")
    for data_dir, args in ((tmp_path / "bad", ()),
                           (tmp_path / "pg", ("--database-url", "postgresql+psycopg://postgres@127.0.0.1:1/none"))):
        proc = check(data_dir, *args)
        said = serve_refused(data_dir, *args)
        assert "Traceback" not in said and said.strip().startswith("cgsvc: database: cannot read "), said
        assert proc.returncode == 2 and proc.stderr.strip() == said.strip(), (proc.stderr, said)
    assert (tmp_path / "bad" / "cgsvc.db").read_text() == "not a database"
