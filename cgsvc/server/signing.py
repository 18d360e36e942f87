"""Which key signs this log's checkpoints, settled at start.

A log has one signing key at a time, whichever replica answers: a witness that got a checkpoint
of one key and then one of another from the same log must be able to tell a rotation from a
forgery. So the database names the log's key (`signing_keys`), a server whose key is not that
one does not start (naming both keys and the ways on), and a change of key is a record of the
log signed by the key it retires (`--previous-signing-key`; cgsvc/audit/keys.py), or, when the
old key is lost, an unendorsed record the operator asked for (`--replace-lost-signing-key`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cgsvc.audit import keys
from cgsvc.audit.auditor import Auditor
from cgsvc.audit.records import utc_now
from cgsvc.audit.store import AuditStore


class SigningKeyError(ValueError):
    """This server cannot sign for this log as configured; the message says what would do."""


@dataclass(frozen=True)
class Settled:
    key_id: str
    generation: int
    rotation: keys.Rotation | None  # the one this start made, if any
    since: str  # for the start-up line: how the key came to be the log's

    def line(self) -> str:
        return f"audit checkpoints signed with Ed25519 key {self.key_id} ({self.since})"


async def settle(store: AuditStore, auditor: Auditor, key: Ed25519PrivateKey,
                 previous: Ed25519PrivateKey | None = None, replace_lost: bool = False) -> Settled:
    """Make sure `key` is the log's key, rotating to it when asked; SigningKeyError otherwise."""
    ours, public = keys.own_key_id(key), keys.public_b64(key)
    for _ in range(5):  # another replica may name or rotate the key between our read and our write
        current = await asyncio.to_thread(store.log_key)
        if current is None:
            if await asyncio.to_thread(store.add_log_key, 1, ours, public, 0):
                return Settled(ours, 1, None, "the first key of this log")
            continue
        generation, log_id, sequence = current
        if log_id == ours:
            since = f"the log's key since auditRecords/{sequence}" if sequence else "the log's first key"
            return Settled(ours, generation, None, since)
        if previous is not None:
            retiring = keys.own_key_id(previous)
            if retiring != log_id:
                raise SigningKeyError(not_the_retiring_key(retiring, log_id))
            size, root = await asyncio.to_thread(store.tree_head)
            rotation = keys.rotate(previous, key, size, root, utc_now())
            message = (f"signing key {ours} replaces {log_id}, endorsed by it over the tree of {size} records "
                       "(--previous-signing-key)")
        elif replace_lost:
            rotation = keys.replace(log_id, key)
            message = (f"signing key {ours} replaces {log_id} WITHOUT its endorsement: the operator declared the "
                       "old key lost (--replace-lost-signing-key)")
        else:
            raise SigningKeyError(not_the_logs_key(log_id, generation, ours))
        result = await auditor.append(auditor.entry(keys.METHOD, "cgsvc", "", "", "", None, "OK", message,
                                                    spec_json=rotation.to_json()))
        sequence = result.record.sequence
        if await asyncio.to_thread(store.add_log_key, generation + 1, ours, public, sequence):
            done = dataclasses.replace(rotation, sequence=sequence)
            how = "rotated" if rotation.reason == keys.ROTATED else "replaced unendorsed"
            return Settled(ours, generation + 1, done, f"{how} at auditRecords/{sequence}")
        # another replica rotated at the same moment: look again (its rotation may be to our key)
    raise SigningKeyError("signing_key: the log's key kept changing while this server started; start it again")


def not_the_logs_key(log_id: str, generation: int, ours: str) -> str:
    """Why a server whose key is `ours` does not start on a log signed by `log_id`, and the ways on."""
    return (f"signing_key: this log's checkpoints are signed by key {log_id} (generation {generation}), and this "
            f"server's key is {ours}. Replicas of one log share one key: give the log's key with "
            "--signing-key; to rotate to this key, also give the old one with --previous-signing-key; if the "
            "old key is lost, --replace-lost-signing-key records the change unendorsed (witnesses then refuse it)")


def not_the_retiring_key(retiring: str, log_id: str) -> str:
    """Why --previous-signing-key `retiring` cannot endorse a rotation of a log signed by `log_id`."""
    return (f"previous_signing_key: its key {retiring} is not this log's key {log_id}; give the key the log's "
            "checkpoints are signed with now (`cgsvc-cli audit checkpoint` prints its key_id)")


def still_ours(store: AuditStore, key_id: str) -> str:
    """'' when `key_id` still signs this log; otherwise why this server must not sign (a replica
    that kept the old key after another rotated)."""
    current = store.log_key()
    if current is None or current[1] == key_id:
        return ""
    generation, log_id, sequence = current
    return (f"this server's signing key {key_id[:16]}... no longer signs this log: key {log_id[:16]}... replaced it "
            f"at auditRecords/{sequence} (generation {generation}); restart this server with the log's key")
