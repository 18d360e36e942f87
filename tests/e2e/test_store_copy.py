"""`cgsvc store copy`: one box's SQLite log into PostgreSQL (or a backup directory), the copy
served by a real server and proven against a checkpoint signed before it; bad targets refused
with nothing written; a tampered source's copy does not verify. `cgsvc store verify`: a backup
checked where it lies, against a checkpoint, with no server."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from cgsvc_client.client import Client
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cgsvc.audit import checkpoint
from cgsvc.audit.store import STORE_SCHEMA, AuditStore, probe
from cgsvc.launch.store import LaunchRow, LaunchStore, Workload
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess, serve_refused
from tests.e2e.test_serve_check import other_key
from tests.e2e.test_trust import attack, checkpoint_file, cli, resolve_n
from tests.integration.pg import pg_url_or_skip


def store_copy(source: str, target: str, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "store", "copy", source, target, *more],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def copied(source: str, target: str) -> dict[str, Any]:
    proc = store_copy(source, target, "-o", "json")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return dict(json.loads(proc.stdout))


def listing(srv: ServerProcess) -> tuple[list[str], list[str], list[str]]:
    """The plans, records (with their hashes) and launches a server lists: what a copy must keep."""
    with Client(srv.address) as c:
        plans = [p.name for p in c.list_plans(page_size=1000).plans]
        records = [f"{r.sequence} {r.record_hash}" for r in c.list_audit_records(page_size=1000).records]
        launches = [x.name for x in c.list_launches(page_size=1000).launches]
    return plans, records, launches


def test_a_sqlite_log_copied_into_postgresql_is_the_same_log(tmp_path: Path) -> None:
    schema = f"store_copy_{uuid.uuid4().hex[:10]}"  # every test its own, as the others make theirs
    pg = pg_url_or_skip(schema)
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 5)
        cp = checkpoint_file(box, tmp_path / "cp.json")
        before = listing(box)
        # the server goes on writing while the copy reads: the copy is the log at one moment, whole
        writing = threading.Thread(target=resolve_n, args=(box, 40))
        writing.start()
        result = copied(str(box.data_dir), pg)
        writing.join()
    assert result["verified"] and result["tree_size"] >= 5, result
    source = AuditStore(f"sqlite:///{box.data_dir / 'cgsvc.db'}")
    try:  # the source's tree at the copy's size has the copy's root: the same records, in order
        assert source.root_at(result["tree_size"]).hex() == result["root_hash"]
    finally:
        source.close()
    assert result["tables"]["audit_records"] == result["tree_size"] and result["running"] == []
    engine = sa.create_engine(pg)
    with engine.connect() as conn:  # the planner has statistics at once: a filter on the copy uses the indexes
        analyzed = conn.exec_driver_sql("SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = "
                                        "'audit_records' AND schemaname = %(s)s", {"s": schema}).scalar_one()
    engine.dispose()
    assert analyzed
    assert result["signing_key"]["key_id"] == cp["key_id"]
    assert result["signing_key"]["file"] == str(box.data_dir / "signing_key.pem")
    assert "--signing-key" in result["signing_key"]["note"]
    # a replica on the copy, with the log's key, serves the same log and proves the old checkpoint
    with ServerProcess(tmp_path / "replica", "--database-url", pg,
                       "--signing-key", str(box.data_dir / "signing_key.pem")) as replica:
        plans, records, launches = listing(replica)
        assert (plans[:len(before[0])], records[:len(before[1])], launches) == before
        assert len(records) == result["tree_size"]
        verify = cli(replica, "audit", "verify", "--checkpoint", str(tmp_path / "cp.json"))
        assert verify.returncode == 0 and json.loads(verify.stdout)["verification"]["ok"], verify.stdout
        prove = cli(replica, "audit", "prove", "auditRecords/3", "--checkpoint", str(tmp_path / "cp.json"))
        assert prove.returncode == 0, prove.stdout
        resolve_n(replica, 1)  # and the log goes on from there
        assert cli(replica, "audit", "verify").returncode == 0
    # and back: the shared log into a backup directory, the same log again (its key named, not copied)
    back = copied(pg, str(tmp_path / "backup"))
    assert back["verified"] and back["tree_size"] == result["tree_size"] + 1, back
    assert back["signing_key"]["key_id"] == cp["key_id"] and back["signing_key"]["file"] == ""
    assert not (tmp_path / "backup" / "signing_key.pem").exists()
    # the copied key is the log's: a replica with another key does not start on it
    refused = serve_refused(tmp_path / "stranger", "--database-url", pg)
    assert f"signing_key: this log's checkpoints are signed by key {cp['key_id']}" in refused, refused


def test_a_backup_directory_is_served_as_the_original_with_its_key(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 3)
        cp = checkpoint_file(box, tmp_path / "cp.json")
        before = listing(box)
    table = store_copy(str(box.data_dir), str(tmp_path / "backup"))  # a person's form: a table, exit 0
    assert table.returncode == 0, table.stderr
    assert "audit_records        3" in table.stdout and ", verified" in table.stdout, table.stdout
    assert "copied: `cgsvc serve --data-dir` on the target signs with the log's key" in table.stdout
    key = tmp_path / "backup" / "signing_key.pem"
    assert key.read_bytes() == (box.data_dir / "signing_key.pem").read_bytes() and key.stat().st_mode & 0o077 == 0
    for made in (tmp_path / "backup", tmp_path / "backup" / "cgsvc.db"):  # the server's own, as serve makes them
        assert made.stat().st_mode & 0o077 == 0, (made, oct(made.stat().st_mode))
    with ServerProcess(tmp_path / "backup") as restored:
        assert listing(restored) == before
        assert cli(restored, "audit", "verify", "--checkpoint", str(tmp_path / "cp.json")).returncode == 0
        assert json.loads(cli(restored, "audit", "checkpoint").stdout)["checkpoint"]["key_id"] == cp["key_id"]


def test_bad_copies_are_refused_by_name_and_write_nothing(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 2)
    source = str(box.data_dir)
    assert copied(source, str(tmp_path / "first"))["verified"]
    # into a log of its own: refused, and the target keeps exactly what it had
    again = store_copy(source, str(tmp_path / "first"), "-o", "json")
    error = json.loads(again.stdout)["error"]
    assert again.returncode == 2 and error["field_violations"][0]["field"] == "target", again.stdout
    assert "already holds 2 audit_records" in error["message"] and "copy into an empty database" in error["message"]
    assert copied(str(tmp_path / "first"), str(tmp_path / "second"))["tree_size"] == 2  # nothing added to first
    for args, field, said in [
        ((str(tmp_path / "nowhere"), str(tmp_path / "t1")), "source", "no cgsvc.db there"),
        ((f"sqlite:///{tmp_path}/none.db", str(tmp_path / "t2")), "source", "no such SQLite file"),
        ((source, source), "target", "is the source"),
        ((source, str(box.data_dir / "cgsvc.db")), "target", "a file, not a data directory"),
        # regression: another database's URL ended in a traceback (No module named 'MySQLdb')
        ((source, "mysql://u:pw@db/cgsvc"), "target", "'mysql://***@db/cgsvc': mysql is not a database cgsvc"),
        (("sqlite://", str(tmp_path / "t3")), "source", "an in-memory SQLite database"),
    ]:
        proc = store_copy(*args, "-o", "json")
        error = json.loads(proc.stdout)["error"]
        assert proc.returncode == 2 and error["field_violations"][0]["field"] == field, proc.stdout
        assert said in error["message"], error
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "t2" / "cgsvc.db").exists()
    # a database that cannot be reached: exit 1, said in one line, nothing made
    down = store_copy(source, "postgresql+psycopg://postgres@127.0.0.1:1/none", "-o", "json")
    assert down.returncode == 1 and json.loads(down.stdout)["error"]["message"].startswith("target: "), down.stdout


def test_a_source_at_an_older_schema_is_copied_and_left_as_it_was(tmp_path: Path) -> None:
    """Regression: `store copy` opened its source with the store, which brought an older schema up
    to this release's in place, so copying a backup changed the backup. A SQLite source is now
    copied from a snapshot brought up to date; a PostgreSQL one (no snapshot to take aside) and a
    database that holds no log are refused, with nothing written to either side."""
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 3)
    db = box.data_dir / "cgsvc.db"
    con = sqlite3.connect(db)  # as a release before the latest migration left it
    con.execute("DELETE FROM schema_migrations WHERE version = ?", (STORE_SCHEMA,))
    con.commit()
    con.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    result = copied(str(box.data_dir), str(tmp_path / "copy"))
    assert result["verified"] and result["tree_size"] == 3, result
    assert result["source_schema"] == {"version": STORE_SCHEMA - 1, "copied_at": STORE_SCHEMA,
                                       "note": result["source_schema"]["note"]}
    assert "snapshot" in result["source_schema"]["note"] and "as it was" in result["source_schema"]["note"]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # the source, byte for byte
    assert sorted(p.name for p in box.data_dir.iterdir() if p.name.startswith("cgsvc.db")) == ["cgsvc.db"]
    assert probe(f"sqlite:///{tmp_path / 'copy' / 'cgsvc.db'}").schema_version == STORE_SCHEMA  # type: ignore[union-attr]
    table = store_copy(str(box.data_dir), str(tmp_path / "copy2"))
    assert table.returncode == 0 and f"source at schema {STORE_SCHEMA - 1}" in table.stdout, table.stdout
    # PostgreSQL: refused, the source at its schema still
    url = pg_url_or_skip(f"old_source_{uuid.uuid4().hex[:10]}")
    AuditStore(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM schema_migrations WHERE version = %(v)s", {"v": STORE_SCHEMA})
    proc = store_copy(url, str(tmp_path / "from-pg"), "-o", "json")
    error = json.loads(proc.stdout)["error"]
    assert proc.returncode == 2 and error["field_violations"][0]["field"] == "source", proc.stdout
    assert f"at schema {STORE_SCHEMA - 1}, older than this release's {STORE_SCHEMA}" in error["message"], error
    assert "cgsvc serve" in error["message"], error
    assert probe(url).schema_version == STORE_SCHEMA - 1  # type: ignore[union-attr]
    assert not (tmp_path / "from-pg" / "cgsvc.db").exists()
    # a database that holds no cgsvc log: refused, and not made into one
    empty = pg_url_or_skip(f"empty_source_{uuid.uuid4().hex[:10]}")
    nothing = store_copy(empty, str(tmp_path / "from-empty"), "-o", "json")
    assert nothing.returncode == 2 and "holds no cgsvc log" in json.loads(nothing.stdout)["error"]["message"]
    with engine.connect() as conn:
        tables = conn.exec_driver_sql("SELECT count(*) FROM information_schema.tables WHERE table_schema = %(s)s",
                                      {"s": empty.rsplit("%3D", 1)[1]}).scalar_one()
    engine.dispose()
    assert tables == 0


def test_a_tampered_log_is_copied_as_it_is_and_said_not_to_verify(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 4)
    con = sqlite3.connect(box.data_dir / "cgsvc.db")
    con.execute("UPDATE audit_records SET outcome_message = 'nothing to see here' WHERE sequence = 2")
    con.commit()
    con.close()
    proc = store_copy(str(box.data_dir), str(tmp_path / "copy"), "-o", "json")
    result = json.loads(proc.stdout)
    assert proc.returncode == 3 and not result["verified"], proc.stdout
    assert result["verification"]["first_bad_sequence"] == 2
    assert "the record was modified" in result["verification"]["reason"]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'copy' / 'cgsvc.db'}")
    with engine.connect() as conn:  # copied as it was: the evidence of the change goes with it
        said = conn.exec_driver_sql("SELECT outcome_message FROM audit_records WHERE sequence = 2").scalar_one()
    engine.dispose()
    assert said == "nothing to see here"


def test_a_launch_running_when_copied_is_named_for_its_takeover(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 1)
    store = AuditStore(f"sqlite:///{box.data_dir / 'cgsvc.db'}")
    try:  # what a running server's store holds while a group runs (the launch store's own insert)
        LaunchStore(store).create(LaunchRow(launch_id="01running", plan_id="p", state="RUNNING", principal="local",
                                            dispatcher="local", tp=4, model_path="/m",
                                            workload=Workload(8, 8, 1, 1), run_dir=str(tmp_path / "run")))
    finally:
        store.close()
    result = copied(str(box.data_dir), str(tmp_path / "json"))
    assert result["verified"] and result["running"] == ["launches/01running"], result
    table = store_copy(str(box.data_dir), str(tmp_path / "table"))
    assert table.returncode == 0 and "running when copied: launches/01running: a replica started on the target " \
                                      "takes them over" in table.stdout, table.stdout
    assert copied(str(tmp_path / "json"), str(tmp_path / "again"))["running"] == ["launches/01running"]


def test_a_key_file_that_is_not_the_logs_is_left_where_it_is(tmp_path: Path) -> None:
    """A server started with --signing-key elsewhere leaves its data directory's key file unused (or
    never made): the copy carries the log's key only, and names what to give a target server."""
    elsewhere = tmp_path / "elsewhere.pem"
    with ServerProcess(tmp_path / "box", "--signing-key", str(elsewhere)) as box:
        resolve_n(box, 1)
    other_key(box.data_dir / "signing_key.pem")  # some other key, where the default would be
    result = copied(str(box.data_dir), str(tmp_path / "copy"))
    assert result["signing_key"]["file"] == "" and not (tmp_path / "copy" / "signing_key.pem").exists(), result
    assert "serve the target with --signing-key the key the source's servers sign with" in \
        result["signing_key"]["note"], result


def store_verify(where: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc.server.main", "store", "verify", str(where), *more],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_backup_is_verified_where_it_lies_and_holds_a_checkpoint_or_says_why_not(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 5)
        checkpoint_file(box, tmp_path / "cp.json")
    backups = {how: tmp_path / how for how in ("kept", "truncated", "rewritten", "edited")}
    for where in backups.values():
        assert copied(str(box.data_dir), str(where))["verified"]
    db = backups["kept"] / "cgsvc.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    proc = store_verify(backups["kept"], "--checkpoint", str(tmp_path / "cp.json"), "-o", "json")
    result = json.loads(proc.stdout)["verification"]
    assert proc.returncode == 0 and result["ok"] and result["records_checked"] == 5, proc.stdout + proc.stderr
    assert (result["checkpoint_size"], result["key_known"]) == (5, True), result
    plain = store_verify(backups["kept"])
    assert plain.returncode == 0 and plain.stdout.startswith("audit chain OK: 5 records"), plain.stdout
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # read, not written
    # what anyone with the file can do, each caught: the chain repaired after the change, so only the
    # checkpoint tells (cut back, rewritten), or not repaired (edited: the chain itself tells)
    attack(backups["truncated"] / "cgsvc.db", keep=3)
    attack(backups["rewritten"] / "cgsvc.db", rewrite=2)
    con = sqlite3.connect(backups["edited"] / "cgsvc.db")
    con.execute("UPDATE audit_records SET principal = 'someone-else' WHERE sequence = 4")
    con.commit()
    con.close()
    for how, said in (("truncated", "the log is shorter than the checkpoint (3 records, the checkpoint has 5)"),
                      ("rewritten", "inconsistent history: the first 5 records are not the ones the checkpoint"),
                      ("edited", "record_hash does not match the record's contents")):
        assert store_verify(backups[how]).returncode == (3 if how == "edited" else 0), how  # alone, a repair passes
        proc = store_verify(backups[how], "--checkpoint", str(tmp_path / "cp.json"), "-o", "json")
        result = json.loads(proc.stdout)["verification"]
        assert proc.returncode == 3 and not result["ok"] and said in result["reason"], (how, proc.stdout)
    table = store_verify(backups["truncated"], "--checkpoint", str(tmp_path / "cp.json"))
    assert table.stdout.startswith("audit log does NOT hold the checkpoint's tree: the log is shorter"), table.stdout
    # the same tree signed by a key this log never had (nor rotated to): the tree holds, the key does not
    saved = json.loads((tmp_path / "cp.json").read_text())["checkpoint"]
    forged = checkpoint.sign(Ed25519PrivateKey.generate(), saved["tree_size"], bytes.fromhex(saved["root_hash"]),
                             saved["time"])
    (tmp_path / "forged.json").write_text(json.dumps({"checkpoint": forged.to_dict()}))
    proc = store_verify(backups["kept"], "--checkpoint", str(tmp_path / "forged.json"), "-o", "json")
    result = json.loads(proc.stdout)["verification"]
    assert proc.returncode == 3 and not result["ok"] and not result["key_known"], proc.stdout
    assert f"the log's key is {saved['key_id'][:16]}" in result["reason"], result["reason"]
    assert "no rotation signed by the checkpoint's key" in result["reason"], result["reason"]
    # bad input: a file that is no checkpoint, a directory with no log
    (tmp_path / "junk.json").write_text("[]")
    junk = store_verify(backups["kept"], "--checkpoint", str(tmp_path / "junk.json"), "-o", "json")
    assert junk.returncode == 2 and json.loads(junk.stdout)["error"]["field_violations"][0]["field"] == "checkpoint"
    nowhere = store_verify(tmp_path / "nowhere", "-o", "json")
    assert nowhere.returncode == 2 and "no cgsvc.db there" in nowhere.stdout, nowhere.stdout


def on_terminal(*args: str) -> tuple[int, str, str]:
    """`cgsvc store ARGS` with its stderr on a terminal (a pseudo-terminal): (exit code, stdout,
    what the terminal showed)."""
    import os
    import pty

    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "store", *args], stdout=subprocess.PIPE,
                          stderr=slave, text=True, timeout=120, cwd=ROOT)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed and everything it wrote has been read
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.returncode, proc.stdout, shown.decode()


def test_long_store_commands_say_how_far_they_have_got_on_a_terminal(tmp_path: Path) -> None:
    """A million records take a minute to copy and 40 s to verify: on a terminal each step says
    how far it has got, on one line that it rewrites; a script's -o json gets none of it."""
    with ServerProcess(tmp_path / "box") as box:
        resolve_n(box, 3)
    rc, out, shown = on_terminal("copy", str(box.data_dir), str(tmp_path / "copy"))
    assert rc == 0 and "verified" in out, out
    assert "audit_records: 3 rows" in shown and "verifying the copy: 3 of 3 records" in shown, shown
    rc, out, shown = on_terminal("verify", str(tmp_path / "copy"))
    assert rc == 0 and out.startswith("audit chain OK: 3 records"), out
    assert "verifying: 3 of 3 records" in shown and shown.endswith("\n"), shown
    rc, out, shown = on_terminal("verify", str(tmp_path / "copy"), "-o", "json")
    assert rc == 0 and json.loads(out)["verification"]["ok"] and shown == "", shown
