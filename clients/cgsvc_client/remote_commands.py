"""`cgsvc-cli` commands that talk to a server: plans list|show, audit list|show|verify|checkpoint|prove
(and audit witness, from witness.py)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from cgsvc import codec
from cgsvc.audit import checkpoint, keys, merkle
from cgsvc.errors import CODE_NAMES, ServiceError
from cgsvc.v1 import audit_pb2
from cgsvc_client import checkpoints, evidence_commands, render, witness
from cgsvc_client.args import (
    add_explain,
    add_follow,
    add_listing,
    add_output,
    add_server,
    add_summary,
    bad,
    each_page,
    explained_field,
    follow,
    list_filter,
    listing,
    resource_name,
    streamed,
    summarize,
)
from cgsvc_client.client import Client


def as_dict(msg: Message) -> dict[str, Any]:
    """A message as `-o json` prints it: proto field names, 64-bit integers as numbers."""
    return codec.int64_as_numbers(msg, json_format.MessageToDict(msg, preserving_proto_field_name=True))


def plans_list(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        if streamed(ns, c.list_plans, "plans", codec.plan_dict_from_proto_resource):
            return 0
        plans, token = listing(ns, c.list_plans, "plans")
    if render.output_mode(ns) == "json":
        render.print_json({"plans": [codec.plan_dict_from_proto_resource(p) for p in plans], "next_page_token": token})
        return 0
    print(render.page(["name", "created", "model", "gpu", "policy", "prefill", "decode", "attention", "audit"],
                      [(p.name, p.create_time.ToJsonString(), p.spec.model.name or p.spec.model.path,
                        p.spec.hardware.gpu, p.policy or "cgsvc", p.prefill.backend, p.decode.backend,
                        f"{p.attention_backend.prefill}/{p.attention_backend.decode}", p.audit_record)
                       for p in plans], token, "plans", list_filter(ns)))
    return 0


PLAN_FILTER_EXAMPLE = 'model = "deepseek-ai/DeepSeek-V3" AND gpu = "H100"'

# What `plans summary --by` groups stored plans by: a plan's field, read off its message.
SUMMARY_FIELDS: dict[str, Callable[[Any], Any]] = {
    "model": lambda p: p.spec.model.name or p.spec.model.path,
    "gpu": lambda p: p.spec.hardware.gpu,
    "tp": lambda p: p.spec.parallelism.tp,
    "prefill_backend": lambda p: p.prefill.backend,
    "decode_backend": lambda p: p.decode.backend,
    "attention_prefill": lambda p: p.attention_backend.prefill,
    "attention_decode": lambda p: p.attention_backend.decode,
    "kv_cache_dtype": lambda p: p.kv_cache_dtype,
    "policy": lambda p: p.policy or "cgsvc",
    "policy_version": lambda p: p.policy_version,
    "day": lambda p: p.create_time.ToJsonString()[:10],  # made that UTC day
    # every rule that decided a field or warned (a list: the plan counts once under each)
    "rule_id": lambda p: list(dict.fromkeys([d.rule_id for d in p.decisions] + [w.rule_id for w in p.warnings])) or ["-"],
}


def print_counts(ns: argparse.Namespace, field: str, by: list[str], total: int, groups: list[dict[str, Any]]) -> int:
    """A counting summary's answer (summarize()'s, of `field`: plans, records): JSON, or a table of
    the groups with each one's share, then the totals."""
    if render.output_mode(ns) == "json":
        render.print_json({"summary": {"by": by, field: total, "groups": groups}})
        return 0
    print(render.table([*by, field, "share"], [(*(g[f] for f in by), g[field], f"{g[field] / total:.0%}")
                                               for g in groups]))
    each = f"; a {field.removesuffix('s')} counts once under each rule it used" if "rule_id" in by else ""
    print(f"{render.counted(total, field.removesuffix('s'))} in {render.counted(len(groups), 'group')}{each}")
    return 0


def plans_summary(ns: argparse.Namespace) -> int:
    """How many stored plans share each value of the --by fields: what the fleet runs."""
    with Client.from_args(ns) as c:
        return print_counts(ns, "plans", *summarize(ns, c.list_plans, "plans", SUMMARY_FIELDS))


def plans_show(ns: argparse.Namespace) -> int:
    name = resource_name("plans", ns.name)
    explain = explained_field(ns.explain) if ns.explain else None
    with Client.from_args(ns) as c:
        msg = c.get_plan(name)
    if render.output_mode(ns) == "json" and explain:
        render.print_json({"explain": {"field": explain, "name": msg.name, "audit_record": msg.audit_record,
                                       "create_time": msg.create_time.ToJsonString(),
                                       "decisions": [d.to_dict() for d in codec.plan_from_proto(msg).decisions_for(explain)]}})
    elif render.output_mode(ns) == "json":
        render.print_json({"plan": codec.plan_dict_from_proto_resource(msg)})
    else:
        print(f"{msg.name}  created {msg.create_time.ToJsonString()}  audit {msg.audit_record}\n")
        print(render.plan_table(codec.plan_from_proto(msg), render.Style(sys.stdout.isatty()), explain))
    return 0


def _record_model(r: Any) -> str:
    """The model a record is filed under (what `model = X` matches: a catalog id, or the path of a
    spec that names its model by path alone); a record from before that column, its spec's name."""
    if r.model:
        return str(r.model)
    return str(json.loads(r.spec_json).get("model", {}).get("name", "-")) if r.spec_json else "-"


def _record_row(r: Any) -> tuple[Any, ...]:
    return (r.sequence, r.time.ToJsonString(), r.principal or "-", r.method.rsplit("/", 1)[-1],
            _record_model(r),
            CODE_NAMES.get(r.outcome_code, str(r.outcome_code)), r.plan_id or "-", r.launch_id or "-",
            (r.outcome_message.splitlines() or ["-"])[0][:60], r.record_hash[:12])


RECORD_COLUMNS = ("seq", "time", "principal", "method", "model", "outcome", "plan", "launch", "detail", "hash")
# What `audit summary --by` groups records by, as `audit list` shows them.
RECORD_FIELDS: dict[str, Callable[[Any], Any]] = {
    "method": lambda r: r.method.rsplit("/", 1)[-1],
    "outcome": lambda r: CODE_NAMES.get(r.outcome_code, str(r.outcome_code)),
    "principal": lambda r: r.principal or "-",
    "model": _record_model,
    "gpu": lambda r: r.gpu or "-",
    "policy": lambda r: r.policy or "cgsvc",
    "day": lambda r: r.time.ToJsonString()[:10],  # UTC
    "rule_id": lambda r: list(r.rule_ids) or ["-"],  # a list, as plans': "-" for a record of no resolution
}


def records_of(c: Client, whole: bool) -> Callable[..., Any]:
    """ListAuditRecords as a command reads it: `whole` records (for -o json), or the basic view,
    without each record's plan JSON and hashed bytes (several KiB each), for a table or a count."""
    return functools.partial(c.list_audit_records, view=audit_pb2.AUDIT_RECORD_VIEW_FULL if whole else audit_pb2.AUDIT_RECORD_VIEW_BASIC)


def audit_summary(ns: argparse.Namespace) -> int:
    """How many records share each value of the --by fields: who calls what, and how it ends."""
    with Client.from_args(ns) as c:
        return print_counts(ns, "records", *summarize(ns, records_of(c, whole=False), "records", RECORD_FIELDS))


def audit_list(ns: argparse.Namespace) -> int:
    if ns.follow:
        return follow_records(ns)
    with Client.from_args(ns) as c:
        if streamed(ns, c.list_audit_records, "records", as_dict):
            return 0
        records, token = listing(ns, records_of(c, render.output_mode(ns) == "json"), "records")
    if render.output_mode(ns) == "json":
        render.print_json({"records": [as_dict(r) for r in records], "next_page_token": token})
        return 0
    print(render.page(RECORD_COLUMNS, [_record_row(r) for r in records], token, "audit records", list_filter(ns)))
    return 0


def follow_records(ns: argparse.Namespace) -> int:
    """`audit list --follow`, as `tail -f`: the records that match, in sequence order, as they
    commit — from the end of the log now, or with --all from the start. Polls ListAuditRecords
    for sequence > the last seen, so it sees what every replica on the database commits.
    JSON: one {"record": ...} line each."""
    if ns.order_by:
        raise bad("order_by", "--follow reads the log forward, in the order records commit: drop --newest-first")
    as_json = render.output_mode(ns) == "json"
    user_filter = list_filter(ns)
    widths = [len(h) for h in RECORD_COLUMNS]  # a table's columns widen as wider cells come, never narrow
    last = 0

    def emit(records: Any) -> None:
        nonlocal last
        for r in records:
            last = r.sequence
            if as_json:
                print(json.dumps({"record": as_dict(r)}, ensure_ascii=False), flush=True)
                continue
            cells = [str(c) for c in _record_row(r)]
            widths[:] = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip(), flush=True)

    with Client.from_args(ns) as c:
        def first() -> bool:
            nonlocal last
            if not as_json:
                print("  ".join(RECORD_COLUMNS), flush=True)
            if ns.all:
                emit(listing(ns, records_of(c, as_json), "records")[0])
            else:
                last = c.get_checkpoint().tree_size
            print(f"following the audit log after auditRecords/{last}" + (f" where {user_filter}" if user_filter else "")
                  + f", every {ns.interval:g} s; Ctrl-C stops", file=sys.stderr, flush=True)
            return False

        def step() -> bool:
            query = " AND ".join(f for f in (user_filter, f"sequence > {last}") if f)  # AND binds loosest
            for records, _ in each_page(records_of(c, as_json), "records", query, 1000):
                emit(records)
            return False
        return follow(ns, first, step)


def audit_show(ns: argparse.Namespace) -> int:
    name = resource_name("auditRecords", ns.name)
    with Client.from_args(ns) as c:
        rec = c.get_audit_record(name)
    d = as_dict(rec)
    if render.output_mode(ns) == "json":
        render.print_json({"record": d})
        return 0
    style = render.Style(sys.stdout.isatty())
    spec = json.dumps(json.loads(d["spec_json"]), separators=(",", ":")) if d.get("spec_json") else ""
    # the hashed bytes hold the plan again: on a terminal their size, the plan as a table below
    hashed = f"{len(rec.hashed_json.encode())} bytes (-o json shows them; audit verify checks them)"
    rows = [(k, spec if k == "spec_json" else hashed if k == "hashed_json" else
             ", ".join(map(str, v)) if isinstance(v, list) else str(v))
            for k, v in d.items() if k not in ("plan_json", "outcome_code", "outcome_message")]
    outcome = CODE_NAMES.get(rec.outcome_code, str(rec.outcome_code))  # OK is the proto default, absent from d
    at = next(i for i, (k, _) in enumerate(rows) if k == "method") + 1 if "method" in d else len(rows)
    rows.insert(at, ("outcome", f"{outcome}: {rec.outcome_message}" if rec.outcome_message else outcome))
    print(render.fields(rows, style))
    if d.get("plan_json"):  # the plan it recorded, as resolve shows one: modes, then the decision trail
        try:
            shown = render.plan_table(codec.plan_from_dict(json.loads(d["plan_json"])), style)
        except (KeyError, TypeError, ValueError):  # a plan of an older record schema: its JSON as kept
            shown = json.dumps(json.loads(d["plan_json"]), indent=2)
        print(f"\n{shown}")
    return 0


def _answer(ns: argparse.Namespace, key: str, result: dict[str, Any], text: str) -> int:
    if render.output_mode(ns) == "json":
        render.print_json({key: result})
    else:
        print(text)
    return 0 if result["ok"] else 3


def audit_checkpoint(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        cp = codec.checkpoint_from_proto(c.get_checkpoint())
    checkpoint.verify(cp)
    if render.output_mode(ns) == "json":
        render.print_json({"checkpoint": cp.to_dict()})
    else:
        print(render.table(["field", "value"], list(cp.to_dict().items())))
    return 0


def audit_keys(ns: argparse.Namespace) -> int:
    """The keys that have signed this log, oldest first, each rotation's signature checked here."""
    with Client.from_args(ns) as c:
        records = checkpoints.rotation_records(c)
        try:
            current = codec.checkpoint_from_proto(c.get_checkpoint()).key_id
            signing = ""
        except ServiceError as exc:  # a replica left on a retired key: its answer says which key replaced it
            current, signing = "", f"{exc.code}: {exc.message}"
    rows: list[dict[str, Any]] = []
    for rec in records:
        row: dict[str, Any] = {"record": f"auditRecords/{rec.sequence}", "time": rec.time.ToJsonString()}
        try:
            rot = keys.Rotation.from_record(rec.sequence, rec.spec_json)
        except ValueError as exc:
            rows.append({**row, "reason": "malformed", "endorsed": False, "detail": str(exc)})
            continue
        try:
            keys.check(rot)
            handed = (rot.endorsement or {}).get("tree_size")
            endorsed, detail = True, f"signed by {rot.previous_key_id[:16]}... over the tree of {handed} records"
        except checkpoint.CheckpointError as exc:
            endorsed, detail = False, str(exc)
        rows.append({**row, "reason": rot.reason, "from_key_id": rot.previous_key_id, "to_key_id": rot.key_id,
                     "endorsed": endorsed, "detail": detail})
    # every rotation endorsed, and the chain from the first key to today's unbroken
    first = next((r["from_key_id"] for r in rows if "from_key_id" in r), current)
    ok = all(r["endorsed"] for r in rows) and bool(current)
    if ok and rows:
        try:
            keys.chain([keys.Rotation.from_record(x.sequence, x.spec_json) for x in records], first, current)
        except (ValueError, checkpoint.CheckpointError):
            ok = False
    result = {"ok": ok, "first_key_id": first, "current_key_id": current, "rotations": rows,
              "reason": signing or next((r["detail"] for r in rows if not r["endorsed"]), "")}
    if render.output_mode(ns) == "json":
        render.print_json({"keys": result})
    else:
        print(render.table(["record", "time", "reason", "from", "to", "endorsed"],
                           [(r["record"], r["time"], r["reason"], r.get("from_key_id", "")[:16],
                             r.get("to_key_id", "")[:16], "yes" if r["endorsed"] else "NO") for r in rows])
              if rows else f"no key rotations: key {current or '?'} has signed this log since its first record")
        print(f"first key {first}; signs today {current or '(this server does not sign: ' + signing + ')'}"
              + ("" if ok else f"; NOT a chain of endorsed rotations: {result['reason']}"))
    return 0 if ok else 3


def audit_verify(ns: argparse.Namespace) -> int:
    old = checkpoints.read_file(ns.checkpoint) if ns.checkpoint else None
    with Client.from_args(ns) as c:
        v = c.verify_audit_log()
        result: dict[str, Any] = {"ok": v.ok, "records_checked": v.records_checked,
                                  "first_bad_sequence": v.first_bad_sequence, "reason": v.reason,
                                  "head_hash": v.head_hash}
        if old is not None and v.ok:
            result.update(checkpoints.extends(c, old).fields(old))
    if old is None:
        text = (f"audit chain OK: {render.counted(v.records_checked, 'record')}, head {v.head_hash[:16]}" if v.ok else
                f"audit chain BROKEN at auditRecords/{v.first_bad_sequence}: {v.reason} "
                f"({v.records_checked} records verified before it)")
    elif result["ok"]:
        text = (f"audit log OK: {render.counted(v.records_checked, 'record')}; it extends the checkpoint of "
                f"{render.counted(old.tree_size, 'record')} "
                f"(root {old.root_hash[:16]}, key {old.key_id[:16]}): consistency proof verified")
        text += "".join(f"; key rotated to {r['to_key_id'][:16]} at {r['record']}, signed by {r['from_key_id'][:16]}"
                        for r in result.get("key_rotations", []))
    else:
        text = f"audit log does NOT extend the checkpoint: {result['reason']}"
    return _answer(ns, "verification", result, text)


def audit_prove(ns: argparse.Namespace) -> int:
    cp = checkpoints.read_file(ns.checkpoint)
    try:
        checkpoint.verify(cp)
    except checkpoint.CheckpointError as exc:
        return _answer(ns, "inclusion", {"ok": False, "reason": str(exc)}, f"NOT proven: {exc}")
    name = resource_name("auditRecords", ns.name)
    raw = name.removeprefix("auditRecords/")
    if raw.isascii() and raw.isdigit() and int(raw) > cp.tree_size:  # known without asking: leaves 1..tree_size
        return _not_included(ns, name, cp, f"the checkpoint's tree holds auditRecords/1..{cp.tree_size}")
    with Client.from_args(ns) as c:
        try:
            p = c.inclusion_proof(name, cp.tree_size)
        except ServiceError as exc:
            if exc.code != "NOT_FOUND":
                raise
            # the checkpoint signed a tree that held this record: a log that cannot prove it lost it
            return _not_included(ns, name, cp, f"the log no longer holds it ({exc.message}), though the checkpoint's "
                                               f"tree of {cp.tree_size} records did: records were removed")
    content_hash = hashlib.sha256(p.record.hashed_json.encode()).hexdigest()  # from its contents, not its claim
    leaf = merkle.leaf_hash(bytes.fromhex(content_hash))
    ok = (content_hash == p.record.record_hash and merkle.verify_inclusion(
        p.leaf_index, cp.tree_size, leaf, [bytes.fromhex(h) for h in p.hashes], bytes.fromhex(cp.root_hash)))
    result = {"ok": ok, "record": name, "leaf_index": p.leaf_index, "tree_size": cp.tree_size,
              "root_hash": cp.root_hash, "proof": list(p.hashes),
              "reason": "" if ok else "the record is not in the checkpointed tree as it reads now"}
    text = (f"{name} is in the checkpointed tree of {render.counted(cp.tree_size, 'record')} (root {cp.root_hash[:16]}): "
            f"inclusion proof of {len(p.hashes)} hashes verified" if ok else f"{name}: NOT proven: {result['reason']}")
    return _answer(ns, "inclusion", result, text)


def _not_included(ns: argparse.Namespace, name: str, cp: checkpoint.Checkpoint, reason: str) -> int:
    result = {"ok": False, "record": name, "tree_size": cp.tree_size, "root_hash": cp.root_hash, "reason": reason}
    return _answer(ns, "inclusion", result, f"{name}: NOT proven: {reason}")


def register(sub: Any) -> None:
    """Add the commands that talk to a server."""
    plans = sub.add_parser("plans", help="stored plans").add_subparsers(dest="plans_command", required=True)
    p = plans.add_parser("list", help="list plans")
    add_listing(p, PLAN_FILTER_EXAMPLE)
    p.set_defaults(func=plans_list)
    ps = plans.add_parser("summary", help="how many stored plans share each value of some fields (what the fleet "
                                          "runs), the most common first")
    add_summary(ps, "gpu,prefill_backend,decode_backend", SUMMARY_FIELDS, PLAN_FILTER_EXAMPLE)
    ps.set_defaults(func=plans_summary)
    p2 = plans.add_parser("show", help="show one plan")
    p2.add_argument("name", help="plans/ID or ID")
    add_explain(p2)
    p2.set_defaults(func=plans_show)
    evidence_commands.register_diff(plans)

    audit = sub.add_parser("audit", help="the audit log").add_subparsers(dest="audit_command", required=True)
    a = audit.add_parser("list", help="list audit records")
    add_listing(a, 'rule_id = "breakable.mla" AND outcome = "OK"', time_field="time", order_key="sequence")
    add_follow(a, "keep printing the records that match as they commit (from now on; with --all, the history "
                  "first), until Ctrl-C; -o json: one {\"record\": ...} line each")
    a.set_defaults(func=audit_list)
    asum = audit.add_parser("summary", help="how many records share each value of some fields (who calls what, "
                                            "and how it ends), the most common first; reads every record that "
                                            "matches: narrow it with --since and --filter")
    add_summary(asum, "method,outcome", RECORD_FIELDS, 'outcome != "OK"', time_field="time")
    asum.set_defaults(func=audit_summary)
    a2 = audit.add_parser("show", help="show one record")
    a2.add_argument("name", help="auditRecords/N or N")
    a2.set_defaults(func=audit_show)
    a3 = audit.add_parser("verify", help="verify the hash chain and Merkle tree; with --checkpoint, that the log "
                                         "extends it (exit 3 when not, naming why)")
    a3.add_argument("--checkpoint", help="a checkpoint file saved earlier (audit checkpoint -o json); - reads standard input")
    a3.set_defaults(func=audit_verify)
    a4 = audit.add_parser("checkpoint", help="the log's signed Merkle tree head now (save it: -o json > FILE)")
    a4.set_defaults(func=audit_checkpoint)
    a5 = audit.add_parser("prove", help="prove a record is in a checkpointed tree (exit 3 when not)")
    a5.add_argument("name", help="auditRecords/N or N")
    a5.add_argument("--checkpoint", required=True, help="a checkpoint file saved earlier (audit checkpoint -o json); - reads standard input")
    a5.set_defaults(func=audit_prove)
    a6 = witness.register(audit)
    a7 = audit.add_parser("keys", help="the keys that have signed this log and each rotation between them, "
                                       "checked here (exit 3 when one is not signed by the key it retires)")
    a7.set_defaults(func=audit_keys)
    for parser in (p, ps, p2, a, asum, a2, a3, a4, a5, a6, a7):
        add_output(parser)
        add_server(parser, required=True)
    add_output(witness.register_evidence(audit))  # offline: the file alone
