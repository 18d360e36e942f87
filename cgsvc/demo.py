"""The main job of the quick start (`make demo`): resolve the Kimi-K2.6 / 4xGB300 TP4 example
and print its plan and decision trail."""

from __future__ import annotations

import sys
from pathlib import Path

from cgsvc_client import cli

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kimi-k2.6-gb300-tp4.json"


def main() -> int:
    print(f"== resolving {EXAMPLE.name} in-process ==", flush=True)
    return cli.main(["resolve", "--spec", str(EXAMPLE), "--output", "table"])


if __name__ == "__main__":
    sys.exit(main())
