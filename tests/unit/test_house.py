"""The house documents itself and keeps its dependencies pointing one way: every option of
every command has a help line, nothing points outside the repository, the domain layer never
imports the RPC layer, and the workers reach the server only through the contract."""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

from tests.conftest import ROOT


def _parsers(ap: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, ap)]
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def _programs() -> dict[str, argparse.ArgumentParser]:
    from cgsvc_client import cli as client_cli
    from cgsvc_worker import cli as worker_cli

    from cgsvc.server import main as server_main

    return {"cgsvc-cli": client_cli.parser(), "cgsvc-worker": worker_cli.parser(), "cgsvc": server_main.parser()}


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    return [one for name, ap in _programs().items() for one in _parsers(ap, name)]


def test_every_option_of_every_command_has_a_help_line() -> None:
    missing = []
    for path, parser in _commands():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without a help line: {missing}"


def _before_redirection(line: str) -> str:
    """A shell line up to its first pipe or redirection outside quotes (a filter's > is not one)."""
    import re

    pieces = re.split(r"('[^']*'|\"[^\"]*\")", line)  # the odd ones quoted
    for i in range(0, len(pieces), 2):
        if cut := re.search(r" \| | > | < | <<< | 2>", pieces[i]):
            return "".join(pieces[:i]) + pieces[i][:cut.start()]
    return line


def _documented_command_lines() -> list[tuple[str, str, str, list[str]]]:
    """(file, line, program, argv) of every cgsvc, cgsvc-cli and cgsvc-worker command in a code
    block of the README and docs/, as a reader would type it: continuation lines joined, a
    trailing comment, pipe or redirection cut, and the docs' placeholders read as values (`$S`,
    `...`, `show|cancel` is `show`, `[--server ADDR]` is `--server ADDR`)."""
    import re
    import shlex

    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                m = re.match(r"^\s*(?:\S+\s*\|\s*)?(?:\.venv/bin/)?(cgsvc-cli|cgsvc-worker|cgsvc)\s+(.*)$", line)
                if not m:
                    continue
                rest = re.split(r"\s#(?:\s|$)", m[2])[0]
                rest = _before_redirection(rest)
                rest = re.sub(r"\$\(?\{?([A-Za-z_]+)\}?\)?", r"X\1", rest)
                words = [word for word in shlex.split(rest) if word not in ("[", "]", "&")]
                out.append((doc.name, line.strip(), m[1], [
                    word.split("|")[0] if re.fullmatch(r"[a-z-]+(\|[a-z-]+)+", word) else
                    "X" if word == "..." else word.strip("[]") for word in words]))
    return out


def test_every_documented_command_line_parses() -> None:
    """A command copied from the README or docs/ is one the programs take: its command, options
    and their values as the parsers read them (what it then does is the other tests' matter)."""
    import contextlib
    import io

    from cgsvc_client.cli import hoist_leading_options

    programs, lines, wrong = _programs(), _documented_command_lines(), []
    assert len(lines) > 60, "the docs' command lines were not found"
    for doc, line, program, argv in lines:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                programs[program].parse_args(hoist_leading_options(argv))
        except SystemExit as exc:
            if exc.code not in (0, None):
                wrong.append(f"{doc}: {line}: {said.getvalue().strip().splitlines()[-1:]}")
        except Exception as exc:  # noqa: BLE001 - the client's parser raises its usage errors
            wrong.append(f"{doc}: {line}: {exc}")
    assert not wrong, "\n".join(wrong)


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


def test_the_storage_doc_names_the_schema_version_the_code_migrates_to() -> None:
    """docs/audit.md said "schema version 12" six migrations after 12."""
    from cgsvc.audit.store import MIGRATIONS

    latest = MIGRATIONS[-1][0]
    assert f"schema version {latest} " in (ROOT / "docs" / "audit.md").read_text(), latest


def test_the_filter_reference_names_every_field_each_collection_filters_on() -> None:
    """docs/filters.md is the filter language's reference: a field a store takes but the page
    does not name is one nobody will find."""
    import re

    from cgsvc.audit.store import AUDIT_FILTER_FIELDS, PLAN_FILTER_FIELDS
    from cgsvc.launch.store import EXPERIMENT_FILTER_FIELDS, LAUNCH_FILTER_FIELDS

    text = (ROOT / "docs" / "filters.md").read_text()
    sections = dict(re.findall(r"\*\*(Plans|Audit records|Launches|Experiments)\*\*(.*?)(?=\n\*\*|\n## )", text, re.S))
    for section, fields in (("Plans", PLAN_FILTER_FIELDS), ("Audit records", AUDIT_FILTER_FIELDS),
                            ("Launches", LAUNCH_FILTER_FIELDS), ("Experiments", EXPERIMENT_FILTER_FIELDS)):
        named = set(re.findall(r"`([a-zA-Z0-9_.]+)`", sections[section]))
        missing = {"labels.KEY" if f == "labels" else f for f in fields} - named
        assert not missing, (section, missing)
