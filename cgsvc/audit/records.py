"""Audit record contents and the hash chain over them.

`record_hash = sha256(canonical_json(every stored field but record_hash))`, and each
record carries the previous record's hash, so editing, deleting or reordering any record
breaks the chain at that record. The genesis record's `prev_hash` is `GENESIS`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from cgsvc.plan import sha256_hex

# 2: records carry the policy's name (`policy`); a version-1 record is hashed without it.
SCHEMA_VERSION = 2
GENESIS = "0" * 64

_SECRET_KEY = re.compile(r"token|secret|password|passwd|credential|api[_-]?key", re.I)
# The scheme is bounded: unbounded, a long value without "://" (a 300,000-character model name)
# made every start position scan to its end, and one request held the event loop for minutes.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]{0,31}://)[^/@\s]+@", re.I)


def utc_now() -> str:
    """A record's time: RFC 3339 UTC with microseconds, which sorts as text."""
    return utc_text(dt.datetime.now(dt.UTC))


def utc_text(moment: dt.datetime) -> str:
    """A moment (with its offset) as the services write times (utc_now), comparable with them as text."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def mask_secrets(value: Any) -> Any:
    """A copy with secret-looking keys replaced by "***" and URL credentials removed."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEY.search(str(k)) else mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str):
        return _URL_CREDENTIALS.sub(r"\g<scheme>***@", value) if "://" in value else value
    return value


@dataclass(frozen=True)
class AuditEntry:
    """What a request contributes to its record; sequence, time and hashes come at append."""

    principal: str
    peer: str
    method: str
    request_id: str = ""
    trace_id: str = ""
    model: str = ""
    gpu: str = ""
    spec_json: str = ""
    plan_json: str = ""
    plan_hash: str = ""
    rule_ids: tuple[str, ...] = ()
    policy_version: str = ""
    policy: str = ""
    service_version: str = ""
    outcome_code: int = 0
    outcome_message: str = ""
    launch_id: str = ""
    plan_id: str = ""

    @property
    def spec_hash(self) -> str:
        return sha256_hex(self.spec_json) if self.spec_json else ""


@dataclass(frozen=True)
class AuditRecord:
    """A stored, chained record."""

    sequence: int
    schema_version: int
    time: str
    principal: str
    peer: str
    method: str
    request_id: str
    trace_id: str
    model: str
    gpu: str
    spec_json: str
    spec_hash: str
    plan_json: str
    plan_hash: str
    rule_ids: tuple[str, ...]
    policy_version: str
    service_version: str
    outcome_code: int
    outcome_message: str
    launch_id: str
    plan_id: str
    prev_hash: str
    policy: str = ""  # schema 2: the name of the policy that resolved (or refused) the spec
    record_hash: str = field(default="")

    def hashed_fields(self) -> dict[str, Any]:
        # A shallow copy: dataclasses.asdict deep-copies every field and cost ~40 % of an append.
        d = dict(self.__dict__)
        d.pop("record_hash")
        if self.schema_version < 2:
            d.pop("policy")
        d["rule_ids"] = self.rule_ids  # a tuple: encoded as the same JSON array a list would be
        return d

    def compute_hash(self) -> str:
        return sha256_hex(canonical_record_json(self.hashed_fields()))

    @property
    def name(self) -> str:
        return f"auditRecords/{self.sequence}"


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')


@functools.lru_cache(maxsize=1024)
def _json_long_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


_SHORT: dict[str, str] = {}  # short strings' encodings: most fields repeat from record to record


def _json_string(text: str) -> str:
    """json.dumps(text, ensure_ascii=False), without the call for the common plain string."""
    if len(text) > 128:
        return _json_long_string(text)
    enc = _SHORT.get(text)
    if enc is None:
        enc = f'"{text}"' if _NEEDS_ESCAPE.search(text) is None else json.dumps(text, ensure_ascii=False)
        if len(_SHORT) >= 4096:  # ids that never repeat fill it: start again
            _SHORT.clear()
        _SHORT[text] = enc
    return enc


@functools.lru_cache(maxsize=64)
def _key_prefixes(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The keys in sorted order, each with its encoded `"key":` prefix."""
    return tuple((k, f"{_json_string(k)}:") for k in sorted(keys))


@functools.lru_cache(maxsize=1024)
def _json_string_array(values: tuple[str, ...]) -> str:
    return "[" + ",".join(_json_string(v) for v in values) + "]"


def canonical_record_json(fields: dict[str, Any]) -> str:
    """canonical_json of a record's fields, byte for byte (tests/unit/test_records.py checks
    it), built without a json.dumps call per value, with the keys' encoding made once per key
    set and the encoding of long strings and of rule-id lists (the same for every request of
    one spec) cached: on the append path this was the largest share of hashing a record."""
    parts = []
    for key, prefix in _key_prefixes(tuple(fields)):
        value = fields[key]
        if isinstance(value, str):
            enc = _json_string(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            enc = str(value)
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            enc = _json_string_array(tuple(value))
        else:
            enc = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        parts.append(prefix + enc)
    return "{" + ",".join(parts) + "}"


def _record_fields(entry: AuditEntry, sequence: int, time: str, prev_hash: str) -> dict[str, Any]:
    return dict(
        sequence=sequence, schema_version=SCHEMA_VERSION, time=time, principal=entry.principal,
        peer=entry.peer, method=entry.method, request_id=entry.request_id, trace_id=entry.trace_id,
        model=entry.model, gpu=entry.gpu, spec_json=entry.spec_json, spec_hash=entry.spec_hash,
        plan_json=entry.plan_json, plan_hash=entry.plan_hash, rule_ids=tuple(entry.rule_ids),
        policy_version=entry.policy_version, service_version=entry.service_version,
        outcome_code=entry.outcome_code, outcome_message=entry.outcome_message,
        launch_id=entry.launch_id, plan_id=entry.plan_id, prev_hash=prev_hash, policy=entry.policy)


def chain(entry: AuditEntry, sequence: int, time: str, prev_hash: str) -> AuditRecord:
    """The record for an entry appended after prev_hash, with its hash filled in."""
    fields = _record_fields(entry, sequence, time, prev_hash)
    # What AuditRecord.hashed_fields() gives, without building the record twice.
    hashed = fields if SCHEMA_VERSION >= 2 else {k: v for k, v in fields.items() if k != "policy"}
    fields["record_hash"] = sha256_hex(canonical_record_json(hashed))
    return _record(fields)


def _record(fields: dict[str, Any]) -> AuditRecord:
    """AuditRecord(**fields) for fields that are every one of its own, without the frozen
    dataclass's __init__ (a setattr call per field, a tenth of an append's hashing)."""
    record = object.__new__(AuditRecord)
    record.__dict__.update(fields)
    return record


def chained(entry: AuditEntry, sequence: int, time: str, prev_hash: str, record_hash: str) -> AuditRecord:
    """The record chain() made of this entry, from the parts the chain gave it (the hash is
    taken as given): how a process that sent an entry away gets its record back cheaply."""
    fields = _record_fields(entry, sequence, time, prev_hash)
    fields["record_hash"] = record_hash
    return _record(fields)
