"""`cgsvc store copy|verify`: the database itself, run where it is reachable (no server needed).

    cgsvc store copy var/cgsvc postgresql+psycopg://postgres@db:5432/cgsvc   one box's log to replicas'
    cgsvc store copy var/cgsvc /backup/cgsvc-2026-12-07                      a backup, key file and all
    cgsvc store verify /backup/cgsvc-2026-12-07 --checkpoint cp.json        a backup checked where it lies

`copy` takes the whole database into an empty one (a server may go on writing to the source
meanwhile); `verify` recomputes a log's chain and tree and checks a checkpoint against it, reading only.

SOURCE and TARGET are each a database URL (as `serve --database-url` takes) or a data directory
(as `serve --data-dir`: its cgsvc.db). The copy is cgsvc/audit/copy.py's; this module reads the
arguments, carries the signing key between data directories, and says what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cgsvc.server.token_commands import refuse
from cgsvc.text import counted

if TYPE_CHECKING:
    from cgsvc.audit.checkpoint import Checkpoint
    from cgsvc.audit.keys import Rotation
    from cgsvc.audit.store import AuditStore

KEY_FILE = "signing_key.pem"  # serve's default --signing-key, in its data directory
DATABASE_FILE = "cgsvc.db"  # serve's SQLite log, in its data directory


def register(sub: Any) -> None:
    """The `store` command and its subcommands."""
    s = sub.add_parser("store", help="the database itself: copy it whole (SQLite to PostgreSQL, or a backup), or "
                                     "verify one where it lies")
    ssub = s.add_subparsers(dest="store_command", required=True)
    c = ssub.add_parser(
        "copy", help="copy every record, plan, launch and experiment into an empty database, then verify the copy",
        description="Copy a whole cgsvc database into an empty one, from one consistent snapshot (a server may "
                    "go on writing to the source), in one transaction (a failed copy leaves the target empty), "
                    "then read the target back: its log must verify and its Merkle root equal the source's at "
                    "that size, so checkpoints signed before the copy prove against it. Exit 0 when it does, 2 "
                    "for bad arguments (a target that holds anything), 3 when the copy does not verify, 1 when a "
                    "database cannot be reached.")
    c.add_argument("source", help="the database to copy: a URL (sqlite:///PATH, postgresql+psycopg://...) or a "
                                  "serve --data-dir directory (its cgsvc.db); only read: a SQLite log at an older "
                                  "schema is copied from a snapshot brought to this release's, a PostgreSQL one is "
                                  "refused (serve it once with this release)")
    c.add_argument("target", help="an empty database: a URL, or a data directory (made when absent; the source "
                                  f"directory's {KEY_FILE} is copied there too when it is the log's key)")
    c.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table (default; progress on stderr on a terminal) or json")
    v = ssub.add_parser(
        "verify", help="verify a database's log where it lies, with no server: a backup, or a stopped server's",
        description="Recompute the log's hash chain and Merkle tree from the database itself, as `cgsvc-cli audit "
                    "verify` has a server do, and with --checkpoint check that a checkpoint signed earlier is "
                    "this log's: its signature, the tree of its size here has its root, and the key signing the "
                    "log today is the checkpoint's or one it rotated to (each rotation recorded in the log, signed "
                    "by the key it retires, over a tree the log holds). Reads only; a database "
                    "at another schema than this release's is refused rather than migrated. Exit 0 when it "
                    "verifies, 3 when it does not, 2 for bad arguments, 1 when the database cannot be reached.")
    v.add_argument("where", help="the database: a URL (sqlite:///PATH, postgresql+psycopg://...) or a serve "
                                 "--data-dir directory (its cgsvc.db)")
    v.add_argument("--checkpoint", metavar="FILE", help="a checkpoint saved earlier (`cgsvc-cli audit checkpoint "
                                                         "-o json`, or `audit witness`'s): the log must hold its tree, and its key must "
                                                         "be the log's or have signed the rotations to it")
    v.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table (default; progress on stderr on a terminal) or json")


def run(ns: argparse.Namespace) -> int:
    if ns.store_command == "verify":
        return verify(ns.where, ns.checkpoint, ns.output)
    return copy(ns.source, ns.target, ns.output)


def database_url(where: str, must_exist: bool) -> tuple[str, Path | None]:
    """(URL, its data directory or None) for a URL or a data directory; ValueError when a
    source that must exist does not, or a target directory is a file."""
    if "://" in where:
        from sqlalchemy.engine import make_url

        from cgsvc.audit.store import store_url

        url = store_url(where)
        if url.startswith("sqlite") and must_exist and not Path(make_url(url).database or "").is_file():
            raise ValueError(f"{url}: no such SQLite file")
        return url, None
    directory = Path(where)
    if must_exist and not (directory / DATABASE_FILE).is_file():
        raise ValueError(f"{where}: no {DATABASE_FILE} there (a `cgsvc serve --data-dir` directory), and not a "
                         "database URL (sqlite:///PATH, postgresql+psycopg://USER@HOST:PORT/DB)")
    if not must_exist:
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"{where}: a file, not a data directory; give a directory or a database URL")
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return f"sqlite:///{directory.resolve() / DATABASE_FILE}", directory


def copy(source: str, target: str, output: str) -> int:
    import os

    import sqlalchemy as sa

    # What the copy makes is as the server's own: a record is not for every user of the machine to
    # read (its directory 0700, its database file 0600), as `cgsvc serve` makes them.
    os.umask(0o077)

    from cgsvc.audit.copy import CopyError, copy_store
    from cgsvc.audit.records import mask_secrets
    from cgsvc.audit.store import AuditStore

    try:
        source_url, source_dir = database_url(source, must_exist=True)
    except ValueError as exc:
        return refuse(output, "source", str(exc))
    try:
        target_url, target_dir = database_url(target, must_exist=False)
    except ValueError as exc:
        return refuse(output, "target", str(exc))
    if source_url == target_url:
        return refuse(output, "target", f"is the source ({mask_secrets(source_url)}): give another database")
    show = {"source": mask_secrets(source_url), "target": mask_secrets(target_url)}
    try:
        read_url, schema, scratch = _readable(source_url, show["source"])
    except CopyError as exc:
        return refuse(output, exc.field, str(exc))
    except sa.exc.SQLAlchemyError as exc:
        return _unavailable(output, show, "source", exc, " (the target holds nothing of it)")

    shown = _terminal_line(output)

    stores: list[AuditStore] = []
    try:
        for url in (read_url, target_url):
            stores.append(AuditStore(url, wal_checkpoint_every=0))
        done = copy_store(stores[0], stores[1], lambda table, rows: shown(f"{table}: {counted(rows, 'row')}"),
                          lambda checked, total: shown(f"verifying the copy: {checked} of {counted(total, 'record')}"))
    except CopyError as exc:
        return refuse(output, exc.field, str(exc))
    except sa.exc.SQLAlchemyError as exc:  # unreachable, refused, or a failure inside: nothing was committed
        which = "source" if len(stores) == 0 else "target" if len(stores) == 1 else "copy"
        return _unavailable(output, show, which, exc, " (the target holds nothing of it)")
    finally:
        for store in stores:
            store.close()
        if scratch is not None:
            scratch.cleanup()
    shown("")
    key = _carry_key(source_dir, target_dir, done.log_key_id)
    answer = {**show, "tables": done.rows, "tree_size": done.tree_size, "root_hash": done.root_hash,
              "verified": done.verification.ok, "verification": {
                  "ok": done.verification.ok, "records_checked": done.verification.records_checked,
                  "first_bad_sequence": done.verification.first_bad_sequence,
                  "reason": done.verification.reason}, "signing_key": key, "running": done.active,
              "source_schema": schema}
    if output == "json":
        print_json(answer)
    else:
        _print_table(answer)
    return 0 if done.verification.ok else 3


def _readable(url: str, shown: str) -> tuple[str, dict[str, Any], Any]:
    """(the URL to copy from, what the answer says of the source's schema, a temporary directory
    to clean up or None) for the source at `url`, which a copy never writes: at this release's
    schema it is read where it is; a SQLite log at an older one is read from a snapshot brought
    up to date (the store migrates what it opens). CopyError for a database that holds no log, one
    of a newer release, and a PostgreSQL log at an older schema, which has no snapshot to take aside."""
    import sqlite3
    import tempfile

    from sqlalchemy.engine import make_url

    from cgsvc.audit.copy import CopyError
    from cgsvc.audit.store import STORE_SCHEMA, probe

    found = probe(url)
    at = found.schema_version if found is not None else 0
    if at == 0:
        raise CopyError("source", f"{shown} holds no cgsvc log (no schema_migrations table): nothing to copy")
    if at > STORE_SCHEMA:
        raise CopyError("source", f"{shown} is at schema {at}, newer than this release's {STORE_SCHEMA}: copy it "
                                  "with the release that wrote it, or a later one")
    if at == STORE_SCHEMA:
        return url, {"version": at, "copied_at": at, "note": ""}, None
    if not url.startswith("sqlite"):
        raise CopyError("source", f"{shown} is at schema {at}, older than this release's {STORE_SCHEMA}: a copy reads "
                                  "it at this release's schema, and bringing it up to date in place would change the "
                                  "source. Start this release's `cgsvc serve` on it once (it migrates the log, as any "
                                  "upgrade does), or copy it with the release that wrote it")
    scratch = tempfile.TemporaryDirectory(prefix="cgsvc-copy-")
    snapshot = Path(scratch.name) / DATABASE_FILE
    # SQLite's online backup: one consistent snapshot, as a server may be writing to the source. It
    # only reads; a connection opened read-only would leave the WAL's two files behind when it closes.
    try:
        source, target = sqlite3.connect(str(make_url(url).database)), sqlite3.connect(snapshot)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
    except sqlite3.Error as exc:
        scratch.cleanup()
        raise CopyError("source", f"{shown} could not be read for a snapshot: {exc}") from None
    note = (f"source at schema {at}: copied from a snapshot of it brought to this release's schema {STORE_SCHEMA}; "
            "the source is as it was")
    return f"sqlite:///{snapshot}", {"version": at, "copied_at": STORE_SCHEMA, "note": note}, scratch


def verify(where: str, checkpoint_file: str | None, output: str) -> int:
    import json

    import sqlalchemy as sa

    from cgsvc.audit import checkpoint, keys
    from cgsvc.audit.records import mask_secrets
    from cgsvc.audit.store import STORE_SCHEMA, AuditStore, probe

    try:
        url, _ = database_url(where, must_exist=True)
    except ValueError as exc:
        return refuse(output, "where", str(exc))
    cp = None
    if checkpoint_file:
        try:
            cp = checkpoint.Checkpoint.from_dict(json.loads(Path(checkpoint_file).read_text()))
        except (OSError, ValueError, checkpoint.CheckpointError) as exc:
            return refuse(output, "checkpoint", f"{checkpoint_file} is not a cgsvc checkpoint: {exc}")
    show = {"database": mask_secrets(url)}
    key_why, today = "", ""
    followed: list[Rotation] = []
    try:
        found = probe(url)
        if found is None or found.schema_version != STORE_SCHEMA:
            at = found.schema_version if found is not None else 0
            return refuse(output, "where", f"{mask_secrets(url)} is at schema {at}, not this release's {STORE_SCHEMA}: "
                                           "verify it with the release that wrote it (this one would migrate it)")
        store = AuditStore(url, wal_checkpoint_every=0)  # at this release's schema: opening it writes nothing
        try:
            shown = _terminal_line(output)
            v = store.verify(lambda checked, total: shown(f"verifying: {checked} of {counted(total, 'record')}"))
            shown("")
            size, root = store.tree_head()
            held = store.root_at(cp.tree_size).hex() if cp is not None and v.ok and cp.tree_size <= size else ""
            if cp is not None and v.ok:
                key_why, followed, today = _follow_key(store, cp, size)
        finally:
            store.close()
    except sa.exc.SQLAlchemyError as exc:
        return _unavailable(output, show, "where", exc)
    result: dict[str, Any] = {**show, "ok": v.ok, "records_checked": v.records_checked,
                              "first_bad_sequence": v.first_bad_sequence, "reason": v.reason,
                              "head_hash": v.head_hash, "tree_size": size, "root_hash": root.hex()}
    if cp is not None and v.ok:
        why = ""
        try:
            checkpoint.verify(cp)
        except checkpoint.CheckpointError as exc:
            why = str(exc)
        if not why and cp.tree_size > size:
            why = checkpoint.shorter(size, cp)
        elif not why and held != cp.root_hash:
            why = checkpoint.inconsistent(cp)
        result.update(ok=not (why or key_why), reason=why or key_why, checkpoint_size=cp.tree_size, key_id=cp.key_id,
                      key_known=not key_why, current_key_id=today, key_rotations=keys.fields(followed))
    if output == "json":
        print_json({"verification": result})
    elif not v.ok:
        print(f"audit chain BROKEN at auditRecords/{v.first_bad_sequence}: {v.reason} "
              f"({v.records_checked} records verified before it)")
    elif cp is None:
        print(f"audit chain OK: {v.records_checked} records, head {v.head_hash[:16]}, root {root.hex()[:16]}")
    elif result["ok"]:
        whose = ("the log's key today" if not followed else
                 "; ".join(f"key rotated to {r['to_key_id'][:16]} at {r['record']}, signed by {r['from_key_id'][:16]}"
                           for r in result["key_rotations"]))
        print(f"audit log OK: {v.records_checked} records; it holds the checkpoint's tree of {cp.tree_size} records "
              f"(root {cp.root_hash[:16]}), signed by key {cp.key_id[:16]}, {whose}")
    else:
        print(f"audit log does NOT hold the checkpoint's tree: {result['reason']}")
    return 0 if result["ok"] else 3


def _follow_key(store: AuditStore, cp: Checkpoint, size: int) -> tuple[str, list[Rotation], str]:
    """Whether the key that signs this log today is the checkpoint's, or one the checkpoint's key
    handed the log to through rotations recorded in it, each signed by the key it retires over a
    tree this log holds: (why not, "" when it is; the rotations followed; today's key id). The
    checks `audit verify --checkpoint` makes against a server, made on the records at hand."""
    from cgsvc.audit import checkpoint, keys

    current = store.log_key()
    today = current[1] if current is not None else ""
    if today == cp.key_id:
        return "", [], today
    if not today:
        return (f"this log names no signing key, so nothing ties the checkpoint's key {cp.key_id[:16]}... to it",
                [], today)
    rotations: list[keys.Rotation] = []
    token = ""
    while True:
        page, token = store.list_records(f'method = "{keys.METHOD}"', page_size=100, page_token=token, plans=False)
        for rec in page:  # a malformed one is skipped, and so breaks the chain: only a signed rotation counts
            with contextlib.suppress(ValueError):
                rotations.append(keys.Rotation.from_record(rec.sequence, rec.spec_json))
        if not token:
            break
    try:
        path = keys.chain(rotations, cp.key_id, today, whose="the log's key is")
        for rot in path:
            handed = int((rot.endorsement or {})["tree_size"])
            if handed > size or store.root_at(handed).hex() != (rot.endorsement or {})["root_hash"]:
                raise checkpoint.CheckpointError(f"{rot.record}: the log does not hold the tree the old key handed "
                                                 f"over ({counted(handed, 'record')})")
    except checkpoint.CheckpointError as exc:
        return str(exc), [], today
    return "", path, today


def _terminal_line(output: str) -> Callable[[str], None]:
    """A progress line for a person: on a terminal (and not under -o json) each text replaces the
    last on one stderr line, and "" ends the line (when anything was shown); elsewhere nothing."""
    if output != "table" or not sys.stderr.isatty():
        return lambda text: None
    last = [""]

    def show(text: str) -> None:
        if text:
            print(f"\r{text}\x1b[K", end="", file=sys.stderr, flush=True)
        elif last[0]:
            print(file=sys.stderr, flush=True)
        last[0] = text

    return show


def _carry_key(source_dir: Path | None, target_dir: Path | None, key_id: str) -> dict[str, str]:
    """The log's signing key, where the target's servers will find it: copied (mode 0600) from a
    source data directory to a target one, or named for --signing-key."""
    if not key_id:
        return {"key_id": "", "file": "", "note": "no server has signed this log yet"}
    given = source_dir / KEY_FILE if source_dir is not None and (source_dir / KEY_FILE).is_file() else None
    if given is not None and _key_id(given) != key_id:  # the source's servers signed with a key kept elsewhere
        given = None
    if given is not None and target_dir is not None and not (target_dir / KEY_FILE).exists():
        shutil.copyfile(given, target_dir / KEY_FILE)
        (target_dir / KEY_FILE).chmod(0o600)
        return {"key_id": key_id, "file": str(target_dir / KEY_FILE),
                "note": "copied: `cgsvc serve --data-dir` on the target signs with the log's key"}
    where = str(given) if given is not None else "the key the source's servers sign with"
    return {"key_id": key_id, "file": str(given or ""),
            "note": f"serve the target with --signing-key {where}: a server with another key does not start on "
                    "this log (a new key is a rotation: --previous-signing-key)"}


def _key_id(path: Path) -> str:
    """The key id of the Ed25519 key in `path` ("" when it holds none)."""
    from cgsvc.audit import checkpoint, keys

    try:
        return keys.own_key_id(checkpoint.load_or_create_key(path))
    except (checkpoint.CheckpointError, OSError):
        return ""


def _print_table(answer: dict[str, Any]) -> None:
    import cgsvc_client.render as render

    print(f"copied {answer['source']} -> {answer['target']}")
    print(render.table(("table", "rows"), list(answer["tables"].items())))
    v = answer["verification"]
    said = "verified" if v["ok"] else f"DOES NOT VERIFY at auditRecords/{v['first_bad_sequence']}: {v['reason']}"
    print(f"log: {answer['tree_size']} records, root {answer['root_hash']}, {said}")
    key = answer["signing_key"]
    print(f"signing key: {key['key_id'] or '-'}: {key['note']}")
    if answer["source_schema"]["note"]:
        print(answer["source_schema"]["note"])
    if answer["running"]:
        print(f"running when copied: {', '.join(answer['running'])}: a replica started on the target takes them "
              "over as a lapsed replica's; copy once they have ended, or with the source's servers stopped")


def print_json(value: Any) -> None:
    import cgsvc_client.render as render

    render.print_json(value)


def _unavailable(output: str, show: dict[str, Any], which: str, exc: Exception, after: str = "") -> int:
    """A database that could not be reached or failed inside: exit 1, its error's first line
    (credentials masked) after the argument it came from."""
    from cgsvc.audit.records import mask_secrets

    message = str(mask_secrets(f"{which}: {type(exc).__name__}: {str(exc).splitlines()[0]}{after}"))
    if output == "json":
        print_json({**show, "error": {"code": "UNAVAILABLE", "message": message}})
    else:
        print(f"cgsvc: {message}", file=sys.stderr)
    return 1
