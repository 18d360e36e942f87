"""The one contract between the server and its workers: what crosses the boundary, typed.

    run directory   RunDir: plan.json (in), events.jsonl and report.json (out), logs/
    plan sets       the closed sets a plan's backends and KV dtype are drawn from
    engine          EngineSettings: the worker flags a launch sets beyond its plan (dtype, ...)
    events          StateEvent, ProgressEvent, PlacedEvent: JSON lines a group's rank 0 appends
    report          WorkerReport: how the run ended and what ran (plan fidelity included)
    rank errors     RankError: which rank failed, its exit code and error

Both sides import this module and nothing else of each other; it imports neither torch nor
grpc, and of cgsvc only cgsvc.files (standard library only, for replacing a report whole).
Every message carries `schema` (SCHEMA_VERSION); anything malformed — bad JSON, a
missing or mistyped field, an unknown event or state, a newer schema — raises ContractError
naming the field, which the server turns into a clear launch failure.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cgsvc.files import write_atomically

SCHEMA_VERSION = 1
WORKER_STATES = ("loading", "capturing", "running", "succeeded", "failed")

# The plan's closed sets (docs/plan.md): the server resolves within them (cgsvc.spec takes them from
# here), and a worker refuses a plan.json with a value outside them rather than run it as something else.
PREFILL_GRAPH_BACKENDS = ("disabled", "breakable", "tc_piecewise", "full")
DECODE_GRAPH_BACKENDS = ("full", "disabled")
ATTENTION_BACKENDS = (
    "trtllm_mla", "trtllm_mha", "flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla",
    "triton", "torch_native", "flex_attention", "dsa",
)
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
FIDELITY_STATUSES = ("honoured", "substituted", "not_applicable")
# Every setting of a plan, as the resolver's rules write them and the workers' plan fidelity
# reports on each (a test derives the list from cgsvc.plan.Plan).
PLAN_FIELDS = ("attention_backend.prefill", "attention_backend.decode", "prefill.backend", "prefill.max_num_tokens",
               "prefill.num_tokens", "decode.backend", "decode.max_bs", "decode.bs", "kv_cache_dtype",
               "chunked_prefill_size")
# What the workers split evenly over a TP group's ranks (each rank holds 1/tp of it), as
# (checkpoint fact, words): a plan whose tp does not divide one cannot run on that checkpoint.
TP_SHARDED = (("num_attention_heads", "attention heads"), ("vocab_size", "vocabulary rows"),
              ("routed_experts", "routed experts"))


# ---------------------------------------------------------------------------- engine settings

DTYPES = ("auto", "float32", "bfloat16", "float16")  # the workers' --dtype
# Other names a launch may give a dtype by (sglang's and vLLM's --dtype take half and float), kept
# as DTYPES spells them.
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}
CPU_DECODE_MODES = ("eager", "trace", "inductor")  # the workers' --cpu-decode
MAX_KV_CACHE_MB = 1 << 24  # 16 TiB a rank: beyond any device


@dataclass(frozen=True)
class EngineSettings:
    """How the workers set up their engine beyond the plan (cgsvc-worker's --dtype,
    --kv-cache-mb and --cpu-decode), checked and spelt once by the service; kv_cache_mb 0 is auto."""

    dtype: str = "auto"
    kv_cache_mb: float = 0.0
    cpu_decode: str = "eager"

    @classmethod
    def read(cls, source: Any) -> EngineSettings:
        """The settings an EngineSettings message or a dict of its fields (stored JSON) stands
        for: a field absent or at its zero value ("", 0: what a server or client before them
        sends) is the default. Takes the spelling as given: the service checks it."""
        get = source.get if isinstance(source, dict) else lambda name: getattr(source, name, None)
        return cls(**{f.name: value for f in fields(cls) if (value := get(f.name))})

    def worker_args(self) -> list[str]:
        return ["--dtype", self.dtype, "--kv-cache-mb", f"{self.kv_cache_mb:.12g}" if self.kv_cache_mb else "auto",
                "--cpu-decode", self.cpu_decode]

    def text(self) -> str:
        """One line for a person: "dtype auto, KV cache 8 MiB a rank, CPU decode eager"."""
        kv = f"{self.kv_cache_mb:.12g} MiB a rank" if self.kv_cache_mb else "auto"
        return f"dtype {self.dtype}, KV cache {kv}, CPU decode {self.cpu_decode}"


DEFAULT_ENGINE = EngineSettings()


KV_PAGE_TOKENS = 16  # the workers' default --page-size (a rank running trtllm_mla on sm100 takes 64)
FP4_BLOCK = 16  # fp4_e2m1 stores blocks of 16 values, each with one e4m3 scale byte
_KV_VALUE_BYTES = {"bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}  # auto: the model's dtype
MODEL_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_row_bytes(kv_cache_dtype: str, model_dtype_bytes: int, latent_dim: int) -> int:
    """Bytes the workers' latent KV cache keeps per token per layer: `latent_dim` values (the
    compressed latent and the rotated key) stored as the plan's kv_cache_dtype ("auto": the
    model's dtype, `model_dtype_bytes` each; fp4_e2m1: packed, plus a scale byte a block)."""
    if kv_cache_dtype == "fp4_e2m1":
        return latent_dim // 2 + latent_dim // FP4_BLOCK
    return latent_dim * _KV_VALUE_BYTES.get(kv_cache_dtype, model_dtype_bytes)


def kv_budget_floor(kv_cache_dtype: str, dtype: str, num_layers: int, latent_dim: int) -> int:
    """The fewest bytes a rank's KV budget can hold the cache in: two pages (one is scratch) of
    KV_PAGE_TOKENS tokens on every layer. `dtype` is the launch's engine dtype; for auto (which a
    rank settles by its device) the smallest it could be, 16-bit: a floor, never above the need."""
    model_bytes = MODEL_DTYPE_BYTES.get(dtype, min(MODEL_DTYPE_BYTES.values()))
    return 2 * KV_PAGE_TOKENS * num_layers * kv_row_bytes(kv_cache_dtype, model_bytes, latent_dim)


def kv_budget_bytes(kv_cache_mb: float) -> int:
    """A --kv-cache-mb value in bytes, as every rank counts it."""
    return int(kv_cache_mb * 1024 * 1024)


def kv_cache_mib(text: str) -> float | None:
    """--kv-cache-mb's value as cgsvc-worker and cgsvc-cli read it: MiB, or None for auto (an
    argparse type: a bad value is named)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of MiB or auto, got {text!r}") from None


def tp_fits(sizes: dict[str, int]) -> list[int]:
    """The TP group sizes that split every one of a checkpoint's `sizes` evenly (TP_SHARDED's
    facts; 0 or absent for none): the divisors of their greatest common divisor."""
    common = math.gcd(*(v for v in sizes.values() if v))
    return [d for d in range(1, common + 1) if common % d == 0] if common else []


def tp_misfits(tp: int, sizes: dict[str, int]) -> list[str]:
    """What of a checkpoint (`sizes`: TP_SHARDED's facts; 0 or absent for none) a TP group of
    `tp` ranks cannot split evenly, in words: "510 vocabulary rows"."""
    return [f"{sizes[fact]} {words}" for fact, words in TP_SHARDED if sizes.get(fact) and sizes[fact] % tp]


def substituted(report: dict[str, Any]) -> list[str]:
    """The plan fields a worker report says ran as something other than planned, in plan order."""
    return [f["field"] for f in report.get("plan_fidelity") or [] if f.get("status") == "substituted"]


def ran_as(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per plan field of a worker report, what the plan asked for and what the workers ran."""
    return {f["field"]: {"requested": f.get("requested"), "effective": f.get("effective")}
            for f in report.get("plan_fidelity") or []}


def ran_alike(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    """The plan fields A and B were planned differently in, where the workers ran every field of
    both alike (what differed was substituted away or did not apply): then a measured difference
    is the machine's, not the plans'. Empty when what ran differs, when the plans are the same
    (an A/A run measures the machine on purpose), or while an arm has no report."""
    if not a or not b or a.keys() != b.keys() or any(a[f]["effective"] != b[f]["effective"] for f in a):
        return []
    return [f for f in a if a[f]["requested"] != b[f]["requested"]]


class ContractError(ValueError):
    """A message that does not follow the contract; the message names the field."""


# ---------------------------------------------------------------------------- the run directory


@dataclass(frozen=True)
class RunDir:
    """Where one launch's worker group reads its plan and writes events, report and logs."""

    path: Path

    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def report(self) -> Path:
        return self.path / "report.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"

    @property
    def followed(self) -> Path:
        """Touched about once a second by the server that follows the group; a supervisor told
        `--unfollowed-after` stops a group whose file goes untouched that long."""
        return self.path / "followed"


# ---------------------------------------------------------------------------- field readers


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ContractError(f"{where}.{key}: missing")
        return default
    value = d[key]
    numeric = kind in (int, float) or (isinstance(kind, tuple) and float in kind)
    if isinstance(value, bool) and numeric:
        raise ContractError(f"{where}.{key}: expected a number, got {value!r}")
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ContractError(f"{where}.{key}: expected {name}, got {type(value).__name__}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _schema(d: dict[str, Any], where: str) -> None:
    version = _get(d, "schema", int, where, SCHEMA_VERSION)
    if version > SCHEMA_VERSION:
        raise ContractError(f"{where}.schema: version {version} is newer than this server's {SCHEMA_VERSION}")


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True)
class StateEvent:
    state: str
    error: str = ""
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SCHEMA_VERSION, "time": self.time or time.time(), "event": "state",
                               "state": self.state}
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class ProgressEvent:
    """Tokens generated, prompt tokens prefilled, and sizes captured or compiled before the run
    (a decode batch size, a prefill token count; 0 of 0 from a worker before those)."""

    tokens_done: int
    tokens_total: int
    time: float = 0.0
    prompt_done: int = 0
    prompt_total: int = 0
    capture_done: int = 0
    capture_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "time": self.time or time.time(), "event": "progress",
                "tokens_done": self.tokens_done, "tokens_total": self.tokens_total,
                "prompt_done": self.prompt_done, "prompt_total": self.prompt_total,
                "capture_done": self.capture_done, "capture_total": self.capture_total}


@dataclass(frozen=True)
class PlacedEvent:
    """Where the ranks landed: one device per rank, in rank order (a GPU id as the rank's
    CUDA_VISIBLE_DEVICES names it, or "cpu")."""

    devices: tuple[str, ...]
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "time": self.time or time.time(), "event": "placed",
                "devices": list(self.devices)}


Event = StateEvent | ProgressEvent | PlacedEvent


def parse_event(line: str) -> Event:
    """One line of events.jsonl."""
    try:
        d = _object(json.loads(line), "event")
    except ValueError as exc:
        raise ContractError(f"event: not JSON ({exc})") from None
    _schema(d, "event")
    kind, t = _get(d, "event", str, "event"), float(_get(d, "time", (int, float), "event", 0.0))
    if kind == "state":
        state = _get(d, "state", str, "event")
        if state not in WORKER_STATES:
            raise ContractError(f"event.state: {state!r} is not one of {', '.join(WORKER_STATES)}")
        return StateEvent(state, _get(d, "error", str, "event", ""), t)
    if kind == "progress":
        counts = {k: _get(d, k, int, "event", ... if k.startswith("tokens") else 0)
                  for k in ("tokens_done", "tokens_total", "prompt_done", "prompt_total", "capture_done",
                            "capture_total")}
        for what in ("tokens", "prompt", "capture"):
            done, total = counts[f"{what}_done"], counts[f"{what}_total"]
            if not 0 <= done <= total:
                raise ContractError(f"event.{what}_done: {done} is not within [0, {what}_total={total}]")
        return ProgressEvent(counts["tokens_done"], counts["tokens_total"], t, counts["prompt_done"],
                             counts["prompt_total"], counts["capture_done"], counts["capture_total"])
    if kind == "placed":
        devices = _get(d, "devices", list, "event")
        if not devices or not all(isinstance(x, str) and x for x in devices):
            raise ContractError("event.devices: expected a non-empty list of device names")
        return PlacedEvent(tuple(devices), t)
    raise ContractError(f"event.event: {kind!r} is not one of state, progress, placed")


def append_event(path: str | Path, event: Event) -> None:
    """Append one event line (a whole line per write, so a reader never sees half of one)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event.to_dict()) + "\n")


# ---------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class RankError:
    rank: int
    exit_code: int | None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FidelityEntry:
    """One plan field as it ran (see docs/worker-report.md)."""

    field: str
    requested: Any
    effective: Any
    status: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in FIDELITY_STATUSES:
            raise ContractError(f"plan_fidelity.status: {self.status!r} is not one of {', '.join(FIDELITY_STATUSES)}")
        if self.status != "honoured" and not self.reason:
            raise ContractError(f"plan_fidelity[{self.field}].reason: required when {self.status}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Percentiles:
    """None where nothing was measured (TPOT of requests that ended at their first token)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


@dataclass(frozen=True)
class PhaseReport:
    """A phase's graph mode or attention backend: requested, effective, why, capture cost."""

    requested: str
    effective: str
    reason: str = ""
    capture_seconds: float = 0.0
    capture_bytes: int = 0


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    device: str  # what the rank computes on, e.g. "cuda:0" or "cpu"
    visible_devices: str  # its CUDA_VISIBLE_DEVICES ("" when unset)


# What a run measured, as Launch.report names them: what a launch filter compares and a listing
# may be ordered by (`ttft_ms_p50 desc`).
REPORT_MEASURES = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "throughput_tok_s")


@dataclass(frozen=True)
class WorkerReport:
    """How a worker group's run ended. `body` is the whole JSON (requests, timings, notes, ...);
    the typed fields are the parts the server reads."""

    status: str  # "ok" or "failed"
    error: str = ""
    error_kind: str = ""
    rank_errors: tuple[RankError, ...] = ()
    plan_fidelity: tuple[FidelityEntry, ...] = ()
    modes: dict[str, PhaseReport] = field(default_factory=dict)
    attention: dict[str, PhaseReport] = field(default_factory=dict)
    ttft_ms: Percentiles = Percentiles()
    tpot_ms: Percentiles = Percentiles()
    throughput_tok_s: float = 0.0
    output_tokens: int = 0
    kv_bytes_per_token: int = 0
    placement: tuple[RankPlacement, ...] = ()
    # the dtype and KV cache budget that ran, and why ("" and 0 from workers before these fields)
    dtype: str = ""
    dtype_reason: str = ""
    kv_budget_bytes: int = 0
    kv_budget_reason: str = ""
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, error: str, error_kind: str = "", rank_errors: tuple[RankError, ...] = (),
               **extra: Any) -> WorkerReport:
        body = {"schema": SCHEMA_VERSION, "status": "failed", "error": error, "error_kind": error_kind,
                **({"rank_errors": [e.to_dict() for e in rank_errors]} if rank_errors else {}), **extra}
        return cls("failed", error, error_kind, rank_errors, body=body)

    @classmethod
    def from_dict(cls, data: Any) -> WorkerReport:
        d = _object(data, "report")
        _schema(d, "report")
        status = _get(d, "status", str, "report")
        if status not in ("ok", "failed"):
            raise ContractError(f"report.status: {status!r} is not one of ok, failed")
        rank_errors = tuple(RankError(_get(r, "rank", int, "report.rank_errors[]"),
                                      _get(r, "exit_code", (int, type(None)), "report.rank_errors[]", None),
                                      _get(r, "error", str, "report.rank_errors[]", ""))
                            for r in (_object(x, "report.rank_errors[]")
                                      for x in _get(d, "rank_errors", list, "report", [])))
        if status == "failed":
            return cls("failed", _get(d, "error", str, "report", ""), _get(d, "error_kind", str, "report", ""),
                       rank_errors, body=dict(d))
        try:
            fidelity = tuple(FidelityEntry(**_object(f, "report.plan_fidelity[]"))
                             for f in _get(d, "plan_fidelity", list, "report"))
        except TypeError as exc:
            raise ContractError(f"report.plan_fidelity[]: {exc}") from None
        agg = _object(_get(d, "aggregate", dict, "report"), "report.aggregate")
        kv = _object(_get(d, "kv_cache", dict, "report"), "report.kv_cache")
        return cls(
            status="ok", rank_errors=rank_errors, plan_fidelity=fidelity,
            modes={k: _phase(_get(d, "modes", dict, "report"), k, "report.modes") for k in ("prefill", "decode")},
            attention={k: _phase(_get(d, "attention", dict, "report"), k, "report.attention")
                       for k in ("prefill", "decode")},
            ttft_ms=_percentiles(agg, "ttft_ms"), tpot_ms=_percentiles(agg, "tpot_ms"),
            throughput_tok_s=float(_get(agg, "throughput_tok_s", (int, float), "report.aggregate")),
            output_tokens=_get(agg, "output_tokens", int, "report.aggregate"),
            kv_bytes_per_token=_get(kv, "bytes_per_token", int, "report.kv_cache"),
            dtype=_get(d, "dtype", str, "report", ""), dtype_reason=_get(d, "dtype_reason", str, "report", ""),
            kv_budget_bytes=_get(kv, "budget_bytes", int, "report.kv_cache", 0),
            kv_budget_reason=_get(kv, "budget_reason", str, "report.kv_cache", ""),
            placement=tuple(RankPlacement(_get(p, "rank", int, "report.placement[]"),
                                          _get(p, "device", str, "report.placement[]"),
                                          _get(p, "visible_devices", str, "report.placement[]"))
                            for p in (_object(x, "report.placement[]")
                                      for x in _get(d, "placement", list, "report", []))),
            body=dict(d))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **self.body}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _phase(section: dict[str, Any], key: str, where: str) -> PhaseReport:
    p = _object(_get(section, key, dict, where), f"{where}.{key}")
    w = f"{where}.{key}"
    return PhaseReport(_get(p, "requested", str, w), _get(p, "effective", str, w), _get(p, "reason", str, w, ""),
                       float(_get(p, "capture_seconds", (int, float), w, 0.0)),
                       _get(p, "capture_bytes", int, w, 0))


def _percentiles(agg: dict[str, Any], key: str) -> Percentiles:
    p = _object(_get(agg, key, dict, "report.aggregate"), f"report.aggregate.{key}")
    w = f"report.aggregate.{key}"
    # a key left out (all of them: the worker's percentiles of no samples) was not measured
    values = (_get(p, k, (int, float), w, None) for k in ("mean", "p50", "p90", "p99"))
    return Percentiles(*(None if v is None else float(v) for v in values))


def read_report(path: str | Path) -> WorkerReport:
    """The report a worker group left; ContractError when it is missing, not JSON or malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ContractError(f"report: no {Path(path).name} was written") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"report: not JSON ({exc})") from None
    return WorkerReport.from_dict(data)


def write_report(path: str | Path | None, report: WorkerReport | dict[str, Any]) -> None:
    """Write a report atomically (never half a report); to stdout when path is None. A dict is
    validated first, so a worker never writes a report the server cannot read."""
    if isinstance(report, dict):
        report = WorkerReport.from_dict({"schema": SCHEMA_VERSION, **report})
    text = report.to_json()
    if path is None:
        print(text)
        return
    write_atomically(path, text)
