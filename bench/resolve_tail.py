"""Where ResolvePlan's tail comes from: latency percentiles at one load, the slow requests
grouped into stalls (requests over p99 that started within 50 ms of each other), and the
server's garbage-collection pauses — for this checkout's server and, with --baseline, another
commit's, rounds alternating.

    .venv/bin/python bench/resolve_tail.py [--callers 32] [--seconds 6] [--rounds 2] [--baseline REV]

A stall that holds every caller shows as one group as large as --callers; queueing shows as
many small groups. GC pauses come from the server's cgsvc_gc_pause_seconds (generation 2),
"-" for a server that does not export it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resolve_cpu import worktree  # noqa: E402
from resolve_load import KIMI, ROOT, start_server, stop_server  # noqa: E402

from cgsvc import codec  # noqa: E402
from cgsvc.spec import parse_spec  # noqa: E402
from cgsvc.v1 import plan_service_pb2, plan_service_pb2_grpc  # noqa: E402

GC2 = re.compile(r'^cgsvc_gc_pause_seconds_(sum|count)\{generation="2"\} ([0-9.e+-]+)$', re.M)
GC2_BUCKET = re.compile(r'^cgsvc_gc_pause_seconds_bucket\{generation="2",le="([^"]+)"\} ([0-9.e+-]+)$', re.M)


async def timeline(address: str, callers: int, seconds: float) -> list[tuple[float, float]]:
    """(start, latency) in seconds for every ResolvePlan answered in `seconds`, after 1 s of warm-up."""
    spec = codec.spec_to_proto(parse_spec(KIMI))
    out: list[tuple[float, float]] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = plan_service_pb2_grpc.PlanServiceStub(ch)

        async def caller(stop: float, keep: bool) -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await stub.ResolvePlan(plan_service_pb2.ResolvePlanRequest(spec=spec, request_id=uuid.uuid4().hex),
                                       timeout=30)
                if keep:
                    out.append((t0, time.perf_counter() - t0))

        for span, keep in ((1.0, False), (seconds, True)):
            stop = time.perf_counter() + span
            await asyncio.gather(*(caller(stop, keep) for _ in range(callers)))
    return out


def gc_pauses(metrics_url: str) -> str:
    """Generation-2 collections during the run: count, mean ms, and the bucket the slowest reached."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    got = dict(GC2.findall(text))
    if "count" not in got:
        return "- | - | -"
    count, total = float(got["count"]), float(got["sum"])
    if not count:
        return "0 | - | -"
    slowest = next((le for le, n in GC2_BUCKET.findall(text) if float(n) == count), "+Inf")
    return f"{count:.0f} | {total / count * 1000:.1f} | <= {slowest}"


def run(root: Path, callers: int, seconds: float) -> str:
    data_dir = tempfile.mkdtemp(prefix="cgsvc-tail-")
    proc, address, metrics = start_server(data_dir, "", metrics=True, root=root)
    try:
        points = asyncio.run(timeline(address, callers, seconds))
        pauses = gc_pauses(metrics)
    finally:
        stop_server(proc, data_dir, "")
    lat = sorted(lat for _, lat in points)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * q))] * 1000
    p99 = pct(0.99) / 1000
    groups: list[int] = []
    last = -1.0
    for start, _ in sorted(p for p in points if p[1] > p99):
        if start - last > 0.05:
            groups.append(0)
        groups[-1] += 1
        last = start
    return (f"{len(points) / seconds:.0f} | {pct(0.5):.1f} | {pct(0.9):.1f} | {pct(0.99):.1f} | {pct(0.999):.1f} | "
            f"{lat[-1] * 1000:.1f} | {len(groups)}: {', '.join(map(str, sorted(groups, reverse=True)[:6]))} | "
            f"{pauses} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--callers", type=int, default=32, help="concurrent ResolvePlan callers")
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per row (after 1 s of warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="times each server runs, alternating")
    ap.add_argument("--baseline", default="", metavar="REV", help="also run the server of this git revision")
    ns = ap.parse_args()
    with contextlib.ExitStack() as stack:
        runs = [("this checkout", ROOT)]
        if ns.baseline:
            base, commit = stack.enter_context(worktree(ns.baseline))
            runs.append((f"@{commit}", base))
        print(f"# ResolvePlan, {ns.callers} callers, {ns.seconds:.0f} s per row, SQLite; stalls: groups of requests "
              "over p99 started within 50 ms (count: largest sizes)")
        print("| round | server | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | stalls | gen-2 GCs | "
              "mean GC ms | slowest GC s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for rnd in range(1, ns.rounds + 1):
            for name, root in runs if rnd % 2 else runs[::-1]:
                print(f"| {rnd} | {name} | {run(root, ns.callers, ns.seconds)}", flush=True)


if __name__ == "__main__":
    main()
