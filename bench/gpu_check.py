#!/usr/bin/env python3
"""`make gpu-check`: the worker's GPU paths, checked on one GPU in one prepared run.

    python3 bench/gpu_check.py --out DIR [--budget 420]

Writes DIR/gpu_check.json and DIR/gpu_check.md (rewritten after every section, so an
interrupted run still leaves what it measured). Sections, in order of what matters most:

    versions            torch, CUDA, NCCL, flashinfer, the GPU
    nccl_graph          an all-reduce captured in a CUDA graph at world size 1 (NCCL >= 2.9.6)
    trtllm_substitution trtllm_mla asked for on this GPU: substituted (sm90) with the reason, or run (sm100)
    flashinfer_vs_native FlashInfer MLA decode against torch_native, bf16, page sizes 1 / 16 / 64,
                        ragged context lengths, teacher-forced logits
    decode_graphs       decode CUDA-graph replay against eager: tokens identical, tokens/s at
                        batch 1, 8, 32, on a dense and an MoE checkpoint
    check_graphs        `cgsvc-worker check-graphs` on CUDA (capture and replay per planned size)
    generate_cli        `cgsvc-worker generate` end to end with a plan that sets every field, in the
                        dtype a launch gets (--dtype auto: bfloat16 on a GPU)
    prefill_modes       prefill TTFT per graph mode (disabled, breakable, tc_piecewise) against eager
    service_launch      a launch through `cgsvc serve` and `cgsvc-cli launch --wait`, as a user makes
                        one, for this machine's GPU (or cpu): what its report says ran, the sizes
                        its bar counted as captured and its warm-up (also on a CPU)
    fp8_kv              the fp8_e4m3 latent cache through FlashInfer's fp8 MLA kernel against torch_native

Without a GPU it runs what a CPU can (check-graphs by compile) and lists what needs a GPU.
It runs with a plain `python3` that has torch (the GPU machine has no virtualenv): the repo's
packages are put on sys.path here. FlashInfer compiles its kernels on first use (minutes):
the budget is checked before every section, and a section that would start too late is
listed as skipped, never half-reported.

On a GPU machine without network, FlashInfer travels as wheels: `make device-wheels` here
(scripts/device_wheels.sh: .whl/gpu for the GPU machine's Python 3.12), carry `.whl`, and there
run `bash bench/device_run.sh $OUT 600`, which installs them, measures the durable path on that
machine's cores, and runs this script with the time left (CUDA_HOME from `nvcc` when unset).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for sub in ("", "workers", "clients"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402
from cgsvc_worker import tp  # noqa: E402
from cgsvc_worker.checkpoint import make_checkpoint  # noqa: E402
from cgsvc_worker.engine import Engine, EngineOptions, PlanView  # noqa: E402


class Run:
    def __init__(self, out: Path, budget: float) -> None:
        self.out, self.budget, self.t0 = out, budget, time.perf_counter()
        self.cuda = torch.cuda.is_available()
        self.result: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                       "gpu": self.cuda, "sections": []}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def section(self, name: str, fn: Callable[[], dict[str, Any]], gpu: bool = True, needs: float = 20.0) -> None:
        entry: dict[str, Any] = {"name": name}
        if gpu and not self.cuda:
            entry.update(status="needs a GPU")
        elif self.left() < needs:
            entry.update(status="skipped", reason=f"{self.left():.0f} s of the budget left, the section needs ~{needs:.0f}")
        else:
            print(f"[gpu-check {time.perf_counter() - self.t0:6.1f}s] {name} ...", flush=True)
            t = time.perf_counter()
            try:
                entry.update(status="ok", data=fn())
            except Exception as exc:  # noqa: BLE001 - a failed section is a finding, the run goes on
                entry.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                             traceback=traceback.format_exc()[-3000:])
            entry["seconds"] = round(time.perf_counter() - t, 2)
            print(f"[gpu-check] {name}: {entry['status']} in {entry['seconds']} s", flush=True)
        self.result["sections"].append(entry)
        self.write()

    def write(self) -> None:
        self.result["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=2, default=str))
        (self.out / "gpu_check.md").write_text(markdown(self.result))


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Command: `{result['command']}` ({result.get('elapsed_s', 0)} s)", ""]
    for s in result["sections"]:
        head = f"### {s['name']}: {s['status']}" + (f" ({s['seconds']} s)" if "seconds" in s else "")
        lines += [head, ""]
        if s["status"] == "failed":
            lines += ["```", s["error"], "```", ""]
        if s.get("reason"):
            lines += [s["reason"], ""]
        data = s.get("data") or {}
        table = data.get("table")
        if table:
            cols = list(table[0])
            lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in table]
            lines.append("")
        rest = {k: v for k, v in data.items() if k != "table"}
        if rest:
            lines += ["```json", json.dumps(rest, indent=1, default=str)[:3000], "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- helpers

CKPT = Path(tempfile.mkdtemp(prefix="cgsvc-gpu-check-"))


def checkpoint(kind: str) -> str:
    """flashinfer-compatible MLA dims (latent 512, rope 64), bf16; moe: 1 dense + 1 MoE layer."""
    path = CKPT / kind
    if not path.exists():
        over = {"n_routed_experts": 0, "first_k_dense_replace": 2} if kind == "dense" else {}
        make_checkpoint(str(path), "flashinfer", seed=0, dtype="bfloat16", overrides=over)
    return str(path)


def plan(**fields: Any) -> PlanView:
    return PlanView(**fields)


def engine(path: str, view: PlanView, page_size: int = 16, kv_mb: float = 1024, **opts: Any) -> Engine:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    options = EngineOptions(dtype="bfloat16", kv_cache_bytes=int(kv_mb * 2**20), page_size=page_size, **opts)
    e = Engine(path, tp.single(dev), view, options)
    e.capture()
    return e


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sm_name() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def teacher_forced(a: Engine, b: Engine, ps: list[list[int]], steps: int) -> dict[str, Any]:
    ids = list(range(len(ps)))
    la, lb = a.prefill(ids, ps), b.prefill(ids, ps)
    errs, agree, total = [], 0, 0
    for _ in range(steps):
        toks = la.argmax(-1).tolist()
        la, lb = a.decode(ids, toks), b.decode(ids, toks)
        errs.append(rel(lb, la))
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        total += len(ids)
    for i in ids:
        a.release(i)
        b.release(i)
    return {"max_rel_err": round(max(errs), 5), "mean_rel_err": round(statistics.mean(errs), 5),
            "argmax_agreement": f"{agree}/{total}"}


# ---------------------------------------------------------------------------- sections


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "nccl": ".".join(map(str, tp.nccl_version())) or None}
    try:
        import flashinfer

        out["flashinfer"] = getattr(flashinfer, "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        out["flashinfer"] = f"not importable: {type(exc).__name__}: {exc}"[:300]
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["capability"] = sm_name()
        with contextlib.suppress(OSError):
            out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip()
    return out


def nccl_graph() -> dict[str, Any]:
    import torch.distributed as dist

    tp.check_nccl_for_graphs()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK="0", WORLD_SIZE="1")
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    try:
        x = torch.ones(4096, device=dev)
        dist.all_reduce(x)  # warm the communicator before capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            dist.all_reduce(y)
        x.fill_(3.0)
        g.replay()
        torch.cuda.synchronize()
        ok = bool((y == 6.0).all())
    finally:
        dist.destroy_process_group()
    return {"nccl": ".".join(map(str, tp.nccl_version())), "replayed_all_reduce_correct": ok}


def trtllm_substitution() -> dict[str, Any]:
    e = engine(checkpoint("moe"), plan(attention_prefill="trtllm_mla", attention_decode="trtllm_mla"), page_size=64)
    d = e.describe()
    return {"capability": sm_name(), "attention": d["attention"]}


def flashinfer_vs_native() -> dict[str, Any]:
    path = checkpoint("moe")
    rows = []
    for page in (1, 16, 64):
        native = engine(path, plan(), page_size=page, kv_mb=512)
        fi = engine(path, plan(attention_decode="flashinfer"), page_size=page, kv_mb=512)
        t = time.perf_counter()
        ps = prompts([3, 17, 64, 129, 250], native.cfg.vocab_size, seed=page)
        got = teacher_forced(native, fi, ps, steps=8)
        rows.append({"page_size": page, "attention": fi.attention_decode.effective, **got,
                     "seconds": round(time.perf_counter() - t, 1)})
        del native, fi
    return {"table": rows}


def _decode_run(e: Engine, batch: int, steps: int) -> tuple[list[list[int]], float]:
    ids = list(range(batch))
    ps = prompts([32] * batch, e.cfg.vocab_size, seed=batch)
    toks = e.prefill(ids, ps).argmax(-1).tolist()
    out = [[t] for t in toks]
    e.decode(ids, toks)  # a first step outside the timing
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        toks = e.decode(ids, toks).argmax(-1).tolist()
        for o, tk in zip(out, toks, strict=True):
            o.append(tk)
    sync()
    elapsed = time.perf_counter() - t
    for i in ids:
        e.release(i)
    return out, batch * steps / elapsed


def decode_graphs() -> dict[str, Any]:
    rows, captures = [], {}
    for kind in ("dense", "moe"):
        path = checkpoint(kind)
        for attention in ("flashinfer", "torch_native"):
            eager = engine(path, plan(attention_decode=attention))
            graphed = engine(path, plan(attention_decode=attention, decode_backend="full", decode_bs=[1, 8, 32],
                                        decode_max_bs=32), graph_context=512)
            captures[f"{kind}/{attention}"] = graphed.decode_mode.to_dict()
            for batch in (1, 8, 32):
                te, se = _decode_run(eager, batch, 32)
                before = sum(graphed.stats["decode"].by_size.values())
                tg, sg = _decode_run(graphed, batch, 32)
                rows.append({"model": kind, "attention": graphed.attention_decode.effective, "batch": batch,
                             "eager_tok_s": round(se, 1), "graph_tok_s": round(sg, 1), "speedup": round(sg / se, 2),
                             "tokens_identical": te == tg,
                             "graph_steps": sum(graphed.stats["decode"].by_size.values()) - before})
            del eager, graphed
    return {"table": rows, "captures": captures}


def check_graphs_cuda() -> dict[str, Any]:
    from cgsvc_worker.check_graphs import check_graphs

    view = plan(attention_decode="flashinfer", decode_backend="full", decode_bs=[1, 4, 16], decode_max_bs=16,
                prefill_backend="breakable", prefill_num_tokens=[64, 256], prefill_max_num_tokens=256)
    e = Engine(checkpoint("moe"), tp.single("cuda"), view, EngineOptions(dtype="bfloat16", cpu_decode="eager",
                                                                           allow_compile=False))
    r = check_graphs(e)
    table = [{"phase": "decode", "size": x["bs"], "capturable": x["capturable"], "max_abs_diff": x["max_abs_diff"],
              "reason": x["reason"]} for x in r["decode"]]
    table += [{"phase": "prefill", "size": x["num_tokens"], "capturable": x["capturable"],
               "max_abs_diff": x["max_abs_diff"], "reason": x["reason"]} for x in r["prefill"]]
    return {"table": table, "capturable": r["capturable"], "method": r["method"]}


def generate_cli() -> dict[str, Any]:
    """`cgsvc-worker generate` end to end on the GPU with a plan that sets every field, its one
    rank supervised as a launch's are (forked from the fork server that preloaded torch: CUDA
    must start in the rank after the fork)."""
    out = CKPT / "generate"
    out.mkdir(exist_ok=True)
    plan_json = {"plan": {"policy_version": "gpu-check", "plan_hash": "gpu-check",
                          "attention_backend": {"prefill": "flashinfer", "decode": "flashinfer"},
                          "prefill": {"backend": "tc_piecewise", "max_num_tokens": 256, "num_tokens": [64, 256]},
                          "decode": {"backend": "full", "max_bs": 4, "bs": [1, 2, 4]},
                          "kv_cache_dtype": "bfloat16", "chunked_prefill_size": 256}}
    (out / "plan.json").write_text(json.dumps(plan_json))
    (out / "prompts.json").write_text(json.dumps(prompts([40, 300, 7], 4096, seed=3)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "generate", "--model-path", checkpoint("moe"),
                           "--plan", str(out / "plan.json"), "--prompts", str(out / "prompts.json"),
                           "--max-new-tokens", "16", "--output", str(out / "report.json"),  # --dtype auto, as a launch
                           "--follow-file", str(out / "followed"), "--unfollowed-after", "600"],
                          capture_output=True, text=True, env=env, timeout=300)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-1500:], "rank": "forked from the fork server",
            "dtype": report.get("dtype"), "dtype_reason": report.get("dtype_reason"),  # auto: bfloat16 on a GPU
            "table": report.get("plan_fidelity") or [{"error": report.get("error", "no report")}],
            "steps": report.get("steps"), "modes": report.get("modes"),
            "ttft_ms": report.get("aggregate", {}).get("ttft_ms"), "tpot_ms": report.get("aggregate", {}).get("tpot_ms"),
            "prefill_chunks": [r.get("prefill_chunks") for r in report.get("requests", [])]}


# The catalog's GPU names, as torch names the device ("NVIDIA H200", "NVIDIA H100 80GB HBM3").
CATALOG_GPUS = ("GB300", "GB200", "B300", "B200", "H200", "H100", "A100", "L40S")


def service_launch() -> dict[str, Any]:
    """A launch as a user makes one: `cgsvc serve` (SQLite, the local dispatcher), then
    `cgsvc-cli launch --spec ... --wait` of a plan for this machine (its GPU, or cpu), and what the
    report says ran: dtype and KV budget (a launch passes neither: auto), graph modes, attention,
    fidelity.
    The server and the client run as their own processes with the control plane's packages
    (CGSVC_CONTROL_SITE: where bench/device_run.sh installed them on the GPU machine)."""
    paths = [os.environ.get("CGSVC_CONTROL_SITE", ""), str(ROOT), str(ROOT / "workers"), str(ROOT / "clients"),
             os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    data = CKPT / "service"
    data.mkdir(mode=0o700, exist_ok=True)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    gpu = next((g for g in CATALOG_GPUS if g in name), "H100") if torch.cuda.is_available() else "cpu"
    ckpt = checkpoint("moe")
    spec = {"model": {"path": ckpt}, "hardware": {"gpu": gpu, "gpu_count": 1}, "parallelism": {"tp": 1}}
    (data / "spec.json").write_text(json.dumps(spec))
    with open(data / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                                   "--data-dir", str(data / "srv")], stdout=subprocess.PIPE, stderr=log, text=True,
                                  env=env)
    try:
        address = ""
        assert server.stdout is not None
        for line in server.stdout:
            if "listening on " in line:
                address = line.split("listening on ")[1].split()[0]
                break
        if not address:
            raise RuntimeError(f"the server did not start: {(data / 'server.log').read_text()[-1500:]}")
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launch", "--spec", str(data / "spec.json"),
                               "--model-path", ckpt, "--input-len", "64", "--output-len", "16", "--requests", "4",
                               "--concurrency", "2", "--wait", "--server", address, "-o", "json"],
                              capture_output=True, text=True, env=env, timeout=300)
        launch = json.loads(proc.stdout).get("launch", {}) if proc.stdout.strip().startswith("{") else {}
        if not launch:
            raise RuntimeError(f"launch answered rc {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
    finally:
        server.terminate()
        server.wait(30)
    report = launch.get("report", {})
    worker = report.get("worker", {})
    log = data / "srv" / "launches" / str(launch.get("name", "")).removeprefix("launches/") / "logs" / "rank0.log"
    said = log.read_text().splitlines() if log.exists() else []
    return {"gpu": f"{name} -> spec gpu {gpu}", "launch": launch.get("name"), "state": launch.get("state"),
            "error": launch.get("error", ""), "exit_code": proc.returncode,
            # sizes the launch counted as captured (its bar's count), the warm-up, and rank 0's words for both
            "capture": {"done": launch.get("capture_done", 0), "total": launch.get("capture_total", 0)},
            "timings": worker.get("timings"),
            "rank0_log": [x for x in said if any(w in x for w in ("capturing", "captured", "warmed up"))][:8],
            "dtype": worker.get("dtype"),
            "dtype_reason": worker.get("dtype_reason"),
            "kv_cache": {k: worker.get("kv_cache", {}).get(k) for k in ("budget_bytes", "budget_reason", "pages")},
            "notes": worker.get("notes"), "modes": worker.get("modes"), "attention": worker.get("attention"),
            "ttft_ms_p50": report.get("ttft_ms_p50"), "tpot_ms_p50": report.get("tpot_ms_p50"),
            "table": [{k: f.get(k, "") for k in ("field", "requested", "effective", "status", "reason")}
                      for f in report.get("plan_fidelity", [])] or [{"error": launch.get("error", "no report")}]}


def check_graphs_cpu() -> dict[str, Any]:
    from cgsvc_worker.check_graphs import check_graphs

    path = make_checkpoint(str(CKPT / "tiny"), "tiny")
    view = plan(decode_backend="full", decode_bs=[1, 8], decode_max_bs=8)
    e = Engine(path, tp.single("cpu"), view, EngineOptions(cpu_decode="eager"))
    r = check_graphs(e, "trace")
    return {"table": [{"phase": "decode", "size": x["bs"], "capturable": x["capturable"],
                       "max_abs_diff": x["max_abs_diff"]} for x in r["decode"]], "method": r["method"]}


def prefill_modes() -> dict[str, Any]:
    path = checkpoint("moe")
    sizes = [128, 512]
    rows, base = [], {}
    for mode in ("disabled", "breakable", "tc_piecewise"):
        view = plan(prefill_backend=mode, prefill_num_tokens=[] if mode == "disabled" else sizes,
                    prefill_max_num_tokens=0 if mode == "disabled" else 512)
        t = time.perf_counter()
        e = engine(path, view)
        setup = time.perf_counter() - t
        for n in (100, 500):
            p = prompts([n], e.cfg.vocab_size, seed=n)
            times, logits = [], None
            for i in range(6):
                sync()
                t = time.perf_counter()
                logits = e.prefill([i], p)
                sync()
                times.append((time.perf_counter() - t) * 1000)
                e.release(i)
            assert logits is not None
            if mode == "disabled":
                base[n] = logits
            rows.append({"mode": e.prefill_mode.effective, "prompt": n, "ttft_ms_median": round(statistics.median(times[1:]), 3),
                         "rel_err_vs_eager": round(rel(logits, base[n]), 5), "setup_s": round(setup, 1),
                         "capture_s": round(e.prefill_mode.capture_seconds, 2),
                         "captured": e.prefill_mode.captured_sizes})
        del e
    return {"table": rows}


def fp8_kv() -> dict[str, Any]:
    path = checkpoint("moe")
    native = engine(path, plan(kv_cache_dtype="fp8_e4m3"), page_size=16, kv_mb=256)
    fi = engine(path, plan(kv_cache_dtype="fp8_e4m3", attention_decode="flashinfer"), page_size=16, kv_mb=256)
    bf16 = engine(path, plan(), page_size=16, kv_mb=256)
    ps = prompts([17, 64, 200], native.cfg.vocab_size, seed=7)
    return {"attention": fi.attention_decode.to_dict(),
            "kv_bytes_per_token": {"fp8": fi.cache.bytes_per_token, "bf16": bf16.cache.bytes_per_token},
            "flashinfer_fp8_vs_native_fp8": teacher_forced(native, fi, ps, 8),
            "native_fp8_vs_bf16_cache": teacher_forced(bf16, native, ps, 8)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "var" / "gpu-check"), help="directory for gpu_check.json and .md")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds the whole run may take (default 420)")
    ap.add_argument("--dry-run-on-cpu", action="store_true",
                    help="run the GPU sections on this CPU anyway (they substitute what they cannot run): checks the "
                         "script itself before a GPU's time is spent on it")
    ns = ap.parse_args()
    run = Run(Path(ns.out), ns.budget)
    if ns.dry_run_on_cpu:
        run.cuda, run.result["dry_run_on_cpu"] = True, True
    run.section("versions", versions, gpu=False, needs=0)
    run.section("nccl_graph", nccl_graph, needs=10)
    run.section("trtllm_substitution", trtllm_substitution, needs=15)
    run.section("flashinfer_vs_native", flashinfer_vs_native, needs=60)
    run.section("decode_graphs", decode_graphs, needs=60)
    run.section("check_graphs", check_graphs_cuda, needs=30)
    run.section("prefill_modes", prefill_modes, needs=90)
    run.section("fp8_kv", fp8_kv, needs=60)
    run.section("generate_cli", generate_cli, needs=60)
    run.section("service_launch", service_launch, gpu=False, needs=60)
    if not torch.cuda.is_available():
        run.section("check_graphs_cpu", check_graphs_cpu, gpu=False)
    failed = [s["name"] for s in run.result["sections"] if s["status"] == "failed"]
    print(f"[gpu-check] done in {run.result['elapsed_s']} s; failed: {failed or 'none'}; "
          f"report: {run.out / 'gpu_check.md'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
