"""Words for people, shared by the server's messages and the client's tables."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 record`, `2 records`, `2 launches`: a count and its noun, in the number the count asks
    for (`plural` where English does not add -s, or -es after a hiss: s, x, z, ch, sh)."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or noun + ('es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's')}"
