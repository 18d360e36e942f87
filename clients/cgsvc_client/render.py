"""Human-readable rendering of plans, errors and lists for `cgsvc-cli --output table`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cgsvc.contract import EngineSettings
from cgsvc.plan import Decision, Plan
from cgsvc.text import counted

BOLD, RED, YELLOW, DIM, RESET = "\033[1m", "\033[31m", "\033[33m", "\033[2m", "\033[0m"


def output_mode(ns: argparse.Namespace) -> str:
    """--output, else table on a terminal and json otherwise."""
    return str(getattr(ns, "output", None) or ("table" if sys.stdout.isatty() else "json"))


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


class Style:
    """ANSI styling, switched off when the output is not a terminal."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if self.color else text


def engine_text(e: Any) -> str:
    """Engine settings on one line: "dtype auto, KV cache 8 MiB a rank, CPU decode eager"; `e` an
    EngineSettings message (a launch from a server before them has none: every default) or the
    dict an experiment's JSON holds."""
    return EngineSettings.read(e).text()


def mib(n: int) -> str:
    """Bytes as MiB, as a person reads a budget: "8 MiB", "1536.5 MiB"."""
    return f"{n / (1 << 20):.6g} MiB"


def workload_text(w: Any) -> str:
    """A workload on one line: "2 requests x 8 in / 4 out, concurrency 1, seed 0"; `w` a
    LaunchWorkload message, or the dict an experiment's JSON holds (an absent field is 0)."""
    v = w if isinstance(w, Mapping) else {k: getattr(w, k) for k in ("requests", "input_len", "output_len",
                                                                        "concurrency", "seed")}
    concurrency = v.get("concurrency", 0) or "all"  # 0: every request in flight at once
    return (f"{counted(v.get('requests', 0), 'request')} x {v.get('input_len', 0)} in / {v.get('output_len', 0)} "
            f"out, concurrency {concurrency}, seed {v.get('seed', 0)}")


def _sizes(values: Sequence[int]) -> str:
    if not values:
        return "-"
    if len(values) <= 8:
        return ", ".join(map(str, values))
    return f"{', '.join(map(str, values[:4]))}, ..., {', '.join(map(str, values[-2:]))} ({len(values)} sizes)"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table with a header rule."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(out)


def fields(rows: Sequence[tuple[str, str]], style: Style | None = None) -> str:
    """One resource's fields as aligned `name  value` lines, the names bold on a terminal."""
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{style(k.ljust(width), BOLD) if style else k.ljust(width)}  {v}".rstrip() for k, v in rows)


def stdout_closed() -> None:
    """The reader of standard output (`| head`) closed the pipe: nothing more goes to it, and no
    second error at exit's flush."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def page(headers: Sequence[str], rows: Sequence[Sequence[Any]], next_page_token: str, what: str,
         query: str = "") -> str:
    """One page of a List call as a table, with the token for the next page when there is one;
    a page with nothing on it says so, with the filter it was asked with (`what`: "launches")."""
    if not rows:
        return f"no {what} match {query}" if query else f"no {what}"
    out = table(headers, rows)
    same = " (with the same --filter, --since and --newest-first: a token is bound to them)"
    return out + (f"\n\nnext page: --page-token {next_page_token}{same}" if next_page_token else "")


def plan_table(plan: Plan, style: Style, explain: str | None = None) -> str:
    """The plan, then the decision trail with rule ids and reasons; locked keys marked with *."""
    locked = set(plan.locked)

    def mark(key: str) -> str:
        return style(" *locked", BOLD) if key in locked else ""

    decisions: Sequence[Decision]
    if explain is not None:
        decisions = plan.decisions_for(explain)
        head = f"decisions for {explain}:"
        if not decisions:
            return f"{head} none (no rule wrote or considered this field)"
    else:
        decisions = plan.decisions
        rows = [
            ("attention (prefill / decode)", f"{plan.attention_prefill}{mark('attention_backend.prefill')} / "
                                             f"{plan.attention_decode}{mark('attention_backend.decode')}"),
            ("prefill graph", plan.prefill_backend + mark("prefill.backend")),
            ("  max_num_tokens", f"{plan.prefill_max_num_tokens or '-'}" + mark("prefill.max_num_tokens")),
            ("  num_tokens", _sizes(plan.prefill_num_tokens) + mark("prefill.num_tokens")),
            ("decode graph", plan.decode_backend + mark("decode.backend")),
            ("  max_bs", f"{plan.decode_max_bs or '-'}" + mark("decode.max_bs")),
            ("  bs", _sizes(plan.decode_bs) + mark("decode.bs")),
            ("kv_cache_dtype", plan.kv_cache_dtype + mark("kv_cache_dtype")),
            ("chunked_prefill_size", f"{plan.chunked_prefill_size}" + mark("chunked_prefill_size")),
            ("estimates", f"{plan.estimates.graphs} graphs, "
                          f"{plan.estimates.capture_memory_bytes / 2**20:.1f} MiB, "
                          f"{plan.estimates.capture_seconds:.2f} s capture"),
            ("policy / plan", f"{plan.policy} {plan.policy_version} / {plan.plan_hash[:16]}"),
        ]
        head = fields(rows, style)
        head += "\n\n" + style("decision trail", BOLD) + " (* = forced: a lock kept the explicit value)"
    trail = table(
        ["#", "rule", "field", "before -> after", "source", "reason"],
        [(d.seq, d.rule_id + ("*" if d.forced else ""), d.field,
          f"{_short(d.before) or '-'} -> {_short(d.after) or '-'}", d.source, d.reason)
         for d in decisions])
    out = f"{head}\n{trail}"
    if plan.warnings and explain is None:
        out += "\n\n" + "\n".join(style(f"WARNING [{w.rule_id}] {w.message}", YELLOW) for w in plan.warnings)
    return out


def _short(value: str) -> str:
    if value.startswith("[") and value.count(",") > 6:
        items = value.strip("[]").split(",")
        return f"[{items[0]},{items[1]},...,{items[-1]}] ({len(items)})"
    return value


def error_text(err: dict[str, Any], style: Style) -> str:
    lines = [style(f"error: {err['code']}: {err['message']}", RED)]
    for v in err.get("field_violations", []):
        lines.append(f"  {v['field']}: {v['description']}")
    return "\n".join(lines)
