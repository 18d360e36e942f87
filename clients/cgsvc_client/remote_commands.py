"""`cgsvc-cli` commands that talk to a server: plans list|show, audit list|show|verify."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from cgsvc import codec
from cgsvc.errors import CODE_NAMES
from cgsvc_client import render
from cgsvc_client.args import add_listing, add_output, add_server
from cgsvc_client.client import Client


def as_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def plans_list(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        page = c.list_plans(ns.filter or "", ns.page_size, ns.page_token or "")
    if render.output_mode(ns) == "json":
        render.print_json({"plans": [codec.plan_dict_from_proto_resource(p) for p in page.plans],
                "next_page_token": page.next_page_token})
        return 0
    print(render.page(["name", "created", "model", "gpu", "prefill", "decode", "attention", "audit"],
                      [(p.name, p.create_time.ToJsonString(), p.spec.model.name or p.spec.model.path,
                        p.spec.hardware.gpu, p.prefill.backend, p.decode.backend,
                        f"{p.attention_backend.prefill}/{p.attention_backend.decode}", p.audit_record)
                       for p in page.plans], page.next_page_token))
    return 0


def plans_show(ns: argparse.Namespace) -> int:
    name = ns.name if ns.name.startswith("plans/") else f"plans/{ns.name}"
    with Client.from_args(ns) as c:
        msg = c.get_plan(name)
    if render.output_mode(ns) == "json":
        render.print_json({"plan": codec.plan_dict_from_proto_resource(msg)})
    else:
        print(f"{msg.name}  created {msg.create_time.ToJsonString()}  audit {msg.audit_record}\n")
        print(render.plan_table(codec.plan_from_proto(msg), render.Style(sys.stdout.isatty())))
    return 0


def _record_row(r: Any) -> tuple[Any, ...]:
    return (r.sequence, r.time.ToJsonString(), r.principal or "-", r.method.rsplit("/", 1)[-1],
            json.loads(r.spec_json).get("model", {}).get("name", "-") if r.spec_json else "-",
            CODE_NAMES.get(r.outcome_code, str(r.outcome_code)), r.plan_id or "-", r.launch_id or "-",
            (r.outcome_message.splitlines() or ["-"])[0][:60], r.record_hash[:12])


def audit_list(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        page = c.list_audit_records(ns.filter or "", ns.page_size, ns.page_token or "")
    if render.output_mode(ns) == "json":
        render.print_json({"records": [as_dict(r) for r in page.records], "next_page_token": page.next_page_token})
        return 0
    print(render.page(["seq", "time", "principal", "method", "model", "outcome", "plan", "launch", "detail", "hash"],
                      [_record_row(r) for r in page.records], page.next_page_token))
    return 0


def audit_show(ns: argparse.Namespace) -> int:
    name = ns.name if ns.name.startswith("auditRecords/") else f"auditRecords/{ns.name}"
    with Client.from_args(ns) as c:
        rec = c.get_audit_record(name)
    d = as_dict(rec)
    if render.output_mode(ns) == "json":
        render.print_json({"record": d})
    else:
        for key, value in d.items():
            if key in ("spec_json", "plan_json") and value:
                value = json.dumps(json.loads(value), indent=2)[:4000]
            print(f"{key}: {value}")
    return 0


def audit_verify(ns: argparse.Namespace) -> int:
    with Client.from_args(ns) as c:
        v = c.verify_audit_log()
    if render.output_mode(ns) == "json":
        render.print_json({"verification": {"ok": v.ok, "records_checked": v.records_checked,
                                  "first_bad_sequence": v.first_bad_sequence, "reason": v.reason,
                                  "head_hash": v.head_hash}})
    elif v.ok:
        print(f"audit chain OK: {v.records_checked} records, head {v.head_hash[:16]}")
    else:
        print(f"audit chain BROKEN at auditRecords/{v.first_bad_sequence}: {v.reason} "
              f"({v.records_checked} records verified before it)")
    return 0 if v.ok else 3


def register(sub: Any) -> None:
    """Add the commands that talk to a server."""
    plans = sub.add_parser("plans", help="stored plans").add_subparsers(dest="plans_command", required=True)
    p = plans.add_parser("list", help="list plans")
    add_listing(p, 'model = "deepseek-ai/DeepSeek-V3" AND gpu = "H100"')
    p.set_defaults(func=plans_list)
    p2 = plans.add_parser("show", help="show one plan")
    p2.add_argument("name", help="plans/ID or ID")
    p2.set_defaults(func=plans_show)

    audit = sub.add_parser("audit", help="the audit log").add_subparsers(dest="audit_command", required=True)
    a = audit.add_parser("list", help="list audit records")
    add_listing(a, 'rule_id = "breakable.mla" AND outcome = "OK"')
    a.set_defaults(func=audit_list)
    a2 = audit.add_parser("show", help="show one record")
    a2.add_argument("name", help="auditRecords/N or N")
    a2.set_defaults(func=audit_show)
    a3 = audit.add_parser("verify", help="verify the hash chain (exit 3 when broken)")
    a3.set_defaults(func=audit_verify)
    for parser in (p, p2, a, a2, a3):
        add_output(parser)
        add_server(parser, required=True)
