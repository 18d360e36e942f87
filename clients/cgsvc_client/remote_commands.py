"""Server-side `cgsvc-cli` commands (plans, audit); registered by cli.parser()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def register(sub: Any, add_output: Callable[..., None], add_server: Callable[..., None]) -> None:
    """Add the commands that talk to a server."""
