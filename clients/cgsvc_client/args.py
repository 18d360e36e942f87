"""Arguments every `cgsvc-cli` command shares: the spec flags that build a launch spec, the
output mode, the server connection, and the one error type commands raise. Command modules
(cli.py, remote_commands.py, launch_commands.py) import from here; nothing here imports them.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import itertools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from cgsvc.audit import filters
from cgsvc.audit.filters import TIME_FORM, label_problem, utc_time
from cgsvc.contract import kv_cache_mib
from cgsvc.errors import FieldViolation, ServiceError, did_you_mean, one_spelling

REFUSAL_CODES = ("INVALID_ARGUMENT", "FAILED_PRECONDITION")


class CliError(Exception):
    """A failure to report as {"error": ...} with an exit code."""

    def __init__(self, error: dict[str, Any], exit_code: int) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
        self.exit_code = exit_code

    @classmethod
    def from_resolve(cls, exc: ServiceError) -> CliError:
        return cls(exc.to_dict(), 2 if exc.code in REFUSAL_CODES else 1)


def bad(field: str, message: str) -> CliError:
    """Bad input on the command line or in a file it names: exit 2, naming the field."""
    return CliError.from_resolve(ServiceError.invalid([FieldViolation(field, message)]))


STDIN = "-"


def read_json(path: str, field: str, hint: str = "") -> Any:
    """The JSON in the file `path`, or on standard input where `path` is `-` (as kubectl and jq
    take it). Standard input is read once a command and then closed, so a second `-` is refused
    on its own field rather than read as empty. An unreadable file or malformed JSON is bad input
    on `field`; `hint` ends the message of a file that cannot be read (what to give instead)."""
    if path == STDIN:
        where = "standard input"
        if sys.stdin is None or sys.stdin.closed:
            raise bad(field, "standard input was read already by another argument: give this one as a file")
        try:
            text = sys.stdin.read()
        finally:
            sys.stdin.close()
    else:
        where = repr(path)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise bad(field, f"cannot read {where}: {exc.strerror}{'; ' + hint if hint else ''}") from None
        except UnicodeDecodeError as exc:
            raise bad(field, f"{where} is not UTF-8 text: {exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except ValueError as exc:
        raise bad(field, f"malformed JSON in {where}: {exc}") from None
    except RecursionError:
        raise bad(field, f"{where} nests deeper than the JSON reader follows (about 1,000 levels)") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: RFC 8259 leaves a repeated key's meaning to
    the reader (Python's keeps the last), so a file that repeats one is refused, not half-read."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def add_explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--explain", metavar="FIELD", help="only the decisions that shaped FIELD, a plan field the rules "
                   "decide: attention_backend.prefill|decode, prefill.backend, decode.bs, ... (cgsvc-cli rules: 'writes')")


def one_of(option: str, asked: str, known: Sequence[str], what: str) -> str:
    """`asked` in its one spelling among `known`, matched in any case; else bad input naming
    `option`, saying it is not `what` and listing what is."""
    if (key := one_spelling(asked.strip(), known)) is not None:
        return key
    raise bad(option, f"{asked!r} is not {what}; {did_you_mean(asked.strip(), known)}valid: {', '.join(known)}")


def explained_field(field: str) -> str:
    """--explain's field in its one spelling: a plan key a rule may write, in any case. Checked
    before anything is sent, so a typo stores no plan."""
    from cgsvc.resolve.engine import KEYS

    return one_of("explain", field, KEYS, "a field the rules decide")


# Codes that mean no answer came at all (the server or the network is away for a while, as when
# a replica restarts): a follow or a witness says so and asks again.
NO_ANSWER = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C, as a shell reports one (128 + SIGINT)


def add_follow(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--follow", "-f", action="store_true", help=what)
    p.add_argument("--interval", type=seconds, default=2.0, metavar="SECONDS",
                   help="with --follow, how often to ask the server (default 2)")


def follow(ns: argparse.Namespace, first: Callable[[], bool], step: Callable[[], bool]) -> int:
    """Run `first`, then `step` every --interval seconds, until one returns True (what is
    followed has ended) or Ctrl-C, each exit 0 (a closed pipe, `... --follow | head`: cli.main). A poll the
    server does not answer (NO_ANSWER) is said on stderr and tried again; any other error ends it."""
    try:
        if first():
            return 0
        while True:
            time.sleep(ns.interval)
            try:
                if step():
                    return 0
            except ServiceError as exc:
                if exc.code not in NO_ANSWER:
                    raise
                print(f"{exc.code}: {exc.message}; asking again in {ns.interval:g} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        return 0


def resumed(what: str) -> Callable[[ServiceError | None, float], None]:
    """What a watch (`launch --wait`, `experiment run`) says on stderr when it opens again: the
    server went away (a restart), the stream reached its deadline, or the server closed it early."""
    def say(err: ServiceError | None, pause: float) -> None:
        why = ("the server closed the watch" if err is None else
               "the watch reached its deadline" if err.code == "DEADLINE_EXCEEDED" else f"{err.code}: {err.message}")
        when = f" in {pause:g} s" if pause else ""
        print(f"{what}: {why}; watching again{when}", file=sys.stderr, flush=True)
    return say


def resource_name(collection: str, raw: str) -> str:
    """A resource name from what the user typed: a bare ID gets `collection/` in front; a name
    with a slash goes as typed, so a wrong collection's error quotes what the user wrote."""
    return raw if "/" in raw else f"{collection}/{raw}"


# Convenience flags: (flag, spec path, type).
SPEC_FLAGS: tuple[tuple[str, tuple[str, ...], type, str], ...] = (
    ("--model", ("model", "name"), str, "catalog id (a hub repo id) or alias; cgsvc-cli models lists them"),
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


def _flag_value(ns: argparse.Namespace, flag: str) -> Any:
    return getattr(ns, flag.lstrip("-").replace("-", "_"), None)


def spec_flags_given(ns: argparse.Namespace) -> list[str]:
    """The convenience flags on this command line that build or amend a spec."""
    return ([flag for flag, *_ in SPEC_FLAGS if _flag_value(ns, flag) is not None]
            + [flag for flag in ("--enforce-piecewise", "--disable-cuda-graph") if _flag_value(ns, flag)])


def build_spec(ns: argparse.Namespace) -> dict[str, Any]:
    """The spec dict from --spec FILE (if any) with the convenience flags layered on top."""
    spec: Any = {}
    if ns.spec:
        spec = read_json(ns.spec, "spec")
        if not isinstance(spec, dict):
            raise bad("spec", "must be a JSON object")
    for flag, path, _typ, _help in SPEC_FLAGS:
        value = _flag_value(ns, flag)
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


def add_spec_flags(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """--spec FILE and the convenience flags that build or amend a spec."""
    p.add_argument("--spec", help="launch spec JSON file (docs/launch-spec.md); - reads standard input")
    for flag, _path, typ, help_text in SPEC_FLAGS:
        if flag not in exclude:
            p.add_argument(flag, type=typ, help=help_text)
    p.add_argument("--enforce-piecewise", action="store_true", help="set enforce_piecewise_cuda_graph")
    p.add_argument("--disable-cuda-graph", action="store_true", help="set disable_cuda_graph")


def resolve_offline(spec: dict[str, Any], policy: str = "") -> Any:
    """Resolve a spec here, with no server (a refusal becomes a CliError)."""
    from cgsvc.resolve import DEFAULT_POLICY, resolve
    from cgsvc.spec import parse_spec

    try:
        return resolve(parse_spec(spec), policy or DEFAULT_POLICY)
    except ServiceError as exc:
        raise CliError.from_resolve(exc) from None


def add_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", help="the policy to resolve under: cgsvc (default) or an engine profile such as "
                                    "sglang-0.5.17 (cgsvc-cli policies lists them)")


def add_workload(p: argparse.ArgumentParser, checkpoint_also: str = "") -> None:
    """The checkpoint, workload and dispatcher flags of every command that starts worker groups
    (`checkpoint_also`: what else --model-path stands for in this command)."""
    p.add_argument("--model-path", dest="checkpoint", required=True,
                   help="checkpoint directory for the workers" + (f" ({checkpoint_also})" if checkpoint_also else ""))
    p.add_argument("--input-len", type=int32, default=128, help="prompt tokens per request (default 128)")
    p.add_argument("--output-len", type=int32, default=32, help="tokens to generate per request (default 32)")
    p.add_argument("--requests", type=int32, default=4, help="requests per launch (default 4)")
    p.add_argument("--concurrency", type=int32, default=1, help="requests in flight, 0 for all (default 1)")
    p.add_argument("--seed", type=int32, default=0,
                   help="seed of the synthetic prompts (the same for every launch; decoding is greedy)")
    p.add_argument("--dispatcher", help="local (default) or ray")
    p.add_argument("--dtype", default="", help="the workers' model dtype: auto (default: float32 on a CPU, on a GPU "
                                               "the checkpoint's bfloat16/float16, else bfloat16), float32, bfloat16, "
                                               "float16 (half, float, fp16, bf16, fp32 read as those)")
    p.add_argument("--kv-cache-mb", type=kv_mib, default=0.0, metavar="MIB|auto",
                   help="KV cache budget per rank, MiB; auto (default, or 0): 256 on a CPU, on a GPU half of the "
                        "memory free once the weights are loaded")
    p.add_argument("--cpu-decode", default="", help="how CPU workers run a plan's full decode steps: eager (default), "
                                                    "trace or inductor (compiled at capture for each planned size the run "
                                                    "reaches)")


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def int32(text: str) -> int:
    """An option carried in an int32 field of a request: a number past its range is a bad command
    line naming the option (protobuf's own ValueError names neither)."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not INT32_MIN <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer from {INT32_MIN} to {INT32_MAX}, got {text!r}")
    return value


def kv_mib(text: str) -> float:
    """--kv-cache-mb's value: MiB, or auto as the API carries it (0)."""
    return kv_cache_mib(text) or 0.0


def workload(ns: argparse.Namespace) -> dict[str, int]:
    """The LaunchWorkload fields from add_workload's flags."""
    return {"input_len": ns.input_len, "output_len": ns.output_len, "requests": ns.requests,
            "concurrency": ns.concurrency, "seed": ns.seed}


def add_labels(p: argparse.ArgumentParser, help_text: str) -> None:
    """--label KEY=VALUE, repeatable (labels() reads them)."""
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help=help_text)


def add_label_columns(p: argparse.ArgumentParser, what: str) -> None:
    """-L/--label-columns KEYS for a list of things with labels (label_columns() reads it)."""
    p.add_argument("-L", "--label-columns", metavar="KEYS", default="",
                   help=f"comma-separated label keys to show as columns of the table, '-' for {what} without one "
                        "(kubectl's -L); -o json has every label")


def label_columns(ns: argparse.Namespace) -> list[str]:
    """The label keys -L asked for, in order, each once; a key no label could have is bad input."""
    keys = list(dict.fromkeys(k.strip() for k in ns.label_columns.split(",") if k.strip()))
    for key in keys:
        if problem := label_problem(key, ""):
            raise bad("label-columns", problem)
    return keys


def add_label_changes(p: argparse.ArgumentParser, collection: str) -> None:
    """NAME and the changes of a `label` command (label_changes() reads them)."""
    p.add_argument("name", help=f"{collection}/ID or ID")
    p.add_argument("changes", nargs="+", metavar="KEY=VALUE|KEY-",
                   help="KEY=VALUE sets a label, KEY- removes one; labels not named are kept")


def label_changes(ns: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """A `label` command's KEY=VALUE (set) and KEY- (remove) arguments; anything else, or a key
    named twice, is bad input on `changes` (the server checks the keys and values)."""
    return _label_args(ns.changes, "changes", removals=True)


def _label_args(given: Iterable[str], field: str, removals: bool) -> tuple[dict[str, str], list[str]]:
    """KEY=VALUE arguments (and, with `removals`, KEY-) as labels to set and keys to remove; an
    argument of neither form, or a key given twice, is bad input on `field`."""
    set_labels: dict[str, str] = {}
    remove: list[str] = []
    for arg in given:
        key, eq, value = arg.partition("=")
        if not eq and not (removals and arg.endswith("-")):
            form = "KEY=VALUE to set a label or KEY- to remove one" if removals else "KEY=VALUE"
            raise bad(field, f"{form}, got {arg!r}")
        key = key if eq else arg[:-1]
        if key in set_labels or key in remove:
            raise bad(field, f"{key!r} given twice")
        if eq:
            set_labels[key] = value
        else:
            remove.append(key)
    return set_labels, remove


def labels_text(labels: Any) -> str:
    """Labels as the tables show them: "team=infra, ticket=inc-42", or "none"."""
    return filters.labels_text(labels) or "none"


def labels(ns: argparse.Namespace) -> dict[str, str]:
    """--label KEY=VALUE, repeated, as a mapping (the server checks each key and value); a label
    given twice, or with no =, is bad input on `label`."""
    return _label_args(ns.label or (), "label", removals=False)[0]


def engine(ns: argparse.Namespace) -> dict[str, Any]:
    """The EngineSettings fields from add_workload's flags (the server checks and spells them)."""
    return {"dtype": ns.dtype, "kv_cache_mb": ns.kv_cache_mb, "cpu_decode": ns.cpu_decode}


def add_list_verb(p: argparse.ArgumentParser) -> None:
    """`policies list` as well as `policies`: every other collection is listed with `list`."""
    p.add_argument("verb", nargs="?", choices=("list",), help="optional: list (the same answer)")


def add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("table", "json"),
                   help="table (default on a terminal) or json (default otherwise)")


def add_filters(p: argparse.ArgumentParser, example: str, time_field: str = "create_time") -> None:
    """--filter and --since (a term on the collection's `time_field`, list_filter()) for the
    commands that read a collection: list and summary."""
    p.add_argument("--filter", help=f"AIP-160 subset (docs/filters.md): FIELD OP VALUE terms joined by AND and OR "
                                    f"(OR binds tighter), NOT, ( ), a trailing * for a prefix; e.g. {example}")
    p.add_argument("--since", metavar="WHEN", help=f"only those with {time_field} at or after WHEN: a duration ago "
                                                   "(90s, 15m, 2h, 7d) or an RFC 3339 time; joined to --filter")
    p.set_defaults(time_field=time_field)


def add_listing(p: argparse.ArgumentParser, example: str, time_field: str = "create_time",
                order_key: str = "create_time", order_fields: Sequence[str] = ()) -> None:
    """add_filters() and paging for List commands (`order_key`: the order_by key of the collection;
    `order_fields`: the others it may be listed by, with --order-by)."""
    add_filters(p, example, time_field)
    order = p.add_mutually_exclusive_group()
    order.add_argument("--newest-first", action="store_const", const=f"{order_key} desc", default="", dest="order_by",
                       help=f"the most recent first (order_by {order_key} desc); the default is the oldest first")
    if order_fields:
        order.add_argument("--order-by", metavar="'FIELD [asc|desc]'", dest="order_by",
                           help=f"AIP-132 order_by: {order_key} or one of {', '.join(order_fields)}, with asc or "
                                f"desc ('{order_fields[0]} desc': the highest first; those without one last)")
    p.add_argument("--page-size", type=int32, default=50, help="results per page (default 50, at most 1000)")
    p.add_argument("--page-token", help="next_page_token of the previous page")
    p.add_argument("--all", action="store_true",
                   help="follow next_page_token to the last page: every match in one table or JSON list")


AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(when: str) -> str:
    """--since as the services write times (RFC 3339, UTC, microseconds, which sorts as text): a
    duration ago, or a time with an offset."""
    text = when.strip()
    if m := AGO.match(text):
        text = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=float(m[1]) * SECONDS[m[2]])).isoformat()
    moment = utc_time(text)
    if moment is None:
        raise bad("since", f"a duration ago (90s, 15m, 2h, 7d) or {TIME_FORM}; got {when!r}")
    return moment


def list_filter(ns: argparse.Namespace) -> str:
    """The filter a List command sends: --filter, and --since as a term on its time field. AND
    binds loosest (AIP-160), so the term narrows the whole of --filter, OR terms and all."""
    terms = [ns.filter] if ns.filter else []
    if getattr(ns, "since", None):
        ns.since = since_time(ns.since)  # once: "15m" means the same moment however often it is read
        terms.append(f'{ns.time_field} >= "{ns.since}"')
    return " AND ".join(terms)


def each_page(fetch: Callable[[str, int, str], Any], field: str, query: str, page_size: int, token: str = "",
              every: bool = True) -> Iterator[tuple[Any, str]]:
    """The pages of a List call that match `query`, each with the next page's token: from the
    page `token` names to the last (or that page alone, `every` False)."""
    while True:
        page = fetch(query, page_size, token)
        items, token = getattr(page, field), page.next_page_token
        yield items, token
        if not (every and token):
            return


def pages(ns: argparse.Namespace, fetch: Callable[[str, int, str], Any], field: str) -> Iterator[tuple[Any, str]]:
    """The pages a List command reads (list_filter(), --page-size): the page --page-token names
    or, with --all, every page from there to the last (on a terminal's stderr, a count of those read
    while more are to come, on one line cleared after the last)."""
    progress = ns.all and sys.stderr.isatty()
    seen = 0
    if order := getattr(ns, "order_by", ""):  # --newest-first
        fetch = functools.partial(_ordered, fetch, order)
    for items, token in each_page(fetch, field, list_filter(ns), ns.page_size, ns.page_token or "", ns.all):
        if progress and (token or seen):
            seen += len(items)
            print(f"\r{seen} {field} read ...\x1b[K" if token else "\r\x1b[K", end="", file=sys.stderr, flush=True)
        yield items, token


def _ordered(fetch: Callable[..., Any], order_by: str, query: str, page_size: int, token: str) -> Any:
    return fetch(query, page_size, token, order_by=order_by)


def listing(ns: argparse.Namespace, fetch: Callable[[str, int, str], Any], field: str) -> tuple[list[Any], str]:
    """A List command's items (pages()) and the next page's token ("" after the last)."""
    items: list[Any] = []
    token = ""
    for got, after in pages(ns, fetch, field):
        items += got
        token = after
    return items, token


Measure = tuple[Callable[[Any], Any], Callable[[list[Any]], Any]]  # a value of an item (None: none), how to reduce them


def summarize(ns: argparse.Namespace, fetch: Callable[[str, int, str], Any], field: str,
              fields: dict[str, Callable[[Any], Any]], measures: dict[str, Measure] | None = None,
              label: Callable[[Any, str], str] | None = None) -> tuple[list[str], int, list[dict[str, Any]]]:
    """A `summary` command's answer: every item of every page that matches --filter and --since,
    counted by the --by fields (checked against `fields`, in any case, and `labels.KEY` where
    `label` reads an item's label KEY), the most common group first; each group also with each
    measure, reduced over the items that have a value (None when none has). A field that reads a
    list (the rules a plan used) counts the item once under each of its values. Constant memory:
    counts and values, not items. Returns (by, items, groups)."""
    by = [f.strip().lower() for f in ns.by.split(",") if f.strip()]
    if label is not None:
        fields = {**fields, **{f: functools.partial(_labelled, label, f.removeprefix("labels.")) for f in by
                               if f.startswith("labels.") and f != "labels."}}
    unknown = [f for f in by if f not in fields]
    if not by or unknown:
        valid = [f for f in fields if not f.startswith("labels.")] + ["labels.KEY"] * (label is not None)
        raise bad("by", f"{', '.join(unknown) or 'nothing'}: not a field to group by; valid: {', '.join(valid)} "
                        "(comma-separated)")
    measures = measures or {}
    counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
    values: dict[tuple[Any, ...], dict[str, list[Any]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    ns.all, ns.page_size, ns.page_token = True, 1000, None
    seen = 0
    for items, _ in pages(ns, fetch, field):
        for item in items:
            seen += 1
            read = [fields[f](item) for f in by]
            for key in itertools.product(*(v if isinstance(v, list) else [v] for v in read)):
                counts[key] += 1
                for name, (get, _reduce) in measures.items():
                    if (value := get(item)) is not None:
                        values[key][name].append(value)
    groups = []
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], [str(v) for v in kv[0]])):
        group: dict[str, Any] = {**dict(zip(by, key, strict=True)), field: n}
        for name, (_get, reduce) in measures.items():
            group[name] = reduce(values[key][name]) if values[key][name] else None
        groups.append(group)
    return by, seen, groups


def _labelled(label: Callable[[Any, str], str], key: str, item: Any) -> str:
    return label(item, key)


def add_summary(p: argparse.ArgumentParser, default: str, fields: dict[str, Any], example: str,
                time_field: str = "create_time") -> None:
    """--by and add_filters() for a `summary` command."""
    p.add_argument("--by", default=default, help=f"the fields to group by, comma-separated (default {default}): "
                                                 f"{', '.join(fields)}")
    add_filters(p, example, time_field)


def streamed(ns: argparse.Namespace, fetch: Callable[[str, int, str], Any], field: str,
             to_dict: Callable[[Any], dict[str, Any]]) -> bool:
    """`--all -o json`: print each page's items as they come, in the very layout print_json gives
    the whole answer, so that an export of a million audit records runs in constant memory.
    False (nothing printed) for any other listing."""
    from cgsvc_client import render

    if not (ns.all and render.output_mode(ns) == "json"):
        return False
    out, first = sys.stdout, True
    out.write(f"{{\n  {json.dumps(field)}: [")
    for items, _ in pages(ns, fetch, field):
        for item in items:
            text = json.dumps(to_dict(item), indent=2, ensure_ascii=False).replace("\n", "\n    ")
            out.write(("\n    " if first else ",\n    ") + text)
            first = False
        out.flush()
    out.write(("]" if first else "\n  ]") + ',\n  "next_page_token": ""\n}\n')
    return True


def add_server(p: argparse.ArgumentParser, required: bool = False) -> None:
    default = os.environ.get("CGSVC_SERVER") or None
    p.add_argument("--server", required=required and default is None, default=default,
                   type=a_server(p.prog.split(" ", 1)[-1]) if required else str,
                   help="HOST:PORT of a cgsvc server (or set CGSVC_SERVER; --server '' ignores it)"
                        + ("" if required else "; without one, answered here, offline"))
    p.add_argument("--token", help="bearer token (or set CGSVC_TOKEN); sent beyond loopback only over TLS (--tls-ca)")
    p.add_argument("--tls-ca", help="CA certificate (PEM) to verify the server; enables TLS")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", help="client key (PEM) for mutual TLS")
    p.add_argument("--timeout", type=seconds, default=10.0, help="deadline per call, seconds (more than 0)")


def a_server(command: str) -> Callable[[str], str]:
    """--server's reading for a command that needs a server: '' (which answers offline where a
    command can) is refused by name rather than dialled."""
    def read(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"`{command}` needs a server: HOST:PORT (an empty --server answers "
                                             "offline only where a command can: resolve, models, policies, "
                                             "plans diff of spec files)")
        return text
    return read


def seconds(text: str) -> float:
    """A duration flag's value: a finite number of seconds, more than 0 (argparse names the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


