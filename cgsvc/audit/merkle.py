"""The audit log as a Merkle tree, hashed as RFC 9162 (Certificate Transparency 2.0) does.

    leaf    H(0x00 || entry)            the entry is a record's 32-byte record_hash
    node    H(0x01 || left || right)
    MTH     of n leaves: the root of the left subtree of the largest power of two < n
            leaves, and of the rest (RFC 9162 section 2.1.1)

Pure functions, no I/O: proofs are built from `subtree(level, index)` lookups of complete,
aligned subtrees (the only nodes the tree stores), and verified from nothing but hashes, so
a client holding a signed checkpoint checks a server's answer itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

Hash = bytes
# subtree(level, index) -> the hash of leaves [index * 2**level, (index + 1) * 2**level)
SubtreeLookup = Callable[[int, int], Hash]


def node_position(level: int, index: int) -> int:
    """Where the stored subtree (level, index) sits in the tree's in-order ("flat tree")
    numbering: leaf k at 2k, the subtree over leaves [i * 2**L, (i + 1) * 2**L) at
    i * 2**(L+1) + 2**L - 1. Every node an append completes lies at or just before 2k (a
    level-L node 2**L - 1 back, and those are one in 2**L appends), so stored in this order the
    nodes of a commit land on the last page of their table."""
    return (index << (level + 1)) + (1 << level) - 1


def node_at(position: int) -> tuple[int, int]:
    """(level, index) of the subtree at an in-order position (the inverse of node_position)."""
    odd = position + 1  # 2**level * (2 * index + 1)
    level = (odd & -odd).bit_length() - 1
    return level, (odd >> level) >> 1


def leaf_hash(entry: bytes) -> Hash:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: Hash, right: Hash) -> Hash:
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_hash(start: int, end: int, subtree: SubtreeLookup) -> Hash:
    """MTH of leaves [start, end), where start is aligned to the largest power of two <= end - start."""
    n = end - start
    if n & (n - 1) == 0:  # a complete subtree: stored
        level = n.bit_length() - 1
        return subtree(level, start >> level)
    k = _split(n)
    return node_hash(range_hash(start, start + k, subtree), range_hash(start + k, end, subtree))


def root(size: int, subtree: SubtreeLookup) -> Hash:
    return EMPTY_ROOT if size == 0 else range_hash(0, size, subtree)


def root_of_leaves(leaves: Sequence[Hash]) -> Hash:
    """MTH of leaf hashes given in full (verification from scratch)."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    # Pairing left to right, carrying an odd last node up, gives RFC 9162's tree.
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]


def inclusion_proof(index: int, size: int, subtree: SubtreeLookup) -> list[Hash]:
    """PATH(index, D[0:size]) of RFC 9162 section 2.1.3.1."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    proof: list[Hash] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            proof.append(range_hash(start + k, end, subtree))
            end = start + k
        else:
            proof.append(range_hash(start, start + k, subtree))
            start += k
    return proof[::-1]


def consistency_proof(first: int, second: int, subtree: SubtreeLookup) -> list[Hash]:
    """PROOF(first, D[0:second]) of RFC 9162 section 2.1.4.1."""
    if not 0 < first <= second:
        raise ValueError(f"no consistency proof from size {first} to {second}")
    if first == second:
        return []
    return _subproof(first, 0, second, True, subtree)


def _subproof(m: int, start: int, end: int, whole: bool, subtree: SubtreeLookup) -> list[Hash]:
    n = end - start
    if m == n:
        return [] if whole else [range_hash(start, end, subtree)]
    k = _split(n)
    if m <= k:
        return _subproof(m, start, start + k, whole, subtree) + [range_hash(start + k, end, subtree)]
    return _subproof(m - k, start + k, end, False, subtree) + [range_hash(start, start + k, subtree)]


def verify_inclusion(index: int, size: int, leaf: Hash, proof: Sequence[Hash], expected_root: Hash) -> bool:
    """RFC 9162 section 2.1.3.2."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == expected_root


def verify_consistency(first: int, second: int, first_root: Hash, second_root: Hash,
                       proof: Sequence[Hash]) -> bool:
    """RFC 9162 section 2.1.4.2."""
    if first == second:
        return not proof and first_root == second_root
    if not 0 < first < second or not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # a power of two: the first root is the proof's implicit start
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root


def append_leaves(size: int, frontier: dict[int, Hash], leaves: Sequence[Hash]) -> tuple[
        dict[int, Hash], list[tuple[int, int, Hash]]]:
    """Append leaf hashes to a tree of `size` leaves whose right edge is `frontier` (level ->
    hash of the complete subtree at that level on the right edge, one per set bit of size).
    Returns the new frontier and every complete node made: (level, index, hash), leaves
    included — O(log n) per leaf, nothing read."""
    frontier = dict(frontier)
    made: list[tuple[int, int, Hash]] = []
    for leaf in leaves:
        node, level, index = leaf, 0, size
        made.append((0, index, node))
        while index & 1:  # a right child completes its parent
            node = node_hash(frontier.pop(level), node)
            level, index = level + 1, index >> 1
            made.append((level, index, node))
        frontier[level] = node
        size += 1
    return frontier, made


def root_from_frontier(frontier: dict[int, Hash]) -> Hash:
    """The root of a tree from its right edge: the complete subtrees, folded from the smallest."""
    if not frontier:
        return EMPTY_ROOT
    levels = sorted(frontier)
    r = frontier[levels[0]]
    for level in levels[1:]:
        r = node_hash(frontier[level], r)
    return r
