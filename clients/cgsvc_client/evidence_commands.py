"""`cgsvc-cli` evidence commands: `policies`, `plans diff`, `policy impact`, and the A/B
`experiment run` with `experiments list|show|summary|diff`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from cgsvc import codec
from cgsvc.contract import ran_alike, ran_as
from cgsvc.errors import ServiceError
from cgsvc.plan import Plan, compare, plan_fields
from cgsvc_client import render
from cgsvc_client.args import (
    INTERRUPTED,
    CliError,
    add_label_changes,
    add_label_columns,
    add_labels,
    add_list_verb,
    add_listing,
    add_output,
    add_server,
    add_summary,
    add_workload,
    bad,
    engine,
    int32,
    label_changes,
    label_columns,
    labels,
    labels_text,
    list_filter,
    listing,
    read_json,
    resolve_offline,
    resource_name,
    resumed,
    streamed,
    summarize,
    workload,
)
from cgsvc_client.client import LAUNCH_ENDED, Client


def _show(value: Any) -> str:
    if isinstance(value, list):
        text = "[" + ",".join(str(v) for v in value) + "]"
        return text if len(value) <= 6 else f"[{value[0]},{value[1]},...,{value[-1]}] ({len(value)})"
    return str(value)


# ---------------------------------------------------------------------------- policies


def cmd_policies(ns: argparse.Namespace) -> int:
    if ns.server:
        with Client.from_args(ns) as c:
            infos = list(c.list_policies().policies)
    else:
        from cgsvc.resolve.policies import POLICIES

        infos = [codec.policy_info(p) for p in POLICIES.values()]
    rows = [codec.json_format.MessageToDict(p, preserving_proto_field_name=True,
                                            always_print_fields_with_no_presence=True) for p in infos]
    if render.output_mode(ns) == "json":
        render.print_json({"policies": rows})
    else:
        print(render.table(["policy", "version", "rules", "default", "summary"],
                           [(r["name"], r["version"], r["rules"], "yes" if r["default"] else "", r["summary"])
                            for r in rows]))
    return 0


# ---------------------------------------------------------------------------- plans diff


def _plan_side(arg: str, policy: str, ns: argparse.Namespace, side: str) -> tuple[Plan, dict[str, Any]]:
    """A plan from plans/ID (through the server), a plan file, or a spec file resolved here
    (under --policy-a/-b: a plan already resolved refuses one rather than ignore it)."""
    def resolved_already(what: str) -> CliError:
        return bad(f"policy_{side}", f"{arg} is {what}, resolved already under its own policy: --policy-{side} "
                                     "applies to a spec file, which is resolved here")

    if arg.startswith("plans/"):
        if policy:
            raise resolved_already("a stored plan")
        if not ns.server:
            raise bad(side, f"{arg} is a stored plan: give --server to read it")
        with Client.from_args(ns) as c:
            msg = c.get_plan(arg)
        return codec.plan_from_proto(msg), {"source": arg, "kind": "stored plan", "audit_record": msg.audit_record}
    data = read_json(arg, side, hint="give plans/ID, a plan file or a spec file")
    if not isinstance(data, dict):
        raise bad(side, f"{arg!r} must hold a JSON object (a plan or a launch spec)")
    body = data.get("plan", data)
    if isinstance(body, dict) and "decisions" in body and "policy_version" in body:
        if policy:
            raise resolved_already("a plan file")
        try:
            return codec.plan_from_dict(body), {"source": arg, "kind": "plan file", "audit_record": body.get("audit_record", "")}
        except (KeyError, TypeError) as exc:
            raise bad(side, f"{arg!r} looks like a plan but lacks {exc}") from None
    from cgsvc.resolve import get_policy

    try:
        get_policy(policy, f"policy_{side}")  # an unknown one named by the flag given
    except ServiceError as exc:
        raise CliError.from_resolve(exc) from None
    return resolve_offline(data, policy), {"source": arg, "kind": "spec file (resolved here)", "audit_record": ""}


def _trail(plan: Plan, field: str) -> str:
    return (", " if field == "warnings" else " > ").join(plan.deciders(field)) or "-"


def cmd_plans_diff(ns: argparse.Namespace) -> int:
    a, da = _plan_side(ns.a, ns.policy_a or "", ns, "a")
    b, db = _plan_side(ns.b, ns.policy_b or "", ns, "b")
    for plan, d in ((a, da), (b, db)):
        d.update(policy=plan.policy, policy_version=plan.policy_version, plan_hash=plan.plan_hash,
                 fields=plan_fields(plan))
    cmp = compare(a, b)
    result = {"a": da, "b": db, "changes": [{"field": f, "a": x, "b": y} for f, x, y in cmp.changes],
              "rules": {"only_a": list(cmp.only_a), "only_b": list(cmp.only_b)}}
    if render.output_mode(ns) == "json":
        render.print_json({"diff": result})
    else:
        for label, d in (("a", da), ("b", db)):
            print(f"{label}: {d['source']} ({d['kind']}; {d['policy']} {d['policy_version']}, plan {d['plan_hash'][:12]})")
        if cmp.same:
            print("\nno differences in the plan's fields")
        else:
            print()
            print(render.table(["field", "a", "b", "decided by (a)", "decided by (b)"],
                               [(f, _show(x), _show(y), _trail(a, f), _trail(b, f)) for f, x, y in cmp.changes]))
        if cmp.only_a or cmp.only_b:
            print(f"\nrules only in a: {', '.join(cmp.only_a) or '-'}\nrules only in b: {', '.join(cmp.only_b) or '-'}")
    return 1 if ns.exit_code and not cmp.same else 0


# ---------------------------------------------------------------------------- launches diff

# What each launch measured, as its report gives it: (label, LaunchReport field; codec.measured reads it).
MEASURED: tuple[tuple[str, str], ...] = (
    ("TTFT p50 ms", "ttft_ms_p50"), ("TTFT p99 ms", "ttft_ms_p99"), ("TPOT p50 ms", "tpot_ms_p50"),
    ("TPOT p99 ms", "tpot_ms_p99"), ("throughput tokens/s", "throughput_tok_s"), ("capture s", "capture_seconds"),
    ("capture bytes", "capture_bytes"), ("KV bytes/token", "kv_bytes_per_token"))
SINGLE_RUNS = ("one launch a side: single runs, no interval; `cgsvc-cli experiment run A B` "
               "measures a difference with confidence intervals")


def _number(value: float | None, spec: str, unit: str = "") -> str:
    """A measure as the diff's table shows it; "-" where a side measured none."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def _ran(launch: Any) -> dict[str, str]:
    """What a launch ran beyond its plan: where, on what, with which workload, and (once it has
    succeeded) the modes and backends in effect and each plan field's fidelity."""
    w = launch.workload
    out = {"state": launch.state, "checkpoint": launch.model_path,
           "workload": render.workload_text(w), "engine (asked)": render.engine_text(launch.engine),
           "ranks": f"{launch.tp} ({launch.dispatcher} dispatcher)", "devices": ", ".join(launch.devices) or "-"}
    if launch.state == "SUCCEEDED":
        r = launch.report
        out |= {"dtype": r.dtype or "-",
                "KV cache budget": f"{render.mib(r.kv_cache_budget_bytes)} a rank" if r.kv_cache_budget_bytes else "-",
                "prefill (effective)": r.prefill_effective, "decode (effective)": r.decode_effective,
                "attention prefill (effective)": r.attention_prefill_effective,
                "attention decode (effective)": r.attention_decode_effective}
        out |= {f"fidelity of {f.field}": f"{f.status}: {_show(_json_value(f.effective))}"
                for f in launch.report.plan_fidelity}
    return out


def _json_value(text: str) -> Any:
    """A fidelity entry's value (JSON text: "disabled" quoted, a list of sizes), as its value;
    null (nothing in effect) as "-"."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return "-" if value is None else value


def two_names(ns: argparse.Namespace, collection: str, hint: str = "") -> list[str]:
    """A diff's A and B (ns.a, ns.b) as resource names of `collection`; bad input naming the side
    that names something else."""
    names = []
    for side in ("a", "b"):
        raw = getattr(ns, side)
        name = resource_name(collection, raw)
        if not name.startswith(f"{collection}/"):
            raise bad(side, f"give {collection}/ID or the bare ID, got {raw!r}{hint}")
        names.append(name)
    return names


def cmd_launches_diff(ns: argparse.Namespace) -> int:
    names = two_names(ns, "launches", " (plans diff compares plans)")
    with Client.from_args(ns) as c:
        launches = [c.get_launch(n) for n in names]
        plans = [codec.plan_from_proto(c.get_plan(x.plan)) for x in launches]
    cmp = compare(*plans)
    ran_a, ran_b = (_ran(x) for x in launches)
    ran = [{"field": f, "a": ran_a.get(f, "-"), "b": ran_b.get(f, "-")}
           for f in dict.fromkeys([*ran_a, *ran_b]) if ran_a.get(f) != ran_b.get(f)]
    measured, note, alike = [], SINGLE_RUNS, []
    if all(x.state == "SUCCEEDED" for x in launches):
        alike = ran_alike(*(ran_as({"plan_fidelity": [{"field": f.field, "requested": f.requested,
                                                       "effective": f.effective} for f in x.report.plan_fidelity]})
                            for x in launches))
        for label, field in MEASURED:
            va, vb = (None if (v := codec.measured(x.report, field)) is None else round(v, 3) for x in launches)
            row: dict[str, Any] = {"metric": label, "a": va, "b": vb, "b_minus_a": None, "b_over_a": None}
            if va is not None and vb is not None:  # a side with no TPOT (no second token) has nothing to compare
                row |= {"b_minus_a": round(vb - va, 3), "b_over_a": round(vb / va, 3) if va else None}
            measured.append(row)
    else:
        note = "; ".join(f"{x.name} {'ended' if x.state in LAUNCH_ENDED else 'is'} {x.state}: nothing it measured "
                         "to compare" for x in launches if x.state != "SUCCEEDED")
    sides = [{"launch": x.name, "state": x.state, "plan": x.plan, "policy": p.policy,
              "policy_version": p.policy_version, "plan_hash": p.plan_hash, "rerun_of": x.rerun_of}
             for x, p in zip(launches, plans, strict=True)]
    result = {"a": sides[0], "b": sides[1],
              "plan": {"changes": [{"field": f, "a": x, "b": y} for f, x, y in cmp.changes],
                       "rules": {"only_a": list(cmp.only_a), "only_b": list(cmp.only_b)}},
              "ran": ran, "ran_alike": alike, "measured": measured, "note": note}
    if render.output_mode(ns) == "json":
        render.print_json({"diff": result})
    else:
        print(launches_diff_table(result, cmp, plans))
    # which devices (by index) a group was placed on is shown, not counted: two launches side by side
    # always differ there, and the plan already says which hardware they were for
    ran_differently = [r for r in ran if r["field"] != "devices"]
    return 1 if ns.exit_code and (not cmp.same or ran_differently) else 0


def launches_diff_table(d: dict[str, Any], cmp: Any, plans: list[Plan]) -> str:
    lines = [f"{label}: {x['launch']} ({x['state']}; {x['plan']}, {x['policy']} {x['policy_version']}, plan "
             f"{x['plan_hash'][:12]}{'; rerun of ' + x['rerun_of'] if x['rerun_of'] else ''})"
             for label, x in (("a", d["a"]), ("b", d["b"]))]
    if cmp.same:
        lines.append("\nthe plans: no differences in their fields")
    else:
        lines += ["\nthe plans", render.table(["field", "a", "b", "decided by (a)", "decided by (b)"],
                                              [(f, _show(x), _show(y), _trail(plans[0], f), _trail(plans[1], f))
                                               for f, x, y in cmp.changes])]
    if cmp.only_a or cmp.only_b:
        lines.append(f"rules only in a: {', '.join(cmp.only_a) or '-'}\nrules only in b: {', '.join(cmp.only_b) or '-'}")
    lines += (["\nwhat ran", render.table(["field", "a", "b"], [(r["field"], r["a"], r["b"]) for r in d["ran"]])]
              if d["ran"] else ["\nwhat ran: the same"])
    if d["ran_alike"]:
        lines.append(f"a and b ran alike: their plans differ only in {', '.join(d['ran_alike'])}, which these workers "
                     "substituted away or did not apply, so a difference measured below is the machine's, not the "
                     "plans'")
    if d["measured"]:
        lines += ["\nmeasured", render.table(["metric", "a", "b", "b - a", "b / a"],
                                             [(m["metric"], _number(m["a"], "g"), _number(m["b"], "g"),
                                               _number(m["b_minus_a"], "+g"), _number(m["b_over_a"], ".2f", "x"))
                                              for m in d["measured"]])]
    lines.append(f"({d['note']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- policy impact


def impact_table(impact: dict[str, Any], style: render.Style) -> str:
    base, cand = impact["baseline"], impact["candidate"]
    scope = f" matching {impact['filter']!r}" if impact.get("filter") else ""
    if impact["specs_examined"] == 0:
        return (f"the audit history holds no ResolvePlan or CreateLaunch specs{scope}: nothing to compare "
                f"({base['name']} vs {cand['name']})")
    sides = (" ".join(filter(None, (base["name"], base["version"]))), f"{cand['name']} {cand['version']}")
    lines = [style(" -> ".join(sides), render.BOLD),
             f"{render.counted(impact['specs_examined'], 'distinct spec')} in "
             f"{render.counted(impact['records_examined'], 'record')}{scope}: "
             f"{impact['changed_total']} changed, {impact['newly_refused_total']} newly refused, "
             f"{impact['newly_accepted_total']} newly accepted, {impact['unchanged']} unchanged"]
    under = ", ".join(f"{r['policy']} {r['version'] or '?'} ({r['records']})" for r in impact["recorded_under"])
    if under:
        lines.append(f"recorded under: {under}")
    if impact.get("baseline_unknown"):
        lines.append(f"not compared: {render.counted(impact['baseline_unknown'], 'spec')} with no recorded plan or "
                     "refusal (records written before records held plans)")
    if impact["by_field"]:  # summed on the server over every changed spec
        lines += ["", style("changes, by field", render.BOLD),
                  render.table(["field", base["name"], cand["name"], "specs", "records",
                                f"decided by ({base['name']})", f"decided by ({cand['name']})", "examples"],
                               [(g["field"], _show(g["baseline"]), _show(g["candidate"]), g["specs"], g["records"],
                                 " | ".join(g["baseline_rules"]), " | ".join(g["candidate_rules"]),
                                 "; ".join(f"{e['model']} on {e['gpu']} ({e['record']})" for e in g["examples"]))
                                for g in impact["by_field"]])]
    before = "in the log" if base["name"] == "recorded" else f"under {base['name']}"
    for key, title in (("newly_refused", f"refused under {cand['name']} only"),
                       ("newly_accepted", f"refused {before} only")):
        if impact[key]:
            lines += ["", style(title, render.BOLD),
                      render.table(["model", "gpu", "records", "refusal", "example"],
                                   [(r["model"], r["gpu"], r["records"],
                                     f"{r['code']}: {r['message'][:90]}", r["example_record"]) for r in impact[key]])]
    short = [f"{len(impact[key])} of the {impact[f'{key}_total']} {words}" for key, words in
             (("changed", "changed specs"), ("newly_refused", "newly refused"), ("newly_accepted", "newly accepted"))
             if len(impact[key]) < impact[f"{key}_total"]]
    if short:
        lines += ["", f"(the answer lists {', '.join(short)}: as many as fit in one message; the counts and the "
                      "changes by field cover them all, and --filter narrows the history for the rest)"]
    return "\n".join(lines)


def cmd_policy_impact(ns: argparse.Namespace) -> int:
    if sys.stderr.isatty():
        print(f"re-resolving the audit history of {ns.server} under {ns.baseline or 'cgsvc'} and {ns.candidate} ...",
              file=sys.stderr, flush=True)
    with Client.from_args(ns) as c:
        impact = c.policy_impact(ns.candidate, ns.baseline or "", ns.filter or "")
    if render.output_mode(ns) == "json":
        render.print_json({"impact": impact})
    else:
        print(impact_table(impact, render.Style(sys.stdout.isatty())))
    moved = impact["changed_total"] + impact["newly_refused_total"] + impact["newly_accepted_total"]
    return 1 if ns.exit_code and moved else 0


# ---------------------------------------------------------------------------- experiments


def _ci(stat: dict[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "-"
    ci = stat.get("ci")
    return f"{stat['mean']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{stat['mean']:.2f} [too few samples]"


def experiment_table(d: dict[str, Any], style: render.Style) -> str:
    wl = d.get("workload", {})
    runs = d.get("runs", [])
    rows = [("experiment", f"{d['name']} ({d['state']})"),
            ("arms", f"A {d['plans'][0]}   B {d['plans'][1]}"),
            ("workload", f"{render.workload_text(wl)}; {render.counted(d['repeats'], 'launch')} per arm on {d['dispatcher']} "
                         f"({d['model_path']})"),
            ("engine", render.engine_text(d.get("engine") or {})),
            ("runs", ", ".join(f"{r['arm']}{r['repeat']} {r['launch']} {r['state']}" for r in runs) or "-")]
    if d.get("rerun_of"):
        rows.insert(1, ("rerun of", d["rerun_of"]))
    if d.get("labels"):
        rows.insert(1, ("labels", labels_text(d["labels"])))
    if d.get("cancel_requested_by") and d["state"] == "RUNNING":
        rows.append(("cancel", f"asked by {d['cancel_requested_by']}: it ends once its current launch has stopped"))
    if d.get("error"):
        rows.append(("error", d["error"]))
    rows.append(("audit", ", ".join(d.get("audit_records", []))))
    out = render.fields(rows, style)
    res = d.get("result") or {}
    arms, diff = res.get("arms", {}), res.get("difference", {})
    if arms:
        table_rows: list[tuple[Any, ...]] = [(arm, arms[arm].get("plan", ""), int(arms[arm].get("ttft_ms", {}).get("n") or 0),
                       _ci(arms[arm].get("ttft_ms")), _ci(arms[arm].get("tpot_ms"))) for arm in ("A", "B")]
        table_rows.append(("B - A", "", "", _ci(diff.get("ttft_ms")), _ci(diff.get("tpot_ms"))))
        if any((diff.get(m) or {}).get("launch_level") for m in ("ttft_ms", "tpot_ms")):
            table_rows.append(("B - A, over launch means", "", "", _ci((diff.get("ttft_ms") or {}).get("launch_level")),
                               _ci((diff.get("tpot_ms") or {}).get("launch_level"))))
        out += "\n\n" + render.table(["arm", "plan", "requests", "TTFT ms mean [95% CI]", "TPOT ms mean [95% CI]"],
                                      table_rows)
        for arm in ("A", "B"):
            for line in arms[arm].get("substituted", []):
                out += f"\n{arm} ran substituted: {line}"
        out += "\n\n" + style(f"verdict: {res.get('verdict', '')}", render.BOLD)
        out += f"\n({res.get('method', '')})"
    return out


def _experiment_progress(msg: Any, last: list[str]) -> None:
    done = sum(1 for r in msg.runs if r.state in LAUNCH_ENDED)
    total = 2 * msg.repeats
    current = msg.runs[-1] if msg.runs else None
    line = f"{msg.state:<9} {done}/{total} launches" + (
        f"; {current.arm}{current.repeat} {current.launch} {current.state}" if current else "")
    if line != last[0]:
        print(line, file=sys.stderr, flush=True)
        last[0] = line


def cmd_experiment_run(ns: argparse.Namespace) -> int:
    plans = [resource_name("plans", p) for p in ns.plans + ns.plan]
    if len(plans) != 2:
        raise bad("plans", f"give two plans, A (the baseline) then B: `experiment run A B` or --plan A --plan B; "
                           f"got {len(plans)}")
    with Client.from_args(ns) as c:
        msg = c.create_experiment(plans, os.path.abspath(ns.checkpoint), workload(ns), ns.repeats,
                                  ns.dispatcher or "", engine(ns), request_id=ns.request_id, labels=labels(ns))
        print(f"{msg.name}: {plans[0]} (A) vs {plans[1]} (B), {render.counted(ns.repeats, 'launch')} per arm, interleaved",
              file=sys.stderr, flush=True)
        if not ns.detach:
            return wait_for_experiment(c, msg, ns)
    _print_experiment(msg, ns)
    return 0


def _print_experiment(msg: Any, ns: argparse.Namespace) -> None:
    d = codec.experiment_dict(msg)
    if render.output_mode(ns) == "json":
        render.print_json({"experiment": d})
    else:
        print(experiment_table(d, render.Style(sys.stdout.isatty())))


def wait_for_experiment(c: Client, msg: Any, ns: argparse.Namespace) -> int:
    """Follow an experiment to its end (progress on stderr), print it, and exit 0 when it
    SUCCEEDED, 4 when it ended otherwise, 130 on Ctrl-C (the experiment goes on)."""
    last = [""]
    try:
        for update in c.watch_experiment(msg.name, on_resume=resumed(msg.name)):
            msg = update
            _experiment_progress(update, last)
    except KeyboardInterrupt:  # the experiment is the server's: stop waiting, say how to reach it
        print(f"\nstopped waiting: {msg.name} goes on ({msg.state}); `cgsvc-cli experiments wait "
              f"{msg.name}` waits again, `cgsvc-cli experiments cancel {msg.name}` stops it, keeping what it "
              "measured", file=sys.stderr)
        if render.output_mode(ns) == "json":
            render.print_json({"experiment": codec.experiment_dict(msg)})
        return INTERRUPTED
    msg = c.get_experiment(msg.name)
    _print_experiment(msg, ns)
    return 0 if msg.state == "SUCCEEDED" else 4


def cmd_experiments_rerun(ns: argparse.Namespace) -> int:
    """The experiment again as it was asked for (the server reads its plans, workload, checkpoint,
    repeats, dispatcher and engine settings), followed as `experiment run` follows one."""
    with Client.from_args(ns) as c:
        msg = c.rerun_experiment(resource_name("experiments", ns.name), request_id=ns.request_id, labels=labels(ns))
        print(f"{msg.name}: {msg.rerun_of} again ({msg.plans[0]} (A) vs {msg.plans[1]} (B), "
              f"{render.counted(msg.repeats, 'launch')} per arm); `cgsvc-cli experiments diff {msg.rerun_of} {msg.name}` holds their verdicts side by side",
              file=sys.stderr, flush=True)
        if not ns.detach:
            return wait_for_experiment(c, msg, ns)
    _print_experiment(msg, ns)
    return 0


def cmd_experiments_wait(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        return wait_for_experiment(c, c.get_experiment(resource_name("experiments", ns.name)), ns)


def cmd_experiments_label(ns: argparse.Namespace) -> int:
    set_labels, remove = label_changes(ns)
    with Client.from_args(ns) as c:
        msg = c.label_experiment(resource_name("experiments", ns.name), set_labels, remove)
    if render.output_mode(ns) == "json":
        render.print_json({"experiment": codec.experiment_dict(msg)})
    else:
        print(f"{msg.name}: labels {labels_text(msg.labels)} (its launches keep the labels they were made with)")
    return 0


def cmd_experiments_cancel(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        msg = c.cancel_experiment(resource_name("experiments", ns.name))
    if render.output_mode(ns) == "json":
        render.print_json({"experiment": codec.experiment_dict(msg)})
    else:
        print(f"{msg.name}: cancel asked by {msg.cancel_requested_by} ({msg.state}); it ends CANCELLED once its "
              f"current launch has stopped (`cgsvc-cli experiments show {msg.name}`)")
    return 0


def cmd_experiments_show(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        _print_experiment(c.get_experiment(resource_name("experiments", ns.name)), ns)
    return 0


def brief_verdict(experiment: dict[str, Any]) -> str:
    """Each metric's call in a few words (an experiment stored before there was one: the
    verdict's first 80 characters); `experiments show` has the whole verdict."""
    return str((experiment.get("result") or {}).get("verdict_brief") or experiment.get("verdict", "")[:80])


def cmd_experiments_list(ns: argparse.Namespace) -> int:
    keys = label_columns(ns)
    with Client.from_args(ns) as c:
        if streamed(ns, c.list_experiments, "experiments", codec.experiment_dict):
            return 0
        found, token = listing(ns, c.list_experiments, "experiments")
    items = [codec.experiment_dict(m) for m in found]
    if render.output_mode(ns) == "json":
        render.print_json({"experiments": items, "next_page_token": token})
        return 0
    print(render.page(["name", "state", "A", "B", "launches", "created", "verdict", *keys],
                      [(d["name"], d["state"], d["plans"][0], d["plans"][1], len(d.get("runs", [])),
                        d.get("create_time", ""), brief_verdict(d), *(d.get("labels", {}).get(k, "-") for k in keys))
                       for d in items], token, "experiments", list_filter(ns)))
    return 0


def _call_words(metric: str) -> Callable[[dict[str, Any]], str]:
    """What an experiment's stored result says of one metric, in the words of `experiments list`'s
    verdict ("B faster", "cannot tell", ...); "-" before it has a result."""
    def words(x: dict[str, Any]) -> str:
        from cgsvc.domain import stats  # numpy: only the commands that read a result need it

        return stats.CALL_WORDS[stats.metric_call(x["result"], metric)["call"]] if x.get("result") else "-"
    return words


# What `experiments summary --by` groups experiments by: a field of the experiment as
# experiment_dict gives it, or what its result says.
EXPERIMENT_FIELDS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "state": lambda x: x["state"],
    "principal": lambda x: x.get("principal") or "-",
    "day": lambda x: x.get("create_time", "")[:10] or "-",  # made that UTC day
    "a": lambda x: x["plans"][0] if x.get("plans") else "-",
    "b": lambda x: x["plans"][1] if len(x.get("plans", [])) > 1 else "-",
    "dispatcher": lambda x: x.get("dispatcher") or "-",
    "model_path": lambda x: x.get("model_path") or "-",
    "repeats": lambda x: x.get("repeats", 0),
    "rerun_of": lambda x: x.get("rerun_of") or "-",
    "ttft": _call_words("ttft_ms"),
    "tpot": _call_words("tpot_ms"),
    # yes: the arms' plans differ only in fields the workers substituted away, so a difference is the machine's
    "ran_alike": lambda x: ("yes" if x["result"].get("ran_alike") else "no") if x.get("result") else "-",
}
EXPERIMENT_MEASURES: dict[str, Any] = {
    "succeeded": ((lambda x: 1 if x["state"] == "SUCCEEDED" else None), sum),
    "launches": ((lambda x: len(x.get("runs", []))), sum),
}


def cmd_experiments_summary(ns: argparse.Namespace) -> int:
    """The experiments grouped by the --by fields: how many, how many succeeded, their launches."""
    with Client.from_args(ns) as c:
        def fetch(query: str, size: int, token: str, **order: Any) -> Any:
            page = c.list_experiments(query, size, token, **order)
            return argparse.Namespace(experiments=[codec.experiment_dict(m) for m in page.experiments],
                                      next_page_token=page.next_page_token)
        by, total, groups = summarize(ns, fetch, "experiments", EXPERIMENT_FIELDS, EXPERIMENT_MEASURES,
                                      label=lambda x, key: x.get("labels", {}).get(key, "-"))  # "-": none
    if render.output_mode(ns) == "json":
        render.print_json({"summary": {"by": by, "experiments": total, "groups": groups}})
        return 0
    print(render.table([*by, "experiments", "succeeded", "launches"],
                       [(*(g[f] for f in by), g["experiments"], g["succeeded"] or 0, g["launches"]) for g in groups]))
    print(f"{render.counted(total, 'experiment')} in {render.counted(len(groups), 'group')}")
    return 0


EXPERIMENT_REQUEST = ("plans", "workload", "model_path", "repeats", "dispatcher", "engine")
METRIC_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT"}


def cmd_experiments_diff(ns: argparse.Namespace) -> int:
    """Two experiments (an experiment and its rerun, typically) side by side: whether each asked
    for the same thing, and metric by metric whether their calls agree."""
    from cgsvc.domain import stats  # numpy: only this command needs it

    names = two_names(ns, "experiments")
    with Client.from_args(ns) as c:
        a, b = (codec.experiment_dict(c.get_experiment(n)) for n in names)
    swapped = a["plans"] != b["plans"] and a["plans"] == b["plans"][::-1]  # b's A is a's B: read b reversed
    differs = [f for f in EXPERIMENT_REQUEST if a.get(f) != b.get(f) and not (f == "plans" and swapped)]
    metrics = stats.compare(a.get("result") or {}, b.get("result") or {}, swapped=swapped)
    sides = [{"experiment": x["name"], "state": x["state"], "plans": x["plans"], "repeats": x["repeats"],
              "rerun_of": x.get("rerun_of", ""), "ran_alike": (x.get("result") or {}).get("ran_alike", [])}
             for x in (a, b)]
    result = {"a": sides[0], "b": sides[1], "arms_swapped": swapped, "request_differs": differs, "metrics": metrics}
    if render.output_mode(ns) == "json":
        render.print_json({"diff": result})
    else:
        print(experiments_diff_table(result))
    return 1 if ns.exit_code and any(m["agreement"] not in ("held", "neither can tell") for m in metrics) else 0


def experiments_diff_table(d: dict[str, Any]) -> str:
    lines = [f"{label}: {x['experiment']} ({x['state']}; {x['plans'][0]} (A) vs {x['plans'][1]} (B), "
             f"{render.counted(x['repeats'], 'launch')} per arm{'; rerun of ' + x['rerun_of'] if x['rerun_of'] else ''})"
             for label, x in (("a", d["a"]), ("b", d["b"]))]
    lines.append("the same request" if not d["request_differs"] else
                 f"the requests differ in: {', '.join(d['request_differs'])}")
    if d["arms_swapped"]:
        lines.append("b ran a's plans with the arms the other way round: its calls below are read reversed, as a's "
                     "A and B")

    def said(m: dict[str, Any]) -> str:
        return m["brief"].split(" ", 1)[1]  # the call, without the metric's name

    lines.append("\n" + render.table(["metric", "a says", "b says", "agreement"],
                                     [(METRIC_NAMES.get(m["metric"], m["metric"]), said(m["a"]), said(m["b"]),
                                       m["agreement"]) for m in d["metrics"]]))
    for label, x in (("a", d["a"]), ("b", d["b"])):
        if x["ran_alike"]:
            lines.append(f"\nin {label}, A and B ran alike (their plans differ only in {', '.join(x['ran_alike'])}, which "
                         "the workers substituted away or did not apply): its calls are the machine's, not the plans'")
    if any(m["agreement"] == "flipped" for m in d["metrics"]):
        lines.append("\na verdict that flips between runs of one request is the machine's noise, not the plans': "
                     "add repeats")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- registration


def register_diff(plans: Any) -> None:
    """`plans diff`, under the `plans` command group."""
    d = plans.add_parser("diff", help="compare two plans: plans/ID, plan files or spec files (resolved here)")
    d.add_argument("a", help="plans/ID, a plan file (resolve -o json, plans show -o json) or a launch spec file; - reads standard input")
    d.add_argument("b", help="the same kinds as A (standard input only once)")
    d.add_argument("--policy-a", help="policy to resolve A under when it is a spec file (default cgsvc)")
    d.add_argument("--policy-b", help="policy to resolve B under when it is a spec file (default cgsvc)")
    d.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the plans differ, 0 when not (git's convention; failures exit 2 or more)")
    add_output(d)
    add_server(d)
    d.set_defaults(func=cmd_plans_diff)


def register_launch_diff(launches: Any) -> None:
    """`launches diff`, under the `launches` command group."""
    d = launches.add_parser("diff", help="compare two launches: their plans (and the rules behind them), what "
                                         "each ran, and what each measured")
    d.add_argument("a", help="launches/ID (or the bare ID): the baseline")
    d.add_argument("b", help="launches/ID (or the bare ID)")
    d.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the plans or what ran differ (devices aside), 0 when not (the measurements "
                        "always differ)")
    add_output(d)
    add_server(d, required=True)
    d.set_defaults(func=cmd_launches_diff)


def register(sub: Any) -> None:
    pl = sub.add_parser("policies", help="the policies a plan can be resolved under, with their versions")
    add_list_verb(pl)
    add_output(pl)
    add_server(pl)
    pl.set_defaults(func=cmd_policies)

    pol = sub.add_parser("policy", help="policy evidence").add_subparsers(dest="policy_command", required=True)
    im = pol.add_parser("impact", help="what a candidate policy would change across the audit history")
    im.add_argument("--candidate", required=True, help="the policy to evaluate, e.g. sglang-0.5.17")
    im.add_argument("--baseline", help="the policy to compare against (default cgsvc), or recorded: the plans the "
                    "log holds for each spec under the candidate's own policy (its latest record with one), to weigh a "
                    "change to that policy's rules against what it resolved before")
    im.add_argument("--filter", help='restrict the history, as audit list does, e.g. gpu = "GB300"')
    im.add_argument("--exit-code", action="store_true",
                    help="exit 1 when any spec's plan changes or is newly refused or accepted, 0 when none does: a "
                         "gate for CI (failures exit 2 or more)")
    add_output(im)
    add_server(im, required=True)
    im.set_defaults(func=cmd_policy_impact)

    ex = sub.add_parser("experiment", help="A/B experiments on real worker groups").add_subparsers(
        dest="experiment_command", required=True)
    run = ex.add_parser("run", help="run two stored plans as interleaved launches (A B A B ...) and compare them")
    run.add_argument("plans", nargs="*", metavar="PLAN", help="plans/ID (or ID) of A (the baseline), then of B")
    run.add_argument("--plan", action="append", default=[],
                     help="plans/ID, the other way to give them: --plan A --plan B")
    add_workload(run)
    run.add_argument("--repeats", type=int32, default=3, help="launches per arm (default 3)")
    run.add_argument("--detach", action="store_true", help="answer once it has started (follow it with experiments show)")
    run.add_argument("--request-id", help="idempotency key: a retry with the same id answers with the experiment the "
                                          "first started, starting nothing (default: a fresh id per invocation)")
    add_labels(run, "a name of your own for the experiment (repeatable; lower-case letters, digits, _ and -), which "
                    "its launches carry too: experiments list (or launches list) --filter 'labels.KEY = \"VALUE\"'")
    add_output(run)
    add_server(run, required=True)
    run.set_defaults(func=cmd_experiment_run)

    exs = sub.add_parser("experiments", help="stored experiments").add_subparsers(
        dest="experiments_command", required=True)
    el = exs.add_parser("list", help="list experiments")
    add_listing(el, 'state = "SUCCEEDED"')
    add_label_columns(el, "an experiment")
    el.set_defaults(func=cmd_experiments_list)
    esum = exs.add_parser("summary", help="experiments counted by some fields, such as what each found of TTFT and "
                                          "TPOT (with how many succeeded and their launches)")
    add_summary(esum, "state,ttft,tpot", {**EXPERIMENT_FIELDS, "labels.KEY": None}, 'labels.team = "infra"')
    esum.set_defaults(func=cmd_experiments_summary)
    es = exs.add_parser("show", help="one experiment: its launches, statistics and verdict")
    es.add_argument("name", help="experiments/ID or ID")
    es.set_defaults(func=cmd_experiments_show)
    ec = exs.add_parser("cancel", help="stop a running experiment: no further launch, the running one cancelled; "
                                       "it ends CANCELLED, keeping what it measured")
    ec.add_argument("name", help="experiments/ID or ID")
    ec.set_defaults(func=cmd_experiments_cancel)
    elab = exs.add_parser("label", help="set or remove an experiment's labels, in any state (audited; the others are "
                                        "kept, and so are its launches')")
    add_label_changes(elab, "experiments")
    elab.set_defaults(func=cmd_experiments_label)
    ew = exs.add_parser("wait", help="follow an experiment until it ends (progress on stderr), then show it: exit 0 "
                                     "when it SUCCEEDED, 4 when it ended otherwise; Ctrl-C stops the waiting only")
    ew.add_argument("name", help="experiments/ID or ID")
    ew.set_defaults(func=cmd_experiments_wait)
    er = exs.add_parser("rerun", help="run an experiment again as it was asked for (its plans, workload, checkpoint, "
                                      "repeats, dispatcher, engine settings), to see whether its result holds; "
                                      "followed to the end as experiment run is")
    er.add_argument("name", help="experiments/ID or ID")
    er.add_argument("--detach", action="store_true", help="answer once it has started (follow it with experiments "
                                                          "wait)")
    er.add_argument("--request-id", help="idempotency key: a retry with the same id answers with the rerun the first "
                                         "started (default: a fresh id per invocation)")
    add_labels(er, "the rerun's labels (repeatable), in place of the experiment's own, which it keeps otherwise")
    er.set_defaults(func=cmd_experiments_rerun)
    ed = exs.add_parser("diff", help="two experiments side by side (an experiment and its rerun): whether they asked "
                                     "for the same thing, and per metric whether their verdicts agree")
    ed.add_argument("a", help="experiments/ID (or the bare ID): the first")
    ed.add_argument("b", help="experiments/ID (or the bare ID): the one to hold against it")
    ed.add_argument("--exit-code", action="store_true",
                    help="exit 1 when a metric's verdict did not hold (flipped, or only one can tell), 0 when not")
    ed.set_defaults(func=cmd_experiments_diff)
    for parser in (el, esum, es, ec, elab, ew, er, ed):
        add_output(parser)
        add_server(parser, required=True)
