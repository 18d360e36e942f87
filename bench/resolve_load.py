"""ResolvePlan throughput and latency against a running server, next to an Echo ceiling.

    .venv/bin/python bench/resolve_load.py [--seconds 5] [--backends sqlite,postgresql] [--slices 4]
        [--concurrency 1,8,32] [--runs 1] [--pg-setting NAME=VALUE ...]

Starts `cgsvc serve` (durable auditing: SQLite WAL + synchronous=FULL, or PostgreSQL),
drives it from one asyncio client process at 1, 8 and 32 concurrent callers, and prints a
Markdown table for bench/RESULTS.md. Echo runs on the same server stack (auth, logging,
metrics) without resolving or auditing, so it is the ceiling for this transport. Each row
gives each op `--seconds` in `--slices` turns, Echo and ResolvePlan alternating: on a machine
whose speed drifts by tens of percent from one few seconds to the next, all of Echo and then
all of ResolvePlan put the drift into the ratio (`--slices 1` runs them that way). What a
ResolvePlan turn leaves behind (the SQLite checkpoint thread's next copy, at most once a
second) can fall into the Echo turn after it.

One run is one sample of a machine whose speed moves from minute to minute: `--runs N` repeats
the whole table N times (fresh servers each time) and ends with each row's spread and the
number of runs that met the durable-path target. `--pg-setting` passes a PostgreSQL setting to
the server's connections (`-c NAME=VALUE`), for probes such as `synchronous_commit=off`.

The "cores busy" column is the share of the whole machine's CPU time (every core, every
process: server, writer, database, this client) that was busy during each op's measured turns,
from /proc/stat ("-" where there is none). It says what a miss is: cores near full under both
ops mean the durable path needs less CPU (or more cores); cores left idle under ResolvePlan mean
its callers wait on something other than the CPU. A row that misses the target says both figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import sqlalchemy as sa

from cgsvc import codec
from cgsvc.spec import parse_spec
from cgsvc.v1 import diagnostics_pb2, diagnostics_pb2_grpc, plan_service_pb2, plan_service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("CGSVC_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}


def start_server(data_dir: str, database_url: str, *flags: str, metrics: bool = False,
                 root: Path = ROOT) -> tuple[subprocess.Popen[str], str, str]:
    """`cgsvc serve` on a free port: (process, address, metrics URL or ""). `root`: the checkout
    whose cgsvc runs (`python -m` puts its working directory first on the path)."""
    args = [sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0", "--data-dir", data_dir,
            "--metrics-address", "127.0.0.1:0" if metrics else "", "--log-level", "warning", *flags]
    if database_url:
        args += ["--database-url", database_url]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root)
    assert proc.stdout is not None
    address = ""
    for line in proc.stdout:
        if m := re.search(r"listening on (\S+)", line):
            address = m.group(1)
        if m := re.search(r"metrics: (\S+?);?$", line):
            return proc, address, m.group(1) if metrics else ""
    raise RuntimeError("server did not start")


def stop_server(proc: subprocess.Popen[str], data_dir: str, database_url: str) -> None:
    """Stop it, remove its data directory and, for PostgreSQL, its schema."""
    proc.terminate()
    proc.wait(30)
    shutil.rmtree(data_dir, ignore_errors=True)
    if database_url:
        drop_schema(database_url)


def pg_schema_url(settings: Sequence[str] = ()) -> str | None:
    """A URL for a fresh schema of the bench's PostgreSQL database, or None when no server
    answers. `settings`: NAME=VALUE pairs every connection of the server sets (libpq options)."""
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        eng = sa.create_engine(PG, connect_args={"connect_timeout": 3})
        with eng.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        eng.dispose()
    except sa.exc.OperationalError:
        return None
    options = [f"-c{quote(name, safe='')}%3D{quote(value, safe='')}"
               for name, value in (setting.split("=", 1) for setting in settings)]
    joiner = "&" if "?" in PG else "?"  # CGSVC_BENCH_PG may carry a query of its own (?host=/run/postgresql)
    return f"{PG}{joiner}options={'%20'.join([*options, f'-csearch_path%3D{schema}'])}"


def drop_schema(url: str) -> str:
    """Drop the schema a pg_schema_url URL names; its name."""
    m = re.search(r"-csearch_path%3D([A-Za-z0-9_]+)", url)
    assert m is not None, url
    schema = m.group(1)
    eng = sa.create_engine(PG)
    with eng.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    eng.dispose()
    return schema


# requests/s, p50 ms, p99 ms, errors[, share of the machine's CPU time busy (None: unknown)]
Stats = tuple[Any, ...]


def cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, all) CPU time of the whole machine so far, in clock ticks, from the first line of
    /proc/stat; None where it cannot be read. Idle, I/O wait and time stolen by a hypervisor
    are not busy (steal is counted in neither: it was never this machine's)."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    steal = ticks[7] if len(ticks) > 7 else 0
    idle = ticks[3] + ticks[4]
    total = sum(ticks) - steal
    return total - idle, total


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> tuple[int, int]:
    """The busy and all ticks between two readings ((0, 0) when either is unknown)."""
    if before is None or after is None:
        return 0, 0
    return after[0] - before[0], after[1] - before[1]


async def drive(address: str, op: str, concurrency: int, seconds: float) -> tuple[float, float, float, int]:
    """(requests/s, p50 ms, p99 ms, errors) of one op over `seconds`, after a short warm-up
    (bench/resolve_cpu.py's rows)."""
    return (await drive_slices(address, [op], concurrency, seconds, 1))[op][:4]


async def drive_slices(address: str, ops: list[str], concurrency: int, seconds: float, slices: int) -> dict[str, Stats]:
    """Each op's figures over `seconds` of its own, taken in `slices` turns that alternate
    between the ops (A B B A A B ...: a machine whose speed drifts during the row weighs on
    every op alike), after a second's warm-up of each; one channel throughout."""
    spec = codec.spec_to_proto(parse_spec(KIMI))
    async with grpc.aio.insecure_channel(address) as ch:
        plans = plan_service_pb2_grpc.PlanServiceStub(ch)
        diag = diagnostics_pb2_grpc.DiagnosticsServiceStub(ch)
        lat: dict[str, list[float]] = {op: [] for op in ops}
        took = dict.fromkeys(ops, 0.0)
        errors = dict.fromkeys(ops, 0)
        ticks = {op: [0, 0] for op in ops}  # busy, all: the machine's CPU during the op's turns

        async def one(op: str) -> None:
            if op == "echo":
                await diag.Echo(diagnostics_pb2.EchoRequest(), timeout=10)
            else:
                await plans.ResolvePlan(plan_service_pb2.ResolvePlanRequest(spec=spec, request_id=uuid.uuid4().hex),
                                        timeout=10)

        async def turn(op: str, length: float, measured: bool) -> None:
            stop_at = time.perf_counter() + length

            async def worker() -> None:
                while time.perf_counter() < stop_at:
                    t0 = time.perf_counter()
                    try:
                        await one(op)
                    except grpc.RpcError:
                        errors[op] += measured
                        continue
                    if measured:
                        lat[op].append(time.perf_counter() - t0)

            t_start, cpu_start = time.perf_counter(), cpu_times()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            if measured:
                took[op] += time.perf_counter() - t_start
                busy, every = busy_share(cpu_start, cpu_times())
                ticks[op][0] += busy
                ticks[op][1] += every

        for op in ops:
            await turn(op, 1.0, measured=False)  # warm-up
        for k in range(slices):
            for op in ops if k % 2 == 0 else ops[::-1]:
                await turn(op, seconds / slices, measured=True)
    out: dict[str, Stats] = {}
    for op, got in lat.items():
        got.sort()
        busy, every = ticks[op]
        out[op] = (len(got) / took[op], statistics.median(got) * 1000, got[max(0, int(len(got) * 0.99) - 1)] * 1000,
                   errors[op], busy / every if every else None)
    return out


Row = tuple[int, str, int, Stats, Stats]  # run, store, callers, Echo's figures, ResolvePlan's
TARGET = "the durable-path target (ResolvePlan >= 50 % of Echo at 8 and 32 callers, p99 at 32 <= max(20 ms, 2 x Echo's))"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per row (after 1 s of warm-up)")
    ap.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrent callers per row")
    ap.add_argument("--slices", type=int, default=4,
                    help="turns each op's seconds are taken in, Echo and ResolvePlan alternating (1: all of Echo, "
                         "then all of ResolvePlan)")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat the whole table this many times, fresh servers each time, then summarise each "
                         "row's spread and how many runs met the target")
    ap.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                    help="a PostgreSQL setting for the server's connections (repeatable), e.g. "
                         "synchronous_commit=off for a probe; the target's figures use none")
    ns = ap.parse_args()
    if ns.runs < 1:
        ap.error(f"--runs: at least 1, got {ns.runs}")
    for setting in ns.pg_setting:
        if not re.fullmatch(r"[a-z_][a-z0-9_.]*=\S+", setting):
            ap.error(f"--pg-setting: NAME=VALUE (a PostgreSQL setting name, lower case), got {setting!r}")
    levels = [int(c) for c in ns.concurrency.split(",")]
    many = ns.runs > 1
    settings = f"; PostgreSQL with {', '.join(ns.pg_setting)}" if ns.pg_setting else ""
    print(f"# {os.cpu_count()} CPUs, server and client on one machine, {ns.seconds:.0f} s of each op per row "
          f"in {ns.slices} alternating turns{f', {ns.runs} runs' if many else ''}{settings}")
    print(("| run " if many else "") + "| store | concurrency | Echo req/s | ResolvePlan req/s | ratio | "
          "ResolvePlan p50 ms | p99 ms | Echo p99 ms | cores busy, Echo / ResolvePlan | errors |")
    print(("|---" if many else "") + "|---|---|---|---|---|---|---|---|---|---|")
    rows: list[Row] = []
    for run in range(1, ns.runs + 1):
        for backend in ns.backends.split(","):
            url = ""
            if backend == "postgresql":
                maybe = pg_schema_url(ns.pg_setting)
                if maybe is None:
                    print(("| - " if many else "") + f"| postgresql | - | skipped: no server at {PG} | | | | | | |")
                    continue
                url = maybe
            tmp = tempfile.mkdtemp(prefix="cgsvc-bench-")
            proc, address, _ = start_server(tmp, url)
            try:
                for c in levels:
                    got = asyncio.run(drive_slices(address, ["echo", "resolve"], c, ns.seconds, ns.slices))
                    echo, res = got["echo"], got["resolve"]
                    print((f"| {run} " if many else "") + f"| {backend} | {c} | {echo[0]:.0f} | {res[0]:.0f} | "
                          f"{res[0] / echo[0]:.0%} | {res[1]:.2f} | {res[2]:.2f} | {echo[2]:.2f} | "
                          f"{busy_pair(echo, res)} | {res[3] + echo[3]} |",
                          flush=True)
                    rows.append((run, backend, c, echo, res))
            finally:
                stop_server(proc, tmp, url)
    if {8, 32} <= set(levels):
        for line in summary(rows, ns.runs):
            print(line)


def summary(rows: Sequence[Row], runs: int) -> list[str]:
    """The verdict on the target: for one run its line as it always was; for several, each
    target row's spread (min / median / max) and then how many runs met the whole target."""
    misses = {run: [m for r, backend, c, echo, res in rows if r == run for m in target_misses(backend, c, echo, res)]
              for run in range(1, runs + 1)}
    if runs == 1:
        return [f"# {TARGET}: {'missed: ' + '; '.join(misses[1]) if misses[1] else 'met'}"]
    out = ["", "| store | concurrency | runs | ratio min / median / max | ResolvePlan p99 ms min / median / max "
               "| runs meeting this row's target |", "|---|---|---|---|---|---|"]
    for backend, c in dict.fromkeys((backend, c) for _, backend, c, _, _ in rows if c in (8, 32)):
        mine = [(echo, res) for _, b, k, echo, res in rows if (b, k) == (backend, c)]
        ratios = sorted(res[0] / echo[0] for echo, res in mine)
        p99s = sorted(res[2] for _, res in mine)
        ok = sum(not target_misses(backend, c, echo, res) for echo, res in mine)
        out.append(f"| {backend} | {c} | {len(mine)} | {ratios[0]:.0%} / {statistics.median(ratios):.0%} / "
                   f"{ratios[-1]:.0%} | {p99s[0]:.1f} / {statistics.median(p99s):.1f} / {p99s[-1]:.1f} | "
                   f"{ok} of {len(mine)} |")
    out.append("")
    out += [f"# run {run}: {'missed: ' + '; '.join(m) if m else 'met'}" for run, m in misses.items()]
    met = sum(not m for m in misses.values())
    out.append(f"# {TARGET}: met in {met} of {runs} runs")
    return out


def busy(stats: Stats) -> float | None:
    return stats[4] if len(stats) > 4 else None


def busy_pair(echo: Stats, res: Stats) -> str:
    """"91% / 78%": how busy the machine's cores were under each op; "-" for one unknown."""
    return " / ".join("-" if (b := busy(s)) is None else f"{b:.0%}" for s in (echo, res))


def target_misses(backend: str, callers: int, echo: Stats, res: Stats) -> list[str]:
    """Where a row misses the durable-path target (throughput and latency as measured here); a
    throughput miss says how busy the cores were under each op, where that was measured."""
    out = []
    if callers in (8, 32) and res[0] < 0.5 * echo[0]:
        cores = "" if busy(echo) is None and busy(res) is None else f" (cores busy {busy_pair(echo, res)})"
        out.append(f"{backend} at {callers} callers {res[0] / echo[0]:.1%} of Echo{cores}")
    if callers == 32 and res[2] > max(20.0, 2 * echo[2]):
        out.append(f"{backend} p99 at 32 callers {res[2]:.1f} ms > {max(20.0, 2 * echo[2]):.1f}")
    return out


if __name__ == "__main__":
    main()
