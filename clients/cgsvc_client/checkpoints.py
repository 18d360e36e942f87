"""Checkpoints on the client's side: reading a saved one, and deciding whether the log a server
holds today extends it. `audit verify --checkpoint`, `audit prove` and `audit witness` share
these, so the three answer the same question the same way: every check is done here, from the
signed checkpoints and the proof, never taken on the server's word."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from cgsvc import codec
from cgsvc.audit import checkpoint, keys, merkle
from cgsvc_client.args import STDIN, bad, read_json
from cgsvc_client.client import Client


def read_file(path: str, name: str = "checkpoint") -> checkpoint.Checkpoint:
    """A checkpoint file (`audit checkpoint -o json` output, or a bare checkpoint object); bad
    input is a CliError naming `name`."""
    body = read_json(path, name)
    try:
        return checkpoint.Checkpoint.from_dict(body)
    except (ValueError, checkpoint.CheckpointError) as exc:
        where = "standard input" if path == STDIN else repr(path)
        raise bad(name, f"{where} is not a cgsvc checkpoint: {exc}") from None


@dataclass
class Extension:
    """Whether the server's log today extends `old`: `new` is the server's signed checkpoint
    (None when the check stopped before one was had), `proof` the consistency proof checked."""

    ok: bool
    reason: str = ""
    new: checkpoint.Checkpoint | None = None
    proof: list[str] = field(default_factory=list)
    rotations: list[keys.Rotation] = field(default_factory=list)  # followed from the old key to the new

    def fields(self, old: checkpoint.Checkpoint) -> dict[str, Any]:
        """What `audit verify --checkpoint -o json` reports of it."""
        if self.new is None:
            return {"ok": self.ok, "reason": self.reason}
        return {"checkpoint_size": old.tree_size, "tree_size": self.new.tree_size, "root_hash": self.new.root_hash,
                "key_id": self.new.key_id, "key_rotations": keys.fields(self.rotations),
                "ok": self.ok, "reason": self.reason}


def rotation_records(c: Client) -> list[Any]:
    """The log's `server.signing_key` records, oldest first."""
    found: list[Any] = []
    token = ""
    while True:
        page = c.list_audit_records(filter=f'method = "{keys.METHOD}"', page_size=100, page_token=token)
        found.extend(page.records)
        token = page.next_page_token
        if not token:
            return sorted(found, key=lambda r: r.sequence)


def log_rotations(c: Client) -> list[keys.Rotation]:
    """Every key rotation the log records, oldest first (a malformed record is skipped here and so
    fails the chain: only a rotation whose signature checks counts)."""
    found: list[keys.Rotation] = []
    for rec in rotation_records(c):
        with contextlib.suppress(ValueError):
            found.append(keys.Rotation.from_record(rec.sequence, rec.spec_json))
    return found


def _follow(c: Client, old: checkpoint.Checkpoint, new: checkpoint.Checkpoint) -> list[keys.Rotation]:
    """The endorsed rotations from `old`'s key to `new`'s, each handing over a tree that today's
    log extends; CheckpointError naming the first link that fails."""
    path = keys.chain(log_rotations(c), old.key_id, new.key_id)
    for rot in path:
        e = rot.endorsement or {}
        size, root = int(e["tree_size"]), bytes.fromhex(str(e["root_hash"]))
        if size > new.tree_size:
            raise checkpoint.CheckpointError(f"{rot.record}: the rotation hands over a tree of {size} records, larger "
                                             f"than the server's checkpoint of {new.tree_size}")
        hashes = list(c.consistency_proof(size, new.tree_size).hashes) if 0 < size < new.tree_size else []
        if size and not merkle.verify_consistency(size, new.tree_size, root, bytes.fromhex(new.root_hash),
                                                  [bytes.fromhex(h) for h in hashes]):
            raise checkpoint.CheckpointError(f"{rot.record}: the log today does not extend the tree the old key "
                                             f"handed over ({size} records)")
    return path


def extends(c: Client, old: checkpoint.Checkpoint, key_id: str = "") -> Extension:
    """Whether the log today extends `old`: the old checkpoint's signature (and key, when
    `key_id` pins one), a fresh checkpoint from the server signed by the same key, its size,
    and an RFC 9162 consistency proof from the old tree to the new, checked here."""
    try:
        checkpoint.verify(old, expected_key_id=key_id)
    except checkpoint.CheckpointError as exc:
        return Extension(False, str(exc))
    new = codec.checkpoint_from_proto(c.get_checkpoint())
    rotations: list[keys.Rotation] = []
    try:
        checkpoint.verify(new)
        if new.key_id != old.key_id:  # a new key: only a chain of rotations each old key signed vouches for it
            rotations = _follow(c, old, new)
    except checkpoint.CheckpointError as exc:
        return Extension(False, f"the server's checkpoint does not verify: {exc}", new)
    if new.origin != old.origin:
        return Extension(False, f"the server's checkpoint is of log {new.origin!r}, not {old.origin!r}", new)
    if new.tree_size < old.tree_size:
        return Extension(False, checkpoint.shorter(new.tree_size, old), new)
    hashes: list[str] = []
    if 0 < old.tree_size < new.tree_size:
        hashes = list(c.consistency_proof(old.tree_size, new.tree_size).hashes)
    ok = old.tree_size == 0 or merkle.verify_consistency(
        old.tree_size, new.tree_size, bytes.fromhex(old.root_hash), bytes.fromhex(new.root_hash),
        [bytes.fromhex(h) for h in hashes])
    return Extension(ok, "" if ok else checkpoint.inconsistent(old), new, hashes, rotations)
