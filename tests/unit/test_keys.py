"""Key rotations: a change of the log's key counts only when the key it retires signed it, and a
client follows a chain of them from the key it kept to the key of today's checkpoint."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cgsvc.audit import keys
from cgsvc.audit.checkpoint import CheckpointError

ROOT = bytes(range(32))


def numbered(rot: keys.Rotation, sequence: int) -> keys.Rotation:
    """As a client reads it back: from the record's own JSON, with its sequence."""
    return keys.Rotation.from_record(sequence, rot.to_json())


def test_a_rotation_signed_by_the_old_key_checks_and_round_trips_through_its_record() -> None:
    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    rot = numbered(keys.rotate(a, b, 7, ROOT, "2026-12-05T00:00:00.000000Z"), 8)
    keys.check(rot)
    assert (rot.previous_key_id, rot.key_id, rot.record) == (keys.own_key_id(a), keys.own_key_id(b), "auditRecords/8")
    assert rot.endorsement is not None and rot.endorsement["tree_size"] == 7
    assert keys.chain([rot], keys.own_key_id(a), keys.own_key_id(b)) == [rot]


@pytest.mark.parametrize("forgery", ["tree_size", "new_key", "signer", "previous_public_key", "replaced"])
def test_a_rotation_the_old_key_did_not_sign_is_refused(forgery: str) -> None:
    a, b, mallory = (Ed25519PrivateKey.generate() for _ in range(3))
    rot = keys.rotate(a, b, 7, ROOT, "2026-12-05T00:00:00.000000Z")
    assert rot.endorsement is not None
    if forgery == "tree_size":  # the handover claims another tree than the one signed
        rot = dataclasses.replace(rot, endorsement={**rot.endorsement, "tree_size": 9})
    elif forgery == "new_key":  # the signature is genuine, for another successor
        rot = dataclasses.replace(rot, key_id=keys.own_key_id(mallory), public_key=keys.public_b64(mallory))
    elif forgery == "signer":  # signed by someone else, claiming to be the old key
        forged = keys.rotate(mallory, b, 7, ROOT, "2026-12-05T00:00:00.000000Z")
        rot = dataclasses.replace(rot, endorsement=forged.endorsement)
    elif forgery == "previous_public_key":  # the signer's own public key under the old key's id
        forged = keys.rotate(mallory, b, 7, ROOT, "2026-12-05T00:00:00.000000Z")
        rot = dataclasses.replace(forged, previous_key_id=keys.own_key_id(a))
    else:  # the lost-key statement: nothing vouches
        rot = keys.replace(keys.own_key_id(a), b)
    rot = numbered(rot, 5)
    with pytest.raises(CheckpointError) as err:
        keys.chain([rot], keys.own_key_id(a), rot.key_id)
    expected = {"tree_size": "is not signed by the key it retires", "new_key": "is not signed by the key it retires",
                "signer": "is not signed by the key it retires",
                "previous_public_key": "key ids are not the hashes of its public keys",
                "replaced": "without its signature"}[forgery]
    assert expected in str(err.value) and "auditRecords/5" in str(err.value)


def test_a_chain_of_rotations_is_followed_past_rotations_of_other_keys() -> None:
    a, b, c, x = (Ed25519PrivateKey.generate() for _ in range(4))
    ab = numbered(keys.rotate(a, b, 3, ROOT, "t1"), 4)
    xa = numbered(keys.rotate(x, a, 1, ROOT, "t0"), 2)  # before a: not on the way from a
    bc = numbered(keys.rotate(b, c, 9, ROOT, "t2"), 10)
    ids = {k: keys.own_key_id(v) for k, v in {"a": a, "b": b, "c": c, "x": x}.items()}
    assert keys.chain([xa, ab, bc], ids["a"], ids["c"]) == [ab, bc]
    assert keys.chain([xa, ab, bc], ids["b"], ids["c"]) == [bc]
    assert keys.chain([xa, ab, bc], ids["c"], ids["c"]) == []
    with pytest.raises(CheckpointError, match=f"no rotation signed by the checkpoint's key {ids['c'][:16]}"):
        keys.chain([xa, ab, bc], ids["c"], ids["a"])  # no way back to an older key


@pytest.mark.parametrize("body", ["not json", "[]", json.dumps({"reason": "rotated"}),
                                  json.dumps({"reason": "stolen", "key_id": "", "public_key": "", "previous_key_id": "",
                                              "previous_public_key": ""})])
def test_a_record_that_is_not_a_rotation_is_named(body: str) -> None:
    with pytest.raises(ValueError, match="auditRecords/3"):
        keys.Rotation.from_record(3, body)
