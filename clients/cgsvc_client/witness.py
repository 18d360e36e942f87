"""`cgsvc-cli audit witness`: keep the log's signed checkpoints where the server cannot rewrite
them, and accept each new one only if the log extends the last one kept.

A checkpoint proves something only when it is kept out of the reach of whoever can write the
database. A witness does that keeping without anyone remembering to: run on another machine
(once from cron, or `--every SECONDS`), it fetches the server's signed checkpoint, checks on
this side that the log today extends the last checkpoint it kept (the same key, or one the log
records a rotation to that the kept key signed; not shorter; an RFC 9162 consistency proof from
the kept tree to the new one), and only then keeps the new one. A truncated, rewritten or forked log fails the next check, whenever it happened.

Its directory:

    latest.json          the last checkpoint accepted, as `audit checkpoint -o json` writes it,
                         so `audit verify --checkpoint DIR/latest.json` and `audit prove` take it
    history.jsonl        every accepted checkpoint whose tree differs from the one before, one
                         {"witnessed_at", "checkpoint"} a line, oldest first
    evidence-TIME.json   written when a check fails: the kept checkpoint, the server's, the proof
                         and the reason. Both are signed, so anyone can check offline that the
                         key's owner signed a smaller tree after a larger one, or one it could
                         not prove extends the earlier (docs/audit.md)
    .lock                held while a witness runs, so that two never interleave their files

A check that fails leaves latest.json as it was: the next check compares against the same kept
checkpoint, so a witness never comes to accept a history it refused once.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cgsvc import codec
from cgsvc.audit import checkpoint, keys, merkle
from cgsvc.audit.records import utc_now
from cgsvc.errors import ServiceError
from cgsvc.files import write_atomically
from cgsvc_client import checkpoints, render
from cgsvc_client.args import NO_ANSWER, bad, read_json, seconds
from cgsvc_client.client import Client

LATEST = "latest.json"
HISTORY = "history.jsonl"


def _append_line(path: Path, value: Any) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(value, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class Witness:
    """A witness directory, held (locked) for as long as the object is open."""

    def __init__(self, directory: str, key_id: str = "") -> None:
        self.dir = Path(directory)
        self.pin = key_id
        if self.dir.exists() and not self.dir.is_dir():
            raise bad("dir", f"{directory!r} is not a directory")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "a+")  # noqa: SIM115 - held until close()
        except OSError as exc:
            raise bad("dir", f"cannot use {directory!r}: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise bad("dir", f"another witness is using {directory!r} (it holds {self.dir / '.lock'})") \
                from None
        latest = self.dir / LATEST
        self.kept = checkpoints.read_file(str(latest), "dir") if latest.exists() else None
        if self.pin and self.kept is not None and self.pin not in self._keys_kept():
            self.close()
            raise bad("key_id", f"this directory never kept a checkpoint of key {self.pin[:16]}...: it "
                                            f"follows key {self.kept.key_id} (pin a new key on a new directory)")

    def _keys_kept(self) -> set[str]:
        """Every key this directory kept a checkpoint of: the pinned key and those rotated to from it."""
        found = {self.kept.key_id} if self.kept else set()
        with contextlib.suppress(OSError), open(self.dir / HISTORY, encoding="utf-8") as fh:
            for line in fh:
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    found.add(json.loads(line)["checkpoint"]["key_id"])
        return found

    def close(self) -> None:
        self._lock.close()  # releases the lock

    def __enter__(self) -> Witness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _keep(self, cp: checkpoint.Checkpoint, at: str, changed: bool) -> None:
        if changed:  # the history first: a crash between the two leaves latest.json the older one
            _append_line(self.dir / HISTORY, {"witnessed_at": at, "checkpoint": cp.to_dict()})
        write_atomically(self.dir / LATEST, json.dumps({"checkpoint": cp.to_dict()}, indent=2) + "\n")
        self.kept = cp

    def _evidence(self, at: str, presented: checkpoint.Checkpoint | None, reason: str, proof: list[str]) -> Path:
        stamp = at.replace("-", "").replace(":", "")[:15] + "Z"
        path = self.dir / f"evidence-{stamp}.json"
        n = 1
        while path.exists():
            n += 1
            path = self.dir / f"evidence-{stamp}-{n}.json"
        body = {"reason": reason, "witnessed_at": at,
                "kept": self.kept.to_dict() if self.kept else None,
                "presented": presented.to_dict() if presented else None,
                "consistency_proof": proof}
        write_atomically(path, json.dumps(body, indent=2) + "\n")
        return path

    def check(self, c: Client) -> dict[str, Any]:
        """One check: the server's checkpoint against the kept one; kept when it extends it."""
        at = utc_now()
        out: dict[str, Any] = {"witnessed_at": at, "dir": str(self.dir), "latest": str(self.dir / LATEST)}
        kept = self.kept
        if kept is None:
            new = codec.checkpoint_from_proto(c.get_checkpoint())
            try:
                checkpoint.verify(new, expected_key_id=self.pin)
            except checkpoint.CheckpointError as exc:
                reason = f"the server's checkpoint does not verify: {exc}"
                return {**out, "ok": False, "reason": reason, "evidence": str(self._evidence(at, new, reason, []))}
            self._keep(new, at, changed=True)
            return {**out, "ok": True, "first": True, "trust": "pinned by --key-id" if self.pin else
                    "trusted on first use", **_fields(new), "previous_size": None, "grew_by": None, "reason": ""}
        ext = checkpoints.extends(c, kept)  # the pin was checked on opening: kept is its key or rotated from it
        if not ext.ok or ext.new is None:
            evidence = self._evidence(at, ext.new, ext.reason, ext.proof)
            return {**out, "ok": False, **(_fields(ext.new) if ext.new else {}), "previous_size": kept.tree_size,
                    "reason": ext.reason, "evidence": str(evidence)}
        new = ext.new
        warnings = []
        if new.time < kept.time:  # RFC 3339 UTC sorts as text; an honest log's clock may step back: said, not refused
            warnings.append(f"the server's checkpoint is dated {new.time}, before the kept one's {kept.time}")
        self._keep(new, at, changed=(new.tree_size, new.root_hash, new.key_id) != (kept.tree_size, kept.root_hash,
                                                                                      kept.key_id))
        return {**out, "ok": True, "first": False, **_fields(new), "previous_size": kept.tree_size,
                "grew_by": new.tree_size - kept.tree_size, "proof_hashes": len(ext.proof),
                "key_rotations": keys.fields(ext.rotations), "warnings": warnings, "reason": ""}


def _fields(cp: checkpoint.Checkpoint) -> dict[str, Any]:
    return {"tree_size": cp.tree_size, "root_hash": cp.root_hash, "key_id": cp.key_id, "checkpoint_time": cp.time}


def _line(result: dict[str, Any]) -> str:
    """One check, for a person."""
    at = result["witnessed_at"]
    if result.get("checked") is False:
        what = "server not answering" if result["reachable"] is False else "server gave no checkpoint"
        return f"{at}  {what}: {result['reason']}; trying again at the next check"
    if not result["ok"]:
        return f"{at}  FAILED: {result['reason']}; evidence kept in {result['evidence']}"
    size, root, key = result["tree_size"], result["root_hash"][:16], result["key_id"][:16]
    if result["first"]:
        pin = "" if result["trust"].startswith("pinned") else f"; pin it with --key-id {result['key_id']}"
        return f"{at}  first checkpoint kept: {render.counted(size, 'record')}, root {root}, key {key} ({result['trust']}{pin})"
    grew = (f"+{result['grew_by']}, consistency proof of {result['proof_hashes']} hashes verified"
            if result["grew_by"] else "unchanged")
    rotated = "".join(f"; key rotated from {r['from_key_id'][:16]} to {r['to_key_id'][:16]}, signed by the old key "
                      f"({r['record']})" for r in result.get("key_rotations", []))
    warned = "".join(f"; WARNING: {w}" for w in result.get("warnings", []))
    return f"{at}  OK: {render.counted(size, 'record')} ({grew}), root {root}{rotated}{warned}; kept in {result['latest']}"


def _positive(value: int | None, name: str, what: str) -> None:
    if value is not None and value <= 0:
        raise bad(name, f"must be more than 0 {what}, got {value:g}")


def _key_id(text: str | None) -> str:
    if not text:
        return ""
    key = text.strip().lower()
    if len(key) != 64 or any(ch not in "0123456789abcdef" for ch in key):
        raise bad("key_id", "expected 64 hex digits, the key_id that `audit checkpoint` prints")
    return key


def audit_witness(ns: argparse.Namespace) -> int:
    _positive(ns.count, "count", "checks")
    if ns.count and ns.count > 1 and not ns.every:
        raise bad("count", f"{ns.count} checks need --every SECONDS between them")
    pin = _key_id(ns.key_id)
    count = ns.count or (0 if ns.every else 1)  # 0: until stopped
    as_json = render.output_mode(ns) == "json"
    rc, done = 0, 0
    with Witness(ns.dir, pin) as w, Client.from_args(ns) as c, _stopped_quietly():
        while True:
            try:
                result = w.check(c)
                rc = 0
            except ServiceError as exc:
                if not ns.every:
                    raise
                # a server that restarts, or a network that drops, is not a verdict: say so and go on
                # (or a replica left on a retired key, which refuses to sign: the next check may reach another)
                result = {"witnessed_at": utc_now(), "ok": False, "checked": False,
                          "reachable": exc.code not in NO_ANSWER, "reason": f"{exc.code}: {exc.message}"}
                rc = 1
            print(json.dumps({"witness": result}, ensure_ascii=False) if as_json else _line(result), flush=True)
            if not result["ok"] and result.get("checked") is not False:
                return 3
            done += 1
            if count and done >= count:
                return rc
            time.sleep(ns.every)
    return rc  # stopped (Ctrl-C) between or during checks


@contextlib.contextmanager
def _stopped_quietly() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        print("witness stopped", file=sys.stderr)


def judge(evidence: Any, key_id: str = "") -> dict[str, Any]:
    """What a witness's evidence file proves, from nothing but the file: `proven` (the log's key
    signed two checkpoints no append-only log can both have), with `misbehaviour` naming which,
    or not, with `reason` saying what is missing. Bad input raises CliError naming the field."""
    if not isinstance(evidence, dict):
        raise bad("evidence", "an evidence file is a JSON object with kept, presented and "
                                          "consistency_proof (audit witness writes it)")
    cps: dict[str, checkpoint.Checkpoint] = {}
    for name in ("kept", "presented"):
        try:
            cps[name] = checkpoint.Checkpoint.from_dict(evidence.get(name))
        except checkpoint.CheckpointError as exc:
            raise bad(f"evidence.{name}", str(exc)) from None
    proof = evidence.get("consistency_proof", [])
    if not isinstance(proof, list) or not all(isinstance(h, str) and len(h) == 64 for h in proof):
        raise bad("evidence.consistency_proof", "expected a list of 64-hex-digit hashes")
    kept, presented = cps["kept"], cps["presented"]
    out: dict[str, Any] = {"kept_size": kept.tree_size, "presented_size": presented.tree_size, "key_id": kept.key_id,
                           "reason_recorded": str(evidence.get("reason", ""))}

    def verdict(proven: bool, misbehaviour: str, reason: str) -> dict[str, Any]:
        return {**out, "proven": proven, "misbehaviour": misbehaviour, "reason": reason}

    for name, cp in cps.items():
        try:
            checkpoint.verify(cp, expected_key_id=key_id)
        except checkpoint.CheckpointError as exc:
            return verdict(False, "", f"{name}: {exc}")
    if presented.key_id != kept.key_id:
        return verdict(False, "", f"the two checkpoints have different keys ({kept.key_id[:16]}... and "
                                  f"{presented.key_id[:16]}...): a rotation is checked against the log "
                                  "(`audit keys`), not from this file")
    if kept.origin != presented.origin:
        return verdict(False, "", f"the checkpoints are of two logs ({kept.origin!r}, {presented.origin!r})")
    if presented.tree_size == kept.tree_size:
        if presented.root_hash != kept.root_hash:
            return verdict(True, "forked", f"the key signed two different trees of {kept.tree_size} records "
                                           f"(roots {kept.root_hash[:16]}... and {presented.root_hash[:16]}...)")
        return verdict(False, "", "the two checkpoints sign the same tree")
    if presented.tree_size < kept.tree_size:
        if presented.time > kept.time:
            return verdict(True, "truncated", f"the key signed a tree of {presented.tree_size} records at "
                                              f"{presented.time}, after one of {kept.tree_size} at {kept.time}")
        return verdict(False, "", f"the smaller tree ({presented.tree_size} records) is dated {presented.time}, no "
                                  f"later than the larger one's {kept.time}: an older checkpoint, not a later one")
    if merkle.verify_consistency(kept.tree_size, presented.tree_size, bytes.fromhex(kept.root_hash),
                                 bytes.fromhex(presented.root_hash), [bytes.fromhex(h) for h in proof]):
        return verdict(False, "", "the consistency proof in the file holds: the later tree extends the earlier")
    return verdict(False, "", "the server's consistency proof does not hold, which a faulty answer can cause as well "
                              "as a fork: ask it again for a proof between the two sizes (GetConsistencyProof) "
                              "before you call it a fork")


def audit_evidence(ns: argparse.Namespace) -> int:
    body = read_json(ns.file, "file")
    result = {"file": ns.file, **judge(body, _key_id(ns.key_id))}
    if render.output_mode(ns) == "json":
        render.print_json({"evidence": result})
    elif result["proven"]:
        print(f"PROVEN ({result['misbehaviour']}): {result['reason']}; both checkpoints verify under key "
              f"{result['key_id']}")
    else:
        print(f"not proven: {result['reason']}")
    return 0 if result["proven"] else 3


def register_evidence(audit: Any) -> argparse.ArgumentParser:
    e = audit.add_parser("evidence", help="what a witness's evidence file proves, checked offline from the file "
                                          "alone (exit 0: the log's key signed a truncated or forked history; "
                                          "3: not proven, saying why)")
    e.add_argument("file", help="an evidence-TIME.json a witness wrote; - reads standard input")
    e.add_argument("--key-id", metavar="HEX", help="the log's key id (64 hex digits) both checkpoints must carry")
    e.set_defaults(func=audit_evidence)
    return e


def register(audit: Any) -> argparse.ArgumentParser:
    w = audit.add_parser(
        "witness", help="keep the log's checkpoints in a directory of your own, each accepted only if the log "
                        "extends the last one kept (exit 3, with evidence, when not)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--dir", required=True, help="the witness's directory (created if absent): latest.json, "
                                                "history.jsonl, evidence-*.json")
    w.add_argument("--key-id", metavar="HEX", help="the signing key's id (64 hex digits) the first checkpoint must carry (later "
                                    "keys only by rotations it signed); without it the first key is trusted on first use")
    w.add_argument("--every", type=seconds, metavar="SECONDS", help="check again every SECONDS until stopped (or --count checks); "
                                               "a server not answering is reported and retried, not a failure")
    w.add_argument("--count", type=int, metavar="N", help="stop after this many checks (default: 1, or until stopped with --every)")
    w.set_defaults(func=audit_witness, json_lines=True)  # -o json: one line a check, and an error
    return w

