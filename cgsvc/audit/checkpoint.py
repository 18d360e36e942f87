"""Signed checkpoints of the audit log's Merkle tree, and their offline verification.

A checkpoint is (origin, tree_size, root_hash, time), signed with the server's Ed25519 key.
The signed bytes are

    cgsvc-checkpoint/v1\\n{origin}\\n{tree_size}\\n{root_hash}\\n{time}\\n

and the key id is the hex SHA-256 of the raw 32-byte public key. Anyone holding a checkpoint
and the public key checks the signature with nothing else; a later checkpoint and an RFC 9162
consistency proof then show that today's log extends it (docs/audit.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ORIGIN = "cgsvc"
FORMAT = "cgsvc-checkpoint/v1"


class CheckpointError(ValueError):
    """A checkpoint that is malformed, or whose signature does not verify."""


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    tree_size: int
    root_hash: str
    time: str
    key_id: str
    public_key: str
    signature: str

    def signed_bytes(self) -> bytes:
        return f"{FORMAT}\n{self.origin}\n{self.tree_size}\n{self.root_hash}\n{self.time}\n".encode()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Checkpoint:
        if isinstance(data, dict) and isinstance(data.get("checkpoint"), dict):
            data = data["checkpoint"]  # `cgsvc-cli audit checkpoint -o json` output as is
        if not isinstance(data, dict):
            raise CheckpointError("a checkpoint is a JSON object")
        fields = {"origin": str, "tree_size": int, "root_hash": str, "time": str, "key_id": str, "public_key": str,
                  "signature": str}
        for name, kind in fields.items():
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise CheckpointError(f"checkpoint.{name}: expected {kind.__name__}, got {value!r}"[:200])
        cp = cls(**{k: data[k] for k in fields})
        if cp.tree_size < 0:
            raise CheckpointError("checkpoint.tree_size: must not be negative")
        try:
            if len(bytes.fromhex(cp.root_hash)) != 32:
                raise ValueError
        except ValueError:
            raise CheckpointError("checkpoint.root_hash: expected 64 hex digits") from None
        return cp


def key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()


def _raw_public(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_or_create_key(path: str | Path) -> Ed25519PrivateKey:
    """The signing key at path (PEM, PKCS8); created (mode 0600) when the file is absent."""
    path = Path(path)
    valid = "an unencrypted Ed25519 private key in PEM (PKCS8, as `openssl genpkey -algorithm ed25519` writes)"
    if path.exists():
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:  # not PEM, not a key, or encrypted
            raise CheckpointError(f"{path}: cannot read it as {valid}: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise CheckpointError(f"{path}: a {type(key).__name__.removeprefix('_')}, not {valid}")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return key


def sign(key: Ed25519PrivateKey, tree_size: int, root: bytes, time: str, origin: str = ORIGIN) -> Checkpoint:
    public = _raw_public(key)
    unsigned = Checkpoint(origin, tree_size, root.hex(), time, key_id(public),
                          base64.b64encode(public).decode(), "")
    signature = key.sign(unsigned.signed_bytes())
    return Checkpoint(**{**unsigned.to_dict(), "signature": base64.b64encode(signature).decode()})


def shorter(size: int, cp: Checkpoint) -> str:
    """Why a log of `size` records does not hold `cp`'s larger tree."""
    return (f"the log is shorter than the checkpoint ({size} records, the checkpoint has {cp.tree_size}): records "
            "were removed")


def inconsistent(cp: Checkpoint) -> str:
    """Why a log whose tree at `cp`'s size has another root does not hold `cp`'s tree."""
    return (f"inconsistent history: the first {cp.tree_size} records are not the ones the checkpoint signed (a record "
            "was rewritten, or the log forked)")


def verify(cp: Checkpoint, expected_key_id: str = "") -> None:
    """Raise CheckpointError unless the signature verifies under the checkpoint's own public
    key (whose id must match, and match expected_key_id when given)."""
    try:
        public = base64.b64decode(cp.public_key, validate=True)
        signature = base64.b64decode(cp.signature, validate=True)
    except (binascii.Error, ValueError):
        raise CheckpointError("checkpoint: public_key and signature must be base64") from None
    if key_id(public) != cp.key_id:
        raise CheckpointError(f"checkpoint: key_id {cp.key_id[:16]}... is not the hash of its public key")
    if expected_key_id and cp.key_id != expected_key_id:
        raise CheckpointError(f"checkpoint signed by key {cp.key_id[:16]}..., expected {expected_key_id[:16]}...")
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, cp.signed_bytes())
    except (InvalidSignature, ValueError):
        raise CheckpointError("bad signature: the checkpoint was not signed by its key, or was altered") from None
