"""`cgsvc-cli launch`, `cgsvc-cli launches list|show|cancel|logs` and `cgsvc-cli replicas list`."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from google.protobuf import json_format

from cgsvc import codec
from cgsvc.contract import REPORT_MEASURES, EngineSettings
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc_client import evidence_commands, render
from cgsvc_client.args import (
    INTERRUPTED,
    NO_ANSWER,
    CliError,
    Measure,
    add_explain,
    add_follow,
    add_label_changes,
    add_label_columns,
    add_labels,
    add_listing,
    add_output,
    add_policy,
    add_server,
    add_spec_flags,
    add_summary,
    add_workload,
    build_spec,
    engine,
    explained_field,
    follow,
    int32,
    label_changes,
    label_columns,
    labels,
    labels_text,
    list_filter,
    listing,
    resource_name,
    resumed,
    spec_flags_given,
    streamed,
    summarize,
    workload,
)
from cgsvc_client.client import LAUNCH_ENDED, Client

TERMINAL = LAUNCH_ENDED


def launch_dict(msg: Any) -> dict[str, Any]:
    d = codec.int64_as_numbers(msg, json_format.MessageToDict(msg, preserving_proto_field_name=True))
    for key in ("tokens_done", "tokens_total"):  # present when 0 too
        d[key] = int(d.get(key, 0))
    d["engine"] = dataclasses.asdict(EngineSettings.read(msg.engine))  # every setting, the defaults too
    if d.get("report_json"):
        d["report"] = {**d.get("report", {}), "worker": json.loads(d.pop("report_json"))}
    return d


class Progress:
    """A progress bar fed by WatchLaunch. Off a terminal (a CI log, a pipe), a line: at once when
    the state or the kind of count changes (sizes captured, prompt tokens, tokens) or the tokens
    are all out, else a changed bar at most every `every` seconds, so a long capture or run is
    seen moving without a line per step."""

    def __init__(self, tty: bool | None = None, out: TextIO | None = None, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.every, self.clock = every, clock
        self.last, self.last_kind, self.printed_at = "", ("", ""), -math.inf

    def update(self, launch: Any) -> None:
        line = progress_line(launch)
        if self.tty:
            print(f"\r{line}", end="" if launch.state not in TERMINAL else "\n", file=self.out, flush=True)
            return
        kind = (launch.state, progress_count(launch)[2])  # the state, and what the bar counts
        done = bool(launch.tokens_total) and launch.tokens_done == launch.tokens_total
        if line != self.last and (kind != self.last_kind or done or launch.state in TERMINAL
                                  or self.clock() - self.printed_at >= self.every):
            print(line, file=self.out, flush=True)
            self.last, self.last_kind, self.printed_at = line, kind, self.clock()


def prefilling(launch: Any) -> bool:
    """Running, no token out yet, prompts part prefilled: the bar counts prompt tokens then."""
    return bool(launch.state == "RUNNING" and not launch.tokens_done
                and launch.prompt_tokens_total > 0 and launch.prompt_tokens_done < launch.prompt_tokens_total)


def capturing(launch: Any) -> bool:
    """Capturing, with sizes to capture (or compile) counted: the bar counts those then."""
    return bool(launch.state == "CAPTURING" and launch.capture_total > 0)


def tokens_cell(launch: Any) -> str:
    """`launches list`'s tokens column: generated of all, and while prefilling, the prompt's;
    while capturing, the sizes captured."""
    cell = f"{launch.tokens_done}/{launch.tokens_total}"
    if capturing(launch):
        return f"{cell} (capture {launch.capture_done}/{launch.capture_total})"
    return cell + (f" (prefill {launch.prompt_tokens_done}/{launch.prompt_tokens_total})" if prefilling(launch) else "")


def measured_cell(launch: Any) -> str:
    """`launches list`'s ttft/tpot column: the p50s a succeeded launch measured, in ms, as the
    filter's ttft_ms_p50 and tpot_ms_p50 compare them ("-" for what it did not measure)."""
    if launch.state != "SUCCEEDED":
        return "-"
    ttft, tpot = (codec.measured(launch.report, f"{m}_ms_p50") for m in ("ttft", "tpot"))
    return "/".join("-" if v is None else f"{v:.1f}" for v in (ttft, tpot))


def progress_count(launch: Any) -> tuple[int, int, str]:
    """What a launch's bar counts, as (done, total, what): tokens generated, or while its prompts
    are prefilled before the first token (a long prompt is many steps), prompt tokens prefilled,
    or while it captures, the sizes captured."""
    if capturing(launch):
        return launch.capture_done, launch.capture_total, "sizes captured"
    if prefilling(launch):
        return launch.prompt_tokens_done, launch.prompt_tokens_total, "prompt tokens prefilled"
    return launch.tokens_done, launch.tokens_total or 0, "tokens"


def progress_line(launch: Any) -> str:
    """A launch's state and a bar of progress_count."""
    done, total, what = progress_count(launch)
    width = 30
    fill = int(width * done / total) if total else 0
    return f"{launch.state:<10} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {what}"


def report_table(launch: Any) -> str:
    r = launch.report
    rows = [("launch", f"{launch.name} ({launch.state})" if launch.name else "none made (validate_only)"),
            ("plan", f"{launch.plan or 'resolved for the check, not stored'} (audit {launch.plan_audit_record})"),
            *([("rerun of", f"{launch.rerun_of} (`cgsvc-cli launches diff {launch.rerun_of} {launch.name}`)"
                if launch.name else launch.rerun_of)] if launch.rerun_of else []),
            *([("experiment", f"{launch.experiment} (a run of it: `cgsvc-cli experiments show {launch.experiment}`)")]
              if launch.experiment else []),
            *([("labels", labels_text(launch.labels))] if launch.labels else []),
            ("workers", f"{render.counted(launch.tp, 'rank')}, {launch.dispatcher} dispatcher, {launch.model_path}"),
            ("workload", render.workload_text(launch.workload)),
            ("engine", f"{render.engine_text(launch.engine)} (as asked)"),
            ("devices", ", ".join(launch.devices) or "(not placed yet)"),
            ("supervised by", launch.owner or "-"),
            ("placement", launch.placement or "-")]
    if launch.name and launch.state != "SUCCEEDED":  # how far it has got, or got before it ended
        rows.append(("progress", f"{launch.tokens_done}/{launch.tokens_total} tokens"
                                 + (f"; {launch.prompt_tokens_done}/{launch.prompt_tokens_total} prompt tokens "
                                    "prefilled" if prefilling(launch) else "")
                                 + (f"; {launch.capture_done}/{launch.capture_total} sizes captured"
                                    if capturing(launch) else "")))
    if launch.error:
        rows.append(("error", launch.error))
    if launch.state == "SUCCEEDED":
        rows += [("prefill graph", f"requested {r.prefill_requested} -> effective {r.prefill_effective}"),
                 ("decode graph", f"requested {r.decode_requested} -> effective {r.decode_effective}"),
                 ("attention", f"effective {r.attention_prefill_effective} / {r.attention_decode_effective}")]
        if r.dtype:  # (workers of a release before it did not say)
            rows.append(("dtype", f"{r.dtype} ({r.dtype_reason})" if r.dtype_reason else r.dtype))
        rows += [("TTFT ms", f"p50 {r.ttft_ms_p50:.1f}  p99 {r.ttft_ms_p99:.1f}"),
                 ("TPOT ms", f"p50 {r.tpot_ms_p50:.1f}  p99 {r.tpot_ms_p99:.1f}"
                  if codec.measured(r, "tpot_ms_p50") is not None else "- (no request generated a second token)"),
                 ("throughput", f"{r.throughput_tok_s:.1f} tokens/s ({r.output_tokens} tokens)"),
                 ("capture", f"{r.capture_seconds:.2f} s, {r.capture_bytes} bytes"),
                 ("KV cache", f"{r.kv_bytes_per_token} bytes/token (latent only)"
                  + (f"; {render.mib(r.kv_cache_budget_bytes)} a rank ({r.kv_cache_budget_reason})"
                     if r.kv_cache_budget_bytes else ""))]
        rows.append(("plan fidelity", fidelity_line(r.plan_fidelity)))
        rows += [(f.status.replace("_", " "), f"{f.field}: {f.requested} -> {f.effective} ({f.reason})")
                 for f in r.plan_fidelity if f.status != "honoured"]
    rows += [("note", note) for note in worker_notes(launch.report_json)]
    return render.fields(rows)


def fidelity_line(fidelity: Any) -> str:
    """How many plan fields ran as planned, and how many did not and why in a word: a field with
    nothing to act on (an eager phase's sizes) is counted apart from one the workers replaced."""
    count = collections.Counter(f.status for f in fidelity)
    if not fidelity:
        return "not reported (workers of a release before plan fidelity)"
    if count["honoured"] == len(fidelity):
        return f"all {len(fidelity)} plan fields honoured as planned"
    return ", ".join([f"{count['honoured']} of {len(fidelity)} plan fields honoured as planned"]
                     + [f"{count['substituted']} substituted"] * bool(count["substituted"])
                     + [f"{count['not_applicable']} not applicable (nothing to act on)"] * bool(count["not_applicable"]))


def worker_notes(report_json: str) -> list[str]:
    """What the workers noted beside the plan (what of the checkpoint they left out, requests
    that waited for KV room, ...): the report's `notes`."""
    try:
        notes = json.loads(report_json).get("notes") if report_json else None
    except (ValueError, AttributeError):
        return []
    return [str(n) for n in notes] if isinstance(notes, list) else []


def cmd_launch(ns: argparse.Namespace) -> int:
    flags = spec_flags_given(ns)
    spec = None
    if ns.plan:  # resolved already: a spec flag beside it would be dropped without a word
        if ns.spec or flags:
            given = ", ".join(["--spec"] * bool(ns.spec) + flags)
            raise ServiceError.invalid([FieldViolation("plan", f"give a spec (--spec, or flags such as --gpu and "
                                                               f"--tp) or --plan plans/ID, not both; got --plan and "
                                                               f"{given}")])
    else:
        spec = build_spec(ns)
        model = spec.setdefault("model", {})
        if isinstance(model, dict) and not model.get("name") and not model.get("path"):
            model["path"] = ns.checkpoint  # a spec that names no model is for the checkpoint launched
    check_wait(ns)
    with Client.from_args(ns) as c:
        op = c.create_launch(ns.checkpoint, workload(ns), spec=spec, plan=ns.plan or "",
                             wait_for_resources=ns.wait_for_resources, dispatcher=ns.dispatcher or "",
                             request_id=ns.request_id, policy=ns.policy or "", validate_only=ns.validate_only,
                             engine=engine(ns), labels=labels(ns))
        return answer_created(c, op.metadata, ns)


def check_wait(ns: argparse.Namespace) -> None:
    if ns.validate_only and ns.wait:
        raise ServiceError.invalid([FieldViolation("wait", "a --validate-only launch starts nothing to wait for")])


def answer_created(c: Client, launch: Any, ns: argparse.Namespace) -> int:
    """What `launch` and `launches rerun` print of the launch CreateLaunch made (or checked, with
    --validate-only), following it to its end with --wait."""
    if ns.validate_only:
        if render.output_mode(ns) == "json":
            render.print_json({"validated": launch_dict(launch)})
        else:
            print(f"valid: would launch {launch.plan or launch.plan_audit_record} on "
                  f"{render.counted(launch.tp, launch.dispatcher + ' rank')}; nothing was started (audit "
                  f"{launch.audit_records[0]})\n")
            print(report_table(launch))
        return 0
    if ns.wait:
        return wait_for_launch(c, launch, ns)
    print_launch(launch, ns)
    return 0


def launches_rerun(ns: argparse.Namespace) -> int:
    """The launch again as it was asked for: its stored plan (not resolved again, so the same
    rules decide it whatever the policy is today), checkpoint, workload, dispatcher and engine
    settings; then as `launch` goes on (--wait, -o), naming the diff that compares the two."""
    check_wait(ns)
    with Client.from_args(ns) as c:
        op = c.rerun_launch(resource_name("launches", ns.name), request_id=ns.request_id,
                            wait_for_resources=ns.wait_for_resources, validate_only=ns.validate_only,
                            labels=labels(ns))
        if not ns.validate_only:
            was, now = op.metadata.rerun_of, op.metadata.name
            print(f"{now}: {was} again; compare them with `cgsvc-cli launches diff {was} {now}`", file=sys.stderr)
        return answer_created(c, op.metadata, ns)


def print_launch(launch: Any, ns: argparse.Namespace) -> None:
    """A launch as `-o json` or the table asks."""
    if render.output_mode(ns) == "json":
        render.print_json({"launch": launch_dict(launch)})
    else:
        print(report_table(launch))


def wait_for_launch(c: Client, launch: Any, ns: argparse.Namespace) -> int:
    """Follow a launch to its end (progress on stderr), print it, and exit as `launch --wait`
    does: 0 when it SUCCEEDED, 4 when it ended otherwise, 130 on Ctrl-C (the launch goes on)."""
    bar = Progress()
    try:
        for event in c.watch_launch(launch.name, on_resume=resumed(launch.name)):
            bar.update(event.launch)
            if event.kind == "state":
                launch = event.launch
    except KeyboardInterrupt:  # the launch is the server's: stop waiting, say how to reach it
        print(f"\nstopped waiting: {launch.name} goes on ({launch.state}); `cgsvc-cli launches wait "
              f"{launch.name}` waits again, `cgsvc-cli launches cancel {launch.name}` stops it", file=sys.stderr)
        if render.output_mode(ns) == "json":
            render.print_json({"launch": launch_dict(launch)})
        return INTERRUPTED
    launch = c.get_launch(launch.name)
    print_launch(launch, ns)
    return 0 if launch.state == "SUCCEEDED" else 4


def launches_wait(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        return wait_for_launch(c, c.get_launch(resource_name("launches", ns.name)), ns)


def launches_list(ns: argparse.Namespace) -> int:
    keys = label_columns(ns)
    with Client.from_args(ns) as c:
        if streamed(ns, c.list_launches, "launches", launch_dict):
            return 0
        launches, token = listing(ns, c.list_launches, "launches")
    if render.output_mode(ns) == "json":
        render.print_json({"launches": [launch_dict(x) for x in launches], "next_page_token": token})
        return 0
    print(render.page(["name", "state", "plan", "tp", "devices", "tokens", "ttft/tpot ms", "created", "error", *keys],
                      [(x.name, x.state, x.plan, x.tp, ",".join(x.devices), tokens_cell(x), measured_cell(x),
                        x.create_time.ToJsonString(), x.error.splitlines()[0] if x.error else "",
                        *(x.labels.get(k, "-") for k in keys)) for x in launches], token, "launches", list_filter(ns)))
    return 0


LAUNCH_FILTER_EXAMPLE = 'state = "RUNNING" AND plan = "plans/ID"'

# What `launches summary --by` groups launches by, and what it measures of each group.
LAUNCH_FIELDS: dict[str, Callable[[Any], Any]] = {
    "state": lambda x: x.state,
    "plan": lambda x: x.plan,
    "dispatcher": lambda x: x.dispatcher,
    "tp": lambda x: x.tp,
    "model_path": lambda x: x.model_path,
    "experiment": lambda x: x.experiment or "-",  # the experiment that made it
    "engine": lambda x: render.engine_text(x.engine),  # the settings asked for
    "dtype": lambda x: x.report.dtype or "-",  # the dtype that ran
    "substituted": lambda x: substituted_text(x.report),
    "day": lambda x: x.create_time.ToJsonString()[:10],  # made that UTC day
    **{f: (lambda name: lambda x: getattr(x.report, name) or "-")(f)
       for f in ("prefill_requested", "prefill_effective", "decode_requested", "decode_effective",
                 "attention_prefill_effective", "attention_decode_effective")},
}


def substituted_text(report: Any) -> str:
    """The plan fields a launch's workers substituted, as the launch filter's `substituted` names
    them: "attention_backend.decode,decode.backend", "none", or "-" with no report yet."""
    if not report.plan_fidelity:
        return "-"
    return ",".join(f.field for f in report.plan_fidelity if f.status == "substituted") or "none"


def _succeeded(metric: str) -> Callable[[Any], float | None]:
    """A succeeded launch's measure; None (left out of the median) otherwise or where it measured
    none (TPOT with no second token)."""
    return lambda x: codec.measured(x.report, metric) if x.state == "SUCCEEDED" else None


LAUNCH_MEASURES: dict[str, Measure] = {
    "succeeded": ((lambda x: 1 if x.state == "SUCCEEDED" else None), sum),
    "ttft_ms_p50_median": (_succeeded("ttft_ms_p50"), statistics.median),
    "tpot_ms_p50_median": (_succeeded("tpot_ms_p50"), statistics.median),
    "throughput_tok_s_median": (_succeeded("throughput_tok_s"), statistics.median),
}


def launches_summary(ns: argparse.Namespace) -> int:
    """The launches grouped by the --by fields: how many ran each way, and what the ones that
    succeeded measured (medians of their TTFT and TPOT p50 and throughput)."""
    with Client.from_args(ns) as c:  # and labels.KEY: that label's value ("-" for a launch without it)
        by, total, groups = summarize(ns, c.list_launches, "launches", LAUNCH_FIELDS, LAUNCH_MEASURES,
                                      label=lambda x, key: x.labels.get(key, "-"))
    if render.output_mode(ns) == "json":
        render.print_json({"summary": {"by": by, "launches": total, "groups": groups}})
        return 0

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"
    print(render.table([*by, "launches", "succeeded", "TTFT p50 ms", "TPOT p50 ms", "tokens/s"],
                       [(*(g[f] for f in by), g["launches"], g["succeeded"] or 0, ms(g["ttft_ms_p50_median"]),
                         ms(g["tpot_ms_p50_median"]), ms(g["throughput_tok_s_median"])) for g in groups]))
    print(f"{render.counted(total, 'launch')} in {render.counted(len(groups), 'group')}; latencies are "
          "medians over each group's succeeded launches")
    return 0


def launches_show(ns: argparse.Namespace) -> int:
    explain = explained_field(ns.explain) if ns.explain else None
    with Client.from_args(ns) as c:
        launch = c.get_launch(resource_name("launches", ns.name))
        if explain is None:
            print_launch(launch, ns)
            return 0
        plan = c.get_plan(launch.plan)
    planned = codec.plan_from_proto(plan)
    decisions = planned.decisions_for(explain)
    ran = next((f for f in launch.report.plan_fidelity if f.field == explain), None)
    if render.output_mode(ns) == "json":
        render.print_json({"explain": {
            "field": explain, "launch": launch.name, "state": launch.state, "plan": plan.name,
            "audit_record": plan.audit_record, "decisions": [d.to_dict() for d in decisions],
            "ran": None if ran is None else {"status": ran.status, "requested": json.loads(ran.requested or "null"),
                                             "effective": json.loads(ran.effective or "null"), "reason": ran.reason}}})
        return 0
    print(f"{launch.name} ({launch.state})  plan {plan.name}  audit {plan.audit_record}\n")
    print(render.plan_table(planned, render.Style(sys.stdout.isatty()), explain))
    if ran is not None:
        said = f" ({ran.reason})" if ran.reason else ""
        print(f"\nwhat ran: {ran.status}: {ran.requested} -> {ran.effective}{said}")
    else:
        why = ("it ended without the workers' report of what ran" if launch.state in LAUNCH_ENDED
               else "the workers report what ran of each plan field when their run ends")
        print(f"\nwhat ran: not reported ({launch.state}: {why})")
    return 0


def launches_cancel(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        launch = c.cancel_launch(resource_name("launches", ns.name))
    if render.output_mode(ns) == "json":
        render.print_json({"launch": launch_dict(launch)})
    else:
        print(f"{launch.name}: {launch.state}")
    return 0


def launches_label(ns: argparse.Namespace) -> int:
    set_labels, remove = label_changes(ns)
    with Client.from_args(ns) as c:
        launch = c.label_launch(resource_name("launches", ns.name), set_labels, remove)
    if render.output_mode(ns) == "json":
        render.print_json({"launch": launch_dict(launch)})
    else:
        record = f" (audit {launch.audit_records[-1]})" if launch.audit_records else ""
        print(f"{launch.name}: labels {labels_text(launch.labels)}{record}")
    return 0


class LogsReplica:
    """Asks for a launch's logs where they are: the server given, or, when it answers that another
    replica keeps them (LOGS_ELSEWHERE, with that replica's address), that replica, with the same
    credentials, said once on stderr. At most one hop a call: a replica that names itself, or no
    address, is an error as it came. When the replica asked there stops answering, the error says
    which replica it was and what the server given says of the launch; once that launch has ended
    there is nothing left to wait for, and `--follow` stops (exit 1: its last lines were not read)."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.origin = Client.from_args(ns)
        self.client = self.origin
        self.keeper: dict[str, str] = {}  # LOGS_ELSEWHERE's facts, once redirected

    def __enter__(self) -> LogsReplica:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not self.origin:
            self.client.close()
        self.origin.close()

    def logs(self, name: str, tail: int, offsets: dict[str, int] | None = None) -> Any:
        if not self.keeper:
            try:
                return self.origin.launch_logs(name, self.ns.rank, tail, after_offsets=offsets)
            except ServiceError as err:
                address = err.info.get("address", "") if err.reason == "LOGS_ELSEWHERE" else ""
                if not address or address == self.ns.server:
                    raise
                print(f"{name}'s logs are kept by {err.info.get('replica') or 'another replica'} on "
                      f"{err.info.get('host') or '?'}: asking it at {address}", file=sys.stderr, flush=True)
                self.keeper = dict(err.info)
                self.client = Client.from_args(argparse.Namespace(**{**vars(self.ns), "server": address}))
        try:
            return self.client.launch_logs(name, self.ns.rank, tail, after_offsets=offsets)
        except ServiceError as err:
            if err.code not in NO_ANSWER:
                raise
            raise self._keeper_silent(name, err) from None

    def _keeper_silent(self, name: str, err: ServiceError) -> Exception:
        k = self.keeper
        said = (f"{name}'s logs are kept by {k.get('replica') or 'another replica'} on {k.get('host') or '?'}, "
                f"whose address {k['address']} does not answer ({err.code}: {err.message})")
        launch = self.origin.get_launch(name)
        info = {**k, "state": launch.state}
        if launch.state not in TERMINAL:
            return ServiceError(err.code, f"{said}; {self.ns.server} has the launch {launch.state}", info=info)
        ended = ServiceError(err.code, f"{said}; {self.ns.server} has the launch ended {launch.state}"
                             + (f" ({launch.error})" if launch.error else "")
                             + ", so lines not shown yet can be read only once that replica answers again", info=info)
        return CliError(ended.to_dict(), 1)


def launches_logs(ns: argparse.Namespace) -> int:
    name = resource_name("launches", ns.name)
    if ns.follow:
        return follow_logs(ns, name)
    with LogsReplica(ns) as replica:
        logs = replica.logs(name, ns.tail)
        texts = {x.name: x.text for x in logs.logs}
        ends = {x.name: x.end_offset for x in logs.logs}
        short = {x.name: x.size for x in logs.logs if x.end_offset < x.size}
        while short:  # an answer held only part of a log: ask on from where it stopped
            more = replica.logs(name, 0, ends)
            for x in more.logs:
                if x.name in short:
                    texts[x.name] += x.text
                    if x.end_offset >= short[x.name] or x.end_offset == ends[x.name]:
                        del short[x.name]  # whole, or as much as there was when first asked (no progress)
                    ends[x.name] = x.end_offset
    if render.output_mode(ns) == "json":
        render.print_json({"logs": [{"name": n, "text": texts[n], "end_offset": ends[n]} for n in texts],
                           "state": logs.state})
    else:
        for n, text in texts.items():
            print(f"==> {n} <==\n{text}")
    return 0


def follow_logs(ns: argparse.Namespace, name: str) -> int:
    """`launches logs --follow`, as `tail -f` over the ranks' logs: the tail, then each log's new
    lines as they are written, until the launch ends (its state on stderr, exit 0). A log that
    appears later is read from its start. JSON: one {"log", "text", "end_offset"} line a piece."""
    as_json = render.output_mode(ns) == "json"
    offsets: dict[str, int] = {}
    shown = ""  # the log whose lines were printed last: its header is not repeated

    def emit(answer: Any) -> bool | None:
        """Print an answer: True when the launch has ended and every log is whole, None when a
        log was given only in part (ask on now), False otherwise (ask again after --interval)."""
        nonlocal shown
        more = False
        for x in answer.logs:
            more = more or (x.end_offset < x.size and x.end_offset != offsets.get(x.name))
            offsets[x.name] = x.end_offset
            if not x.text:
                continue
            if as_json:
                print(json.dumps({"log": x.name, "text": x.text, "end_offset": x.end_offset}, ensure_ascii=False),
                      flush=True)
                continue
            if x.name != shown:
                print(f"==> {x.name} <==", flush=True)
                shown = x.name
            print(x.text, end="" if x.text.endswith("\n") else "\n", flush=True)
        if more:
            return None
        if answer.state in TERMINAL:
            print(f"{name} ended {answer.state}", file=sys.stderr, flush=True)
            return True
        return False

    def ask(tail: int) -> bool:
        while (ended := emit(replica.logs(name, tail, offsets if not tail else None))) is None:
            tail = 0  # an answer held a log only in part: read on from its end_offset at once
        return ended

    with LogsReplica(ns) as replica:
        return follow(ns, lambda: ask(ns.tail), lambda: ask(0))


def replicas_list(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        page = c.list_replicas()
    releases = collections.Counter(x.version or "unknown (older)" for x in page.replicas)
    warnings = ([f"the replicas run different releases: {', '.join(f'{v} ({n})' for v, n in sorted(releases.items()))}"]
                if len(releases) > 1 else [])
    if render.output_mode(ns) == "json":
        render.print_json({**json_format.MessageToDict(page, preserving_proto_field_name=True,
                                                       always_print_fields_with_no_presence=True),
                           "warnings": warnings})
        return 0
    print(render.table(["name", "host", "address", "version", "started", "renewed", "lease", "active launches",
                        "answering"],
                      [(x.name, x.host, x.address or "-", x.version or "-", x.start_time.ToJsonString(),
                        f"{x.seconds_since_renewal:.1f} s ago", "LAPSED" if x.lapsed else "held", x.active_launches,
                        "yes" if x.answering else "") for x in page.replicas]))
    print(f"a lease lapses after {page.lease_seconds:g} s unrenewed; the other replicas then take its launches over")
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    la = sub.add_parser("launch", help="resolve (or take) a plan and run it on a worker group")
    add_spec_flags(la, exclude=("--model-path",))
    la.add_argument("--plan", help="plans/ID of a stored plan instead of a spec")
    add_policy(la)
    add_workload(la, "also the spec's model where neither --spec nor --model names one")
    la.add_argument("--request-id", help="idempotency key: a retry with the same id returns the same launch "
                                          "(default: a fresh id per invocation)")
    add_labels(la, "a name of your own for the launch (repeatable; lower-case letters, digits, _ and -), to find it "
                   "by: launches list --filter 'labels.KEY = \"VALUE\"'")
    la.add_argument("--wait", action="store_true", help="follow progress until the launch ends")
    la.add_argument("--wait-for-resources", action="store_true", help="queue when devices are busy instead of failing")
    la.add_argument("--validate-only", action="store_true",
                    help="check everything a launch is checked for (workload, checkpoint and model family, plan, "
                         "dispatcher, free devices), audited, and start nothing")
    la.set_defaults(func=cmd_launch)
    add_output(la)
    add_server(la, required=True)

    ls = sub.add_parser("launches", help="launches").add_subparsers(dest="launches_command", required=True)
    p = ls.add_parser("list", help="list launches")
    add_listing(p, LAUNCH_FILTER_EXAMPLE, order_fields=REPORT_MEASURES)
    add_label_columns(p, "a launch")
    p.set_defaults(func=launches_list)
    pm = ls.add_parser("summary", help="launches counted by some fields, with the median TTFT, TPOT and "
                                        "throughput of each group's succeeded launches")
    add_summary(pm, "prefill_effective,decode_effective", {**LAUNCH_FIELDS, "labels.KEY": None}, LAUNCH_FILTER_EXAMPLE)
    pm.set_defaults(func=launches_summary)
    p2 = ls.add_parser("show", help="show one launch: state, devices, report and plan fidelity; with --explain, "
                                    "why a plan field was planned as it was and what the workers ran")
    p2.add_argument("name", help="launches/ID or ID")
    add_explain(p2)
    p2.set_defaults(func=launches_show)
    p3 = ls.add_parser("cancel", help="stop a launch's worker group")
    p3.add_argument("name", help="launches/ID or ID")
    p3.set_defaults(func=launches_cancel)
    plab = ls.add_parser("label", help="set or remove a launch's labels, in any state (audited; the others are kept)")
    add_label_changes(plab, "launches")
    plab.set_defaults(func=launches_label)
    pw = ls.add_parser("wait", help="follow a launch until it ends (progress on stderr), then show it: exit 0 when "
                                    "it SUCCEEDED, 4 when it ended otherwise; Ctrl-C stops the waiting, not the launch")
    pw.add_argument("name", help="launches/ID or ID")
    pw.set_defaults(func=launches_wait)
    pr = ls.add_parser("rerun", help="run a launch again as it was asked for: its stored plan (not resolved "
                                     "again), checkpoint, workload, dispatcher and engine settings")
    pr.add_argument("name", help="launches/ID or ID")
    pr.add_argument("--request-id", help="idempotency key: a retry with the same id returns the same new launch "
                                          "(default: a fresh id per invocation)")
    pr.add_argument("--wait", action="store_true", help="follow progress until the new launch ends")
    pr.add_argument("--wait-for-resources", action="store_true",
                    help="queue when devices are busy instead of failing")
    pr.add_argument("--validate-only", action="store_true", help="check it as a launch is checked, start nothing")
    add_labels(pr, "the rerun's labels (repeatable), in place of the launch's own, which it keeps otherwise")
    pr.set_defaults(func=launches_rerun)
    p4 = ls.add_parser("logs", help="the ranks' (and the supervisor's) log tails, asked of the replica that keeps "
                                    "them when the server given says another does")
    p4.add_argument("name", help="launches/ID or ID")
    p4.add_argument("--rank", type=int32, default=-1, help="one rank (default: every rank and the supervisor)")
    p4.add_argument("--tail", type=int32, default=50, help="last N lines (0: all)")
    add_follow(p4, "then print each log's new lines as they are written, until the launch ends (exit 0) or "
                   "Ctrl-C; -o json: one {\"log\", \"text\", \"end_offset\"} line a piece")
    p4.set_defaults(func=launches_logs)
    evidence_commands.register_launch_diff(ls)
    rs = sub.add_parser("replicas", help="the server replicas on one database and their leases").add_subparsers(
        dest="replicas_command", required=True)
    p5 = rs.add_parser("list", help="list replicas: host, address, release, lease, active launches each supervises")
    p5.set_defaults(func=replicas_list)
    for parser in (p, pm, p2, p3, plab, pw, pr, p4, p5):
        add_output(parser)
        add_server(parser, required=True)
