"""`cgsvc-cli completion bash|zsh`: a shell completion script made from the parser itself, so it
names every command, option and closed-set value the CLI has, and cannot fall behind it.

The script holds three tables keyed by command path (`cgsvc-cli audit list`): the subcommands, the
options, and the values of options with a closed set (`-o`: table, json). At a TAB it walks the
words typed so far to find the path (skipping each option's value), then offers an option's
values, the path's options (after `-`), its subcommands, or file names.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator


def _walk(p: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, p
    for action in p._actions:  # noqa: SLF001 - argparse has no public way to list a parser's actions
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def _entry(table: str, key: str, words: list[str]) -> str:
    return f"{table}[{shlex.quote(key)}]={shlex.quote(' '.join(words))}"


def bash_script(p: argparse.ArgumentParser, explain_fields: tuple[str, ...] = ()) -> str:
    """The completion function for `p.prog`, for bash (4 or later) and zsh's bashcompinit."""
    fn = "_" + p.prog.replace("-", "_")
    subs, opts, values = [], [], []
    for path, parser in _walk(p, p.prog):  # bash refuses an empty key: the root's path is the program
        commands: list[str] = []
        options: list[str] = []
        for action in parser._actions:  # noqa: SLF001
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                commands += list(action.choices)
                continue
            options += [o for o in action.option_strings if o.startswith("--") or len(action.option_strings) == 1]
            if action.option_strings and action.nargs != 0:
                choices = list(action.choices or ()) or list(explain_fields if action.dest == "explain" else ())
                for o in action.option_strings:  # an option that takes a value: its value is not a command
                    values.append(_entry(f"{fn}_values", f"{path}|{o}", [str(c) for c in choices] or ["@"]))
        subs.append(_entry(f"{fn}_commands", path, commands))
        opts.append(_entry(f"{fn}_options", path, options))
    lines = [
        f"# {p.prog} completion for bash; zsh: autoload -U +X bashcompinit && bashcompinit first.",
        f"# Load it with: source <({p.prog} completion bash)",
        f"declare -gA {fn}_commands {fn}_options {fn}_values",
        *subs, *opts, *values,
        f"{fn}() {{",
        f'  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" path={p.prog} i w',
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    w="${COMP_WORDS[i]}"',
        f'    if [[ -n "${{{fn}_values[$path|$w]+x}}" ]]; then ((i++)); continue; fi',
        f'    if [[ " ${{{fn}_commands[$path]}} " == *" $w "* ]]; then path="$path $w"; fi',
        "  done",
        f'  local vals="${{{fn}_values[$path|$prev]-}}"',
        '  if [[ -n "$vals" ]]; then',
        '    if [[ "$vals" == "@" ]]; then COMPREPLY=($(compgen -f -- "$cur")); '
        'else COMPREPLY=($(compgen -W "$vals" -- "$cur")); fi',
        "    return",
        "  fi",
        '  if [[ "$cur" == -* ]]; then',
        f'    COMPREPLY=($(compgen -W "${{{fn}_options[$path]}}" -- "$cur"))',
        f'  elif [[ -n "${{{fn}_commands[$path]}}" ]]; then',
        f'    COMPREPLY=($(compgen -W "${{{fn}_commands[$path]}}" -- "$cur"))',
        "  else",
        '    COMPREPLY=($(compgen -f -- "$cur"))',
        "  fi",
        "}",
        f"complete -o filenames -F {fn} {p.prog}",
    ]
    return "\n".join(lines) + "\n"


def zsh_script(p: argparse.ArgumentParser, explain_fields: tuple[str, ...] = ()) -> str:
    return "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(p, explain_fields)
