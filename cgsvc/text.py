"""Words for people, shared by the server's messages and the client's tables."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 record`, `2 records`: a count and its noun, in the number the count asks for."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
