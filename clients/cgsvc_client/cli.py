"""`cgsvc-cli`: resolve and explain plans, in-process or against a cgsvc server.

    cgsvc-cli resolve --spec FILE.json [--policy NAME] [--output table|json] [--explain FIELD] [--server HOST:PORT]
    cgsvc-cli resolve --model nvidia/Kimi-K2.6-NVFP4 --gpu GB300 --gpus 4 --tp 4
    cgsvc-cli rules [--policy NAME] [--output table|json]
    cgsvc-cli policies [--server HOST:PORT]
    cgsvc-cli models [--server HOST:PORT] [--output table|json]

Exit codes: EXIT_CODES below (also in `cgsvc-cli --help`). JSON output is `{"plan": ...}` or
`{"error": {"code", "message", "field_violations"}}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cgsvc import __version__
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc_client import evidence_commands, launch_commands, remote_commands, render
from cgsvc_client.args import (
    INTERRUPTED,
    CliError,
    add_explain,
    add_list_verb,
    add_output,
    add_policy,
    add_server,
    add_spec_flags,
    build_spec,
    explained_field,
    one_of,
    resolve_offline,
)


def cmd_resolve(ns: argparse.Namespace) -> int:
    if ns.explain:
        ns.explain = explained_field(ns.explain)
    spec = build_spec(ns)
    resource: dict[str, Any] = {}  # the plan's resource name and audit record, when a server stored it
    if ns.server:
        from cgsvc import codec
        from cgsvc_client.client import Client

        with Client.from_args(ns) as client:
            msg = client.resolve_proto(spec, policy=ns.policy or "")
        plan = codec.plan_from_proto(msg)
        resource = {"name": msg.name, "audit_record": msg.audit_record,
                    "create_time": msg.create_time.ToJsonString() if msg.name else ""}
    else:
        plan = resolve_offline(spec, ns.policy or "")
    if render.output_mode(ns) == "json":
        if ns.explain:
            render.print_json({"explain": {"field": ns.explain, **resource,
                                           "decisions": [d.to_dict() for d in plan.decisions_for(ns.explain)]}})
        else:
            render.print_json({"plan": {**resource, **plan.to_dict()}})
    else:
        if resource:
            print(f"{resource['name'] or '(validate only: not stored)'}  audit {resource['audit_record']}\n")
        print(render.plan_table(plan, render.Style(sys.stdout.isatty()), ns.explain))
    return 0


def cmd_rules(ns: argparse.Namespace) -> int:
    from cgsvc.resolve import get_policy, policy_version
    from cgsvc.resolve.engine import KEYS

    try:
        policy = get_policy(ns.policy or "")
    except ServiceError as exc:
        raise CliError.from_resolve(exc) from None
    rules = [r.describe() for r in policy.rules]
    heading = render.counted(len(rules), "rule")
    for option, kind in (("writes", "write"), ("reads", "read")):
        if (asked := getattr(ns, option)) is None:
            continue
        known = sorted({f for r in rules for f in r[option]} | (set(KEYS) if option == "writes" else set()))
        field = one_of(option, asked, known, f"a field a rule of {policy.name} {option}")
        total, rules = len(rules), [r for r in rules if field in r[option]]
        heading = f"{render.counted(len(rules), 'rule')} of {total} that {kind} {field}"
    if render.output_mode(ns) == "json":
        render.print_json({"policy": policy.name, "policy_version": policy_version(policy.name), "rules": rules})
    else:
        print(f"policy {policy.name} {policy_version(policy.name)}: {heading}, in evaluation order")
        print(render.table(["stage", "rule", "hardness", "writes", "reason"],
                           [(r["stage"], r["id"], r["hardness"], ",".join(r["writes"]) or "(warning)",
                             r["reason"]) for r in rules]))
    return 0


def cmd_models(ns: argparse.Namespace) -> int:
    from cgsvc import codec

    if ns.server:
        from cgsvc_client.client import Client

        with Client.from_args(ns) as client:
            infos = list(client.list_models().models)
    else:
        infos = codec.model_infos()
    fields = [f.name for f in codec.plan_service_pb2.ModelInfo.DESCRIPTOR.fields]
    rows = []
    for m in infos:
        d = codec.json_format.MessageToDict(m, preserving_proto_field_name=True,
                                            always_print_fields_with_no_presence=True)
        rows.append({f: d[f] for f in fields})  # in the message's order, every field present
    if render.output_mode(ns) == "json":
        render.print_json({"models": rows})
        return 0

    def attention(r: dict[str, Any]) -> str:
        return "MLA+DSA" if r["dsa"] else "MLA" if r["mla"] else "other"

    print(render.table(["model", "aliases", "architecture", "attention", "moe", "quantization", "kv cache",
                        "layers", "heads"],
                       [(r["name"], ", ".join(r["aliases"]), r["architecture"], attention(r),
                         "yes" if r["moe"] else "", r["quantization"], r["kv_cache_dtype"], r["num_layers"],
                         r["num_attention_heads"]) for r in rows]))
    return 0


def cmd_version(ns: argparse.Namespace) -> int:
    """This client's release and, with --server, the server's: what it is and who it takes you for."""
    import platform

    import grpc
    from google.protobuf import __version__ as protobuf_version
    from google.protobuf import json_format

    client = {"version": __version__, "python": platform.python_version(), "grpcio": grpc.__version__,
              "protobuf": protobuf_version}
    server: dict[str, Any] | None = None
    warnings = []
    if ns.server:
        from cgsvc_client.client import Client

        with Client.from_args(ns) as c:
            try:
                info = c.server_info()
            except ServiceError as err:
                if err.code != "UNIMPLEMENTED":
                    raise
                info = None
        if info is None:  # a release from before GetServerInfo: it answers, but cannot say which
            server = {"address": ns.server, "version": ""}
            warnings.append(f"{ns.server} does not answer GetServerInfo: a cgsvc server older than GetServerInfo "
                            f"(this client is {__version__}), or not a cgsvc server")
        else:
            server = {"address": ns.server, **json_format.MessageToDict(
                info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)}
            if info.version != __version__:
                warnings.append(f"this client is {__version__} and the server {info.version}: a field one of them "
                                "does not know is dropped on the wire")
    if render.output_mode(ns) == "json":
        render.print_json({"version": {"client": client, "server": server, "warnings": warnings}})
        return 0
    rows: list[tuple[str, str]] = [("client", f"cgsvc-cli {__version__} (Python {client['python']}, grpcio "
                                              f"{client['grpcio']}, protobuf {protobuf_version})")]
    if server is not None and not server["version"]:
        rows.append(("server", f"at {ns.server}: release unknown (see the warning)"))
    elif server is not None:
        who = server["caller"]
        how = {"none": "none: the server authenticates nobody"}.get(who["credential"], who["credential"])
        expires = f", expires {who['token_expires']}" if who["token_expires"] else ""
        rows += [("server", f"cgsvc {server['version']} at {ns.server}"),
                 ("replica", f"{server['replica']} on {server['host']}, up since {server['start_time']}"),
                 ("store", server["store"]), ("event loop", server["event_loop"]),
                 ("dispatchers", ", ".join(server["dispatchers"])), ("log key", server["log_key_id"]),
                 ("you are", f"{who['principal']} (roles: {', '.join(who['roles']) or 'none'}; credential: {how}"
                             f"{expires})")]
        by_service: dict[str, list[str]] = {}
        for rpc in who["may_call"]:
            service, _, method = rpc.partition("/")
            by_service.setdefault(service, []).append(method)
        rows += [("may call" if i == 0 else "", f"{svc}: {', '.join(methods)}")
                 for i, (svc, methods) in enumerate(by_service.items())]
    print(render.fields(rows, render.Style(sys.stdout.isatty())))
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    return 0


def cmd_completion(ns: argparse.Namespace) -> int:
    from cgsvc.resolve.engine import KEYS
    from cgsvc_client import completion

    script = completion.zsh_script if ns.shell == "zsh" else completion.bash_script
    print(script(parser(), tuple(KEYS)), end="")
    return 0


EXIT_CODES = """exit codes (every command):
  0  success
  1  any other failure: NOT_FOUND, PERMISSION_DENIED, the server unreachable, ...
     (plans diff, launches diff, experiments diff, policy impact with --exit-code: they differ)
  2  refused as bad input: INVALID_ARGUMENT or FAILED_PRECONDITION, a malformed file, a bad command line
  3  a check failed: audit verify (the chain, or the log against a checkpoint), audit prove
     (any --exit-code comparison: the comparison itself failed)
  4  launch --wait (launches rerun --wait too), experiment run and experiments rerun (unless --detach), launches wait,
     experiments wait: it ended in a state other than SUCCEEDED
  130  Ctrl-C (launch --wait, experiment run, launches|experiments wait, either rerun while it waits: it stopped waiting; the launch or experiment goes on)
with -o json the failure is {"error": {"code", "message", "field_violations"}} on stdout (a bad command line too)"""

OPTIONS_AND_ENVIRONMENT = """--server, --token, --tls-ca, --tls-cert, --tls-key, --timeout and -o may also come before the command.

environment:
  CGSVC_SERVER  the server, where --server is not given (--server '' answers offline)
  CGSVC_TOKEN   the bearer token, where --token is not given"""


class UsageError(Exception):
    """A command line argparse refuses, raised rather than printed, so that under -o json it is
    answered like any other bad input: {"error": ...} on stdout, exit 2."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message

    def violations(self) -> list[FieldViolation]:
        """The arguments argparse names: `argument --tp: ...` -> tp; each of `the following
        arguments are required: name, --checkpoint` -> name, checkpoint; `argv` for what names
        none (unrecognized arguments)."""
        def field(name: str) -> str:
            return name.lstrip("-").replace("-", "_")

        head, _, rest = self.message.partition(": ")
        if head.startswith("argument "):
            return [FieldViolation(field(head.removeprefix("argument ").split("/")[0]), rest)]
        if head.endswith("are required"):
            return [FieldViolation(field(name.strip()), "required") for name in rest.split(",")]
        return [FieldViolation("argv", self.message)]


class Parser(argparse.ArgumentParser):
    """argparse, raising UsageError where it would print and exit (its subcommands' parsers are of
    this class too: add_subparsers makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def json_requested(argv: Sequence[str]) -> bool:
    """Whether the command line asks for -o json anywhere (read before argparse, which may fail)."""
    pairs = zip(argv, [*argv[1:], ""][:len(argv)], strict=True)  # no arguments at all: no pairs
    return any(a in ("-ojson", "--output=json") or (a in ("-o", "--output") and b == "json") for a, b in pairs)


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog="cgsvc-cli", description="Resolve, explain and audit CUDA-graph plans.",
                                 epilog=f"{EXIT_CODES}\n\n{OPTIONS_AND_ENVIRONMENT}", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"cgsvc-cli {__version__}",
                    help="print this client's release and exit (cgsvc-cli version --server X: the server's too)")
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("resolve", help="resolve a launch spec into a plan")
    add_spec_flags(r)
    add_explain(r)
    add_policy(r)
    add_output(r)
    add_server(r)
    r.set_defaults(func=cmd_resolve)

    rl = sub.add_parser("rules", help="list a policy's rule table")
    rl.add_argument("--writes", metavar="FIELD", help="only the rules that may decide this plan field, e.g. "
                                                      "prefill.backend (the rules --explain FIELD can name)")
    rl.add_argument("--reads", metavar="FIELD", help="only the rules that read this spec or plan field, e.g. "
                                                     "hardware.gpu")
    add_policy(rl)
    add_output(rl)
    rl.set_defaults(func=cmd_rules)

    md = sub.add_parser("models", help="the model catalog model.name is resolved against (ids, aliases, facts)")
    add_list_verb(md)
    add_output(md)
    add_server(md)
    md.set_defaults(func=cmd_models)

    v = sub.add_parser("version", help="this client's release; with --server, the server's release, replica, "
                                       "store and log key, and who it takes you for (principal, roles, what "
                                       "they may call)")
    add_output(v)
    add_server(v)
    v.set_defaults(func=cmd_version)

    cp = sub.add_parser("completion", help="a shell completion script for commands, options and their values: "
                                           "source <(cgsvc-cli completion bash)")
    cp.add_argument("shell", choices=("bash", "zsh"), help="bash (4 or later), or zsh (through bashcompinit)")
    cp.set_defaults(func=cmd_completion)

    remote_commands.register(sub)
    launch_commands.register(sub)
    evidence_commands.register(sub)
    return ap


# Options every command that talks to a server (or prints) takes, each with a value, which a
# user may also give before the command, as kubectl and gcloud allow.
LEADING_OPTIONS = frozenset({"--server", "--token", "--tls-ca", "--tls-cert", "--tls-key", "--timeout", "--output",
                             "-o"})


def leading_options_end(argv: Sequence[str]) -> int:
    """How many of argv's first arguments are LEADING_OPTIONS and their values."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in LEADING_OPTIONS:
            i += 2  # the option, then its value
        elif arg.split("=", 1)[0] in LEADING_OPTIONS or (arg.startswith("-o") and not arg.startswith("--")):
            i += 1  # --server=HOST:PORT, -ojson
        else:
            break
    return min(i, len(argv))


def _subcommands(ap: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in ap._actions  # noqa: SLF001 - argparse has no public list of them
                 if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001


def missing_command(ap: argparse.ArgumentParser, given: Sequence[str]) -> UsageError | None:
    """The usage error of a command line that names a command group (or none) and then only
    options: argparse would read the option's value as the missing command (`audit -o json`:
    "invalid choice: 'json'")."""
    words, parsers = list(given), [ap]
    while words and (sub := _subcommands(parsers[-1])) is not None and words[0] in sub.choices:
        parsers.append(sub.choices[words.pop(0)])
    sub = _subcommands(parsers[-1])
    if sub is None or not words or leading_options_end(words) != len(words):
        return None
    return UsageError(parsers[-1], f"argument {sub.dest}: required after {' '.join(words)} (choose from "
                                   f"{', '.join(map(repr, sub.choices))})")


def hoist_leading_options(argv: Sequence[str]) -> list[str]:
    """Move LEADING_OPTIONS given before the command to the end, where the command's own parser
    reads them (a command that does not take one then says so by name)."""
    i = leading_options_end(argv)
    return [*argv[i:], *argv[:i]]


def with_hint(err: ServiceError, ns: argparse.Namespace) -> ServiceError:
    """A connection failure with the flag that fixes it: gRPC reports plaintext to a TLS server as
    'Socket closed' and TLS to a plaintext one as a handshake error, neither naming TLS plainly."""
    if err.code != "UNAVAILABLE" or err.reason:  # a reason: the server answered, saying why (DATABASE_UNAVAILABLE)
        return err
    tls = bool(getattr(ns, "tls_ca", None) or getattr(ns, "tls_cert", None))
    if not tls and "Socket closed" in err.message:
        hint = (f"{ns.server} closed the connection at once, as a server that serves TLS does to a plaintext "
                "client: give --tls-ca CA.pem (the CA that signed its certificate)")
    elif tls and ("WRONG_VERSION_NUMBER" in err.message or "Tls handshake failed" in err.message):
        hint = (f"{ns.server} does not speak TLS (the handshake got a plaintext answer): drop --tls-ca, or check "
                "the address")
    elif "Connection refused" in err.message:
        hint = (f"nothing answers at {ns.server}: is `cgsvc serve` running there? (--server or CGSVC_SERVER "
                "names the server)")
        if ":" not in ns.server.rsplit("]", 1)[-1]:
            hint += "; no port given, so gRPC dialled 443; cgsvc serves 50051 unless told otherwise"
    elif "errors resolving" in err.message or "DNS resolution failed" in err.message:
        host = ns.server.split("///")[-1].rsplit(":", 1)[0] if ":" in ns.server else ns.server
        hint = f"{host} does not resolve: check --server (or CGSVC_SERVER)"
    else:
        return err
    return ServiceError(err.code, f"{err.message}; {hint}", err.violations)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. A reader that closes the pipe early ends it quietly, with
    the code the command had reached (0 for output it did not want)."""
    code = 0
    try:
        code = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except BrokenPipeError:
        render.stdout_closed()
    except KeyboardInterrupt:  # Ctrl-C where no command says more: no traceback, the shell's code
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    return code


def _run(given: Sequence[str]) -> int:
    args = hoist_leading_options(given)
    try:
        ap = parser()
        if (missing := missing_command(ap, given)) is not None:  # options, and no command for them
            raise missing
        ns = ap.parse_args(args)
    except UsageError as exc:
        prog = exc.parser.prog
        if json_requested(args):
            _report({"error": ServiceError.invalid(exc.violations()).to_dict()
                     | {"message": f"{prog}: {exc.message} (see {prog} --help)"}},
                    one_line=_lines_asked(exc.parser, args))
        else:  # what argparse itself prints
            exc.parser.print_usage(sys.stderr)
            print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    func: Callable[[argparse.Namespace], int] = ns.func
    try:
        try:
            return func(ns)
        except ServiceError as err:  # a server's refusal or failure, decoded by the client
            raise CliError.from_resolve(with_hint(err, ns)) from None
    except CliError as exc:
        if render.output_mode(ns) == "json":
            _report({"error": exc.error}, one_line=getattr(ns, "follow", False) or getattr(ns, "json_lines", False))
        else:
            print(render.error_text(exc.error, render.Style(sys.stderr.isatty())), file=sys.stderr)
        if getattr(ns, "exit_code", False) and exc.exit_code == 1:
            return 3  # with --exit-code, 1 means "they differ"
        return exc.exit_code


def _lines_asked(p: argparse.ArgumentParser, args: Sequence[str]) -> bool:
    """Whether a command line that did not parse asked for JSON lines (`audit witness`, or a
    command's `--follow`), as a parsed one says in its namespace."""
    follows = p.get_default("follow") is not None and any(a in ("--follow", "-f") for a in args)
    return bool(p.get_default("json_lines")) or follows


def _report(error: dict[str, Any], one_line: bool = False) -> None:
    """Print an error on stdout (-o json); a reader that has gone does not change the exit code.
    `one_line`: the command's output is JSON lines (`--follow`, `audit witness`), which a program
    reads a line at a time, so the error that ends it is one line too."""
    try:
        if one_line:
            print(json.dumps(error, ensure_ascii=False))
        else:
            render.print_json(error)
        sys.stdout.flush()
    except BrokenPipeError:
        render.stdout_closed()


if __name__ == "__main__":
    raise SystemExit(main())
