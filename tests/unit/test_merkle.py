"""The Merkle tree against RFC 9162's (RFC 6962's) published test vectors, and the proofs
against every tree of up to 20 leaves."""

from __future__ import annotations

import hashlib

import pytest

from cgsvc.audit import merkle

# The certificate-transparency test leaves and the roots of their first n (RFC 6962 test data).
LEAVES = [bytes.fromhex(x) for x in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]
ROOTS = ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
         "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
         "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
         "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
         "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
         "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
         "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]
# Known audit paths: (leaf, tree size) -> path, from the same test data.
PATHS = {(0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                  "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                  "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
         (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                  "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                  "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]}
CONSISTENCY = {(6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
               (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]}


def tree(leaves: list[bytes]) -> merkle.SubtreeLookup:
    _, made = merkle.append_leaves(0, {}, [merkle.leaf_hash(x) for x in leaves])
    nodes = {(level, i): h for level, i, h in made}
    return lambda level, i: nodes[(level, i)]


def test_roots_match_the_published_vectors() -> None:
    look = tree(LEAVES)
    assert merkle.root(0, look) == hashlib.sha256(b"").digest()
    for n in range(1, 9):
        assert merkle.root(n, look).hex() == ROOTS[n - 1]
        assert merkle.root_of_leaves([merkle.leaf_hash(x) for x in LEAVES[:n]]).hex() == ROOTS[n - 1]
        frontier, _ = merkle.append_leaves(0, {}, [merkle.leaf_hash(x) for x in LEAVES[:n]])
        assert merkle.root_from_frontier(frontier).hex() == ROOTS[n - 1]


def test_proofs_match_the_published_vectors() -> None:
    look = tree(LEAVES)
    for (leaf, size), path in PATHS.items():
        assert [h.hex() for h in merkle.inclusion_proof(leaf, size, look)] == path
        assert merkle.verify_inclusion(leaf, size, merkle.leaf_hash(LEAVES[leaf]), [bytes.fromhex(h) for h in path],
                                       bytes.fromhex(ROOTS[size - 1]))
    for (first, second), path in CONSISTENCY.items():
        assert [h.hex() for h in merkle.consistency_proof(first, second, look)] == path
        assert merkle.verify_consistency(first, second, bytes.fromhex(ROOTS[first - 1]),
                                         bytes.fromhex(ROOTS[second - 1]), [bytes.fromhex(h) for h in path])


@pytest.mark.parametrize("size", range(1, 21))
def test_every_proof_of_small_trees_verifies_and_detects_a_change(size: int) -> None:
    leaves = [f"record {i}".encode() for i in range(size)]
    look = tree(leaves)
    forged = tree([*leaves[:-1], b"rewritten"])
    for i in range(size):
        proof = merkle.inclusion_proof(i, size, look)
        assert merkle.verify_inclusion(i, size, merkle.leaf_hash(leaves[i]), proof, merkle.root(size, look))
        assert not merkle.verify_inclusion(i, size, merkle.leaf_hash(b"other"), proof, merkle.root(size, look))
    for first in range(1, size + 1):
        proof = merkle.consistency_proof(first, size, look)
        assert merkle.verify_consistency(first, size, merkle.root(first, look), merkle.root(size, look), proof)
        if first < size:  # a history whose last record was rewritten does not extend the first tree's... root
            assert not merkle.verify_consistency(first, size, merkle.root(first, look), merkle.root(size, forged),
                                                 proof)


def test_node_positions_are_the_in_order_numbering_and_invert() -> None:
    """Leaf k sits at 2k, a subtree between its halves; every node an append completes is at or
    just before 2k (what keeps a commit's nodes on the last page of their table)."""
    assert [merkle.node_position(0, k) for k in range(4)] == [0, 2, 4, 6]
    assert merkle.node_position(1, 0) == 1 and merkle.node_position(1, 1) == 5 and merkle.node_position(2, 0) == 3
    seen = set()
    for level in range(12):
        for idx in range(64):
            pos = merkle.node_position(level, idx)
            assert merkle.node_at(pos) == (level, idx)
            seen.add(pos)
    assert len(seen) == 12 * 64  # no two subtrees share a position
    frontier: dict[int, bytes] = {}
    for k in range(300):  # the nodes that appending leaf k stores lie within 2**level of 2k
        frontier, made = merkle.append_leaves(k, frontier, [hashlib.sha256(str(k).encode()).digest()])
        assert {merkle.node_position(lv, i) for lv, i, _ in made} == \
            {2 * k + 1 - (1 << lv) for lv in range(12) if (k + 1) % (1 << lv) == 0}
