"""Words for people, shared by the server's messages and the client's tables."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 record`, `2 records`, `2 launches`: a count and its noun, in the number the count asks
    for (`plural` where English does not add -s, -es after a hiss (s, x, z, ch, sh) or -ies for a
    consonant's -y)."""
    if n == 1:
        return f"{n} {noun}"
    if not plural and noun[-1:] == "y" and noun[-2:-1] not in tuple("aeiou"):
        plural = noun[:-1] + "ies"  # policy, policies; but key, keys
    return f"{n} {plural or noun + ('es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's')}"
