"""`cgsvc-cli completion bash`: the script, loaded in a real bash, completes commands, options
and closed-set values at each level, as a user's TAB would."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cgsvc.resolve.engine import KEYS
from tests.conftest import ROOT
from tests.unit.test_cli_resolve import cli

# After sourcing the script: split the line into COMP_WORDS as bash would, complete the last word.
COMPLETE = r'''
source "$1"
read -ra W <<< "cgsvc-cli $2"
[[ "$2" == *" " || -z "$2" ]] && W+=("")
COMP_WORDS=("${W[@]}"); COMP_CWORD=$((${#W[@]} - 1))
_cgsvc_cli
printf '%s\n' "${COMPREPLY[@]}"
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    proc = cli("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path_factory.mktemp("completion") / "cgsvc-cli.bash"
    path.write_text(proc.stdout)
    return path


def complete(script: Path, line: str) -> list[str]:
    proc = subprocess.run(["bash", "-c", COMPLETE, "_", str(script), line], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


@pytest.mark.parametrize(("line", "expected"), [
    ("", ["resolve", "rules", "models", "version", "completion", "plans", "audit", "launch", "launches", "replicas",
          "policies", "policy", "experiment", "experiments"]),
    ("au", ["audit"]),
    ("audit ", ["list", "summary", "show", "verify", "checkpoint", "prove", "witness", "keys", "evidence"]),
    ("audit list --f", ["--filter", "--follow"]),
    ("resolve -o ", ["table", "json"]),
    ("launches list --output j", ["json"]),
    ("resolve --explain prefill.b", ["prefill.backend"]),
    ("--server 127.0.0.1:1 audit ver", ["verify"]),  # connection options before the command are skipped
    ("audit list --filter x --page-size 5 --a", ["--all"]),  # values skipped, the path kept
    ("plans diff examples/every-field", ["examples/every-field-h200.json"]),  # positional files
    ("resolve --spec examples/kimi-k2.6-gb300", ["examples/kimi-k2.6-gb300-tp4.json"]),  # files where a file goes
])
def test_tab_completes_what_the_parser_accepts(script: Path, line: str, expected: list[str]) -> None:
    assert complete(script, line) == expected


def test_every_explain_field_and_the_zsh_form() -> None:
    out = cli("completion", "bash").stdout
    assert all(key in out for key in KEYS)
    zsh = cli("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert zsh.stdout.endswith(out)
