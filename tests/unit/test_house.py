"""The house documents itself and keeps its dependencies pointing one way: every option of
every command has a help line, nothing points outside the repository, the domain layer never
imports the RPC layer, and the workers reach the server only through the contract."""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _parsers(ap: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, ap)]
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from cgsvc_client import cli as client_cli
    from cgsvc_worker import cli as worker_cli

    from cgsvc.server import main as server_main

    server = server_main.main.__globals__["argparse"].ArgumentParser  # noqa: F841 - the module builds its parser inline
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: object, **k: object) -> argparse.Namespace:
        captured.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment,method-assign]
    try:
        with pytest.raises(SystemExit):
            server_main.main(["serve"])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return (_parsers(client_cli.parser(), "cgsvc-cli") + _parsers(worker_cli.parser(), "cgsvc-worker")
            + _parsers(captured[0], "cgsvc"))


def test_every_option_of_every_command_has_a_help_line() -> None:
    missing = []
    for path, parser in _commands():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without a help line: {missing}"


def test_nothing_points_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    hits = []
    for name in tracked:
        if not name.endswith((".py", ".md", ".toml", ".proto", ".yaml", ".json", "Makefile")):
            continue
        text = (ROOT / name).read_text(errors="replace")
        for needle in ("../shared", "shared/DESIGN.md", "shared/RULES.md", "DESIGN.md", "RULES.md"):
            if needle in text and name != "tests/unit/test_house.py":
                hits.append(f"{name}: {needle}")
    assert not hits, hits


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_dependencies_point_one_way() -> None:
    for path in (ROOT / "cgsvc" / "domain").glob("*.py"):
        bad = {n for n in _imports(path) if n.startswith(("cgsvc.server", "grpc", "cgsvc.v1"))}
        assert not bad, f"{path.name} (domain) imports the RPC layer: {bad}"
    # the contract and what it imports (cgsvc.files, the one way a file is replaced whole) use the
    # standard library only: both sides import it, and it must drag neither side in
    for leaf, allowed in (("contract.py", {"cgsvc.files"}), ("files.py", set())):
        names = _imports(ROOT / "cgsvc" / leaf) - allowed
        assert not {n for n in names if n.startswith(("torch", "grpc", "cgsvc"))}, (leaf, names)
    for path in (ROOT / "workers" / "cgsvc_worker").glob("*.py"):
        server_side = {n for n in _imports(path) if n.startswith("cgsvc.")
                       and n not in ("cgsvc.contract", "cgsvc.catalog", "cgsvc.errors")}
        assert not server_side, f"workers/{path.name} reaches past the contract: {server_side}"
    for path in (ROOT / "clients" / "cgsvc_client").glob("*.py"):
        if path.name != "cli.py":
            assert "cgsvc_client.cli" not in _imports(path), f"{path.name} imports the top-level cli"
