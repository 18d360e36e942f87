"""The log's signing key over time: one key signs a log's checkpoints at a time, and a change of
key is itself a record of the log, signed by the key it retires.

A rotation record (`method = "server.signing_key"`, principal `cgsvc`) carries in `spec_json`

    {"reason": "rotated" | "replaced", "key_id", "public_key",
     "previous_key_id", "previous_public_key", "endorsement": {...} | null}

For `rotated`, `endorsement` is the retiring key's signature over the tree it hands over and
the key it hands it to (the UTF-8 bytes of

    cgsvc-key-rotation/v1\\n{origin}\\n{tree_size}\\n{root_hash}\\n{time}\\n{key_id}\\n

with `{tree_size, root_hash, time, signature}` in the record). `replaced` is an operator's
statement that the old key was lost: nothing vouches for the new key, and a witness refuses it.
A client that kept a checkpoint of an older key follows the endorsed rotations to the key of
today's checkpoint, each checked here with nothing but the records' own public keys.

This module imports nothing heavier than `cryptography`, so the CLI uses it as is.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cgsvc.audit import checkpoint

METHOD = "server.signing_key"
FORMAT = "cgsvc-key-rotation/v1"
ROTATED, REPLACED = "rotated", "replaced"


def public_b64(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes_raw()).decode()


def own_key_id(key: Ed25519PrivateKey) -> str:
    return checkpoint.key_id(key.public_key().public_bytes_raw())


@dataclass(frozen=True)
class Rotation:
    """One change of the log's key, as its record states it."""

    reason: str
    key_id: str
    public_key: str
    previous_key_id: str
    previous_public_key: str
    endorsement: dict[str, Any] | None
    sequence: int = 0  # the record that states it

    @property
    def record(self) -> str:
        return f"auditRecords/{self.sequence}"

    def to_json(self) -> str:
        body = {"reason": self.reason, "key_id": self.key_id, "public_key": self.public_key,
                "previous_key_id": self.previous_key_id, "previous_public_key": self.previous_public_key,
                "endorsement": self.endorsement}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_record(cls, sequence: int, spec_json: str) -> Rotation:
        """The rotation a record states; ValueError naming what is wrong with it."""
        try:
            body = json.loads(spec_json)
        except ValueError:
            raise ValueError(f"auditRecords/{sequence}: its spec_json is not JSON") from None
        if not isinstance(body, dict):
            raise ValueError(f"auditRecords/{sequence}: its spec_json is not a key rotation")
        names = ("reason", "key_id", "public_key", "previous_key_id", "previous_public_key")
        if any(not isinstance(body.get(n), str) for n in names) or body["reason"] not in (ROTATED, REPLACED):
            raise ValueError(f"auditRecords/{sequence}: not a key rotation (expected {', '.join(names)} as text, "
                             f"reason {ROTATED!r} or {REPLACED!r})")
        endorsement = body.get("endorsement")
        if endorsement is not None and not isinstance(endorsement, dict):
            raise ValueError(f"auditRecords/{sequence}: endorsement must be an object or null")
        return cls(reason=body["reason"], key_id=body["key_id"], public_key=body["public_key"],
                   previous_key_id=body["previous_key_id"], previous_public_key=body["previous_public_key"],
                   endorsement=endorsement, sequence=sequence)


def _rotation_bytes(origin: str, tree_size: int, root_hash: str, time: str, new_key_id: str) -> bytes:
    return f"{FORMAT}\n{origin}\n{tree_size}\n{root_hash}\n{time}\n{new_key_id}\n".encode()


def rotate(old: Ed25519PrivateKey, new: Ed25519PrivateKey, tree_size: int, root: bytes, time: str,
           origin: str = checkpoint.ORIGIN) -> Rotation:
    """The retiring key `old` hands the log (its tree of `tree_size` records) to `new`."""
    new_id = own_key_id(new)
    signature = old.sign(_rotation_bytes(origin, tree_size, root.hex(), time, new_id))
    endorsement = {"origin": origin, "tree_size": tree_size, "root_hash": root.hex(), "time": time,
                   "signature": base64.b64encode(signature).decode()}
    return Rotation(ROTATED, new_id, public_b64(new), own_key_id(old), public_b64(old), endorsement)


def replace(lost_key_id: str, new: Ed25519PrivateKey) -> Rotation:
    """An operator's statement that the key `lost_key_id` is gone: nothing vouches for `new`."""
    return Rotation(REPLACED, own_key_id(new), public_b64(new), lost_key_id, "", None)


def check(rot: Rotation) -> None:
    """Raise checkpoint.CheckpointError unless the retiring key signed this rotation."""
    if rot.reason != ROTATED or rot.endorsement is None:
        raise checkpoint.CheckpointError(
            f"the key {rot.previous_key_id[:16]}... was replaced by {rot.key_id[:16]}... at {rot.record} without "
            "its signature (the operator declared the old key lost): nothing vouches for the new key")
    e = rot.endorsement
    try:
        public = base64.b64decode(rot.previous_public_key, validate=True)
        new_public = base64.b64decode(rot.public_key, validate=True)
        signature = base64.b64decode(str(e.get("signature", "")), validate=True)
        signed = _rotation_bytes(str(e["origin"]), int(e["tree_size"]), str(e["root_hash"]), str(e["time"]),
                                 rot.key_id)
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise checkpoint.CheckpointError(f"{rot.record}: a malformed key rotation") from None
    if checkpoint.key_id(public) != rot.previous_key_id or checkpoint.key_id(new_public) != rot.key_id:
        raise checkpoint.CheckpointError(f"{rot.record}: its key ids are not the hashes of its public keys")
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, signed)
    except (InvalidSignature, ValueError):
        raise checkpoint.CheckpointError(
            f"{rot.record}: the rotation to key {rot.key_id[:16]}... is not signed by the key it retires "
            f"({rot.previous_key_id[:16]}...)") from None


def fields(rotations: list[Rotation]) -> list[dict[str, Any]]:
    """The rotations followed, as every command that follows them reports them (`key_rotations`)."""
    return [{"record": r.record, "from_key_id": r.previous_key_id, "to_key_id": r.key_id,
             "endorsed_tree_size": (r.endorsement or {}).get("tree_size")} for r in rotations]


def chain(rotations: list[Rotation], start: str, end: str,
          whose: str = "the server's checkpoint is signed by key") -> list[Rotation]:
    """The endorsed rotations, in log order, that lead from key `start` to key `end`; raise
    checkpoint.CheckpointError naming why there is no such chain (`whose` says where `end` came from)."""
    path: list[Rotation] = []
    at = start
    for rot in rotations:
        if at == end:
            break
        if rot.previous_key_id != at:
            continue
        check(rot)
        path.append(rot)
        at = rot.key_id
    if at != end:
        raise checkpoint.CheckpointError(
            f"{whose} {end[:16]}..., and the log records no rotation signed by "
            f"the checkpoint's key {start[:16]}... that leads to it (expected {start[:16]}...)")
    return path
