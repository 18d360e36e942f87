"""`cgsvc-cli`: resolve and explain plans, in-process or against a cgsvc server.

    cgsvc-cli resolve --spec FILE.json [--output table|json] [--explain FIELD] [--server HOST:PORT]
    cgsvc-cli resolve --model nvidia/Kimi-K2.6-NVFP4 --gpu GB300 --gpus 4 --tp 4
    cgsvc-cli rules [--output table|json]

Exit codes: 0 success; 2 the spec was refused (INVALID_ARGUMENT / FAILED_PRECONDITION);
1 any other failure (server unreachable, ...). JSON output is `{"plan": ...}` or
`{"error": {"code", "message", "field_violations"}}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cgsvc.errors import FieldViolation, ResolveError
from cgsvc.plan import Plan
from cgsvc_client import render

REFUSAL_CODES = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")


class CliError(Exception):
    """A failure to report as {"error": ...} with an exit code."""

    def __init__(self, error: dict[str, Any], exit_code: int) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
        self.exit_code = exit_code

    @classmethod
    def from_resolve(cls, exc: ResolveError) -> CliError:
        return cls(exc.to_dict(), 2 if exc.code in REFUSAL_CODES else 1)


# Convenience flags: (flag, spec path, type).
SPEC_FLAGS: tuple[tuple[str, tuple[str, ...], type, str], ...] = (
    ("--model", ("model", "name"), str, "catalog id or hub repo id"),
    ("--model-path", ("model", "path"), str, "checkpoint directory with config.json"),
    ("--gpu", ("hardware", "gpu"), str, "GPU name, e.g. GB300, H200, cpu"),
    ("--gpus", ("hardware", "gpu_count"), int, "GPUs per node"),
    ("--nodes", ("hardware", "nodes"), int, "nodes"),
    ("--tp", ("parallelism", "tp"), int, "tensor parallel size"),
    ("--pp", ("parallelism", "pp"), int, "pipeline parallel size"),
    ("--prefill-graph", ("overrides", "cuda_graph", "prefill", "backend"), str,
     "explicit prefill graph backend (locks it)"),
    ("--decode-graph", ("overrides", "cuda_graph", "decode", "backend"), str,
     "explicit decode graph backend (locks it)"),
    ("--attention-backend", ("overrides", "attention_backend"), str, "explicit attention backend"),
    ("--kv-cache-dtype", ("features", "kv_cache_dtype"), str, "KV cache dtype"),
)


def build_spec(ns: argparse.Namespace) -> dict[str, Any]:
    """The spec dict from --spec FILE (if any) with the convenience flags layered on top."""
    spec: Any = {}
    if ns.spec:
        try:
            with open(ns.spec, encoding="utf-8") as fh:
                spec = json.load(fh)
        except OSError as exc:
            raise CliError.from_resolve(ResolveError.invalid(
                [FieldViolation("spec", f"cannot read {ns.spec!r}: {exc.strerror}")])) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CliError.from_resolve(ResolveError.invalid(
                [FieldViolation("spec", f"malformed JSON in {ns.spec!r}: {exc}")])) from None
        if not isinstance(spec, dict):
            raise CliError.from_resolve(ResolveError.invalid(
                [FieldViolation("spec", "must be a JSON object")]))
    for flag, path, _typ, _help in SPEC_FLAGS:
        value = getattr(ns, flag.lstrip("-").replace("-", "_"), None)
        if value is None:
            continue
        node = spec
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    if getattr(ns, "enforce_piecewise", False):
        spec.setdefault("overrides", {})["enforce_piecewise_cuda_graph"] = True
    if getattr(ns, "disable_cuda_graph", False):
        spec.setdefault("overrides", {})["disable_cuda_graph"] = True
    return spec


def resolve_offline(spec: dict[str, Any]) -> Plan:
    from cgsvc.resolve import resolve
    from cgsvc.spec import parse_spec

    try:
        return resolve(parse_spec(spec))
    except ResolveError as exc:
        raise CliError.from_resolve(exc) from None


def cmd_resolve(ns: argparse.Namespace) -> int:
    spec = build_spec(ns)
    if ns.server:
        from cgsvc_client.client import Client

        with Client.from_args(ns) as client:
            plan = client.resolve(spec)
    else:
        plan = resolve_offline(spec)
    if render.output_mode(ns) == "json":
        if ns.explain:
            render.print_json({"explain": {"field": ns.explain,
                                     "decisions": [d.to_dict() for d in plan.decisions_for(ns.explain)]}})
        else:
            render.print_json({"plan": plan.to_dict()})
    else:
        print(render.plan_table(plan, render.Style(sys.stdout.isatty()), ns.explain))
    return 0


def cmd_rules(ns: argparse.Namespace) -> int:
    from cgsvc.resolve import policy_version
    from cgsvc.resolve.policy import RULES

    rules = [r.describe() for r in RULES]
    if render.output_mode(ns) == "json":
        render.print_json({"policy_version": policy_version(), "rules": rules})
    else:
        print(f"policy {policy_version()}: {len(rules)} rules, in evaluation order")
        print(render.table(["stage", "rule", "hardness", "writes", "reason"],
                           [(r["stage"], r["id"], r["hardness"], ",".join(r["writes"]) or "(warning)",
                             r["reason"]) for r in rules]))
    return 0


def add_spec_flags(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """--spec FILE and the convenience flags that build or amend a spec."""
    p.add_argument("--spec", help="launch spec JSON file (DESIGN.md form)")
    for flag, _path, typ, help_text in SPEC_FLAGS:
        if flag not in exclude:
            p.add_argument(flag, type=typ, help=help_text)
    p.add_argument("--enforce-piecewise", action="store_true", help="set enforce_piecewise_cuda_graph")
    p.add_argument("--disable-cuda-graph", action="store_true", help="set disable_cuda_graph")


def add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("table", "json"),
                   help="table (default on a terminal) or json (default otherwise)")


def add_server(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--server", required=required, help="HOST:PORT of a cgsvc server")
    p.add_argument("--token", help="bearer token (or set CGSVC_TOKEN)")
    p.add_argument("--tls-ca", help="CA certificate (PEM) to verify the server; enables TLS")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", help="client key (PEM) for mutual TLS")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline per call, seconds")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cgsvc-cli", description="Resolve, explain and audit CUDA-graph plans.")
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("resolve", help="resolve a launch spec into a plan")
    add_spec_flags(r)
    r.add_argument("--explain", metavar="FIELD", help="only the decisions that shaped FIELD, e.g. prefill.backend")
    add_output(r)
    add_server(r)
    r.set_defaults(func=cmd_resolve)

    rl = sub.add_parser("rules", help="list the policy's rule table")
    add_output(rl)
    rl.set_defaults(func=cmd_rules)

    from cgsvc_client import launch_commands, remote_commands

    remote_commands.register(sub, add_output, add_server)
    launch_commands.register(sub, add_output, add_server, lambda p: add_spec_flags(p, exclude=("--model-path",)))
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = ns.func
    try:
        try:
            return func(ns)
        except ResolveError as err:  # a server's refusal or failure, decoded by the client
            raise CliError.from_resolve(err) from None
    except CliError as exc:
        if render.output_mode(ns) == "json":
            render.print_json({"error": exc.error})
        else:
            print(render.error_text(exc.error, render.Style(sys.stderr.isatty())), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
