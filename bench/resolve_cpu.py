"""Where a durable ResolvePlan's time goes: CPU per request in the server, its audit writer
process and the client, with the writer's batch sizes and commit times — side by side for
server variants, rounds alternating so that a noisy machine affects every variant alike.

    .venv/bin/python bench/resolve_cpu.py [--seconds 4] [--rounds 2]
        [--levels echo@8,resolve@8,echo@32,resolve@32] [--variant NAME=FLAG,FLAG ...] [--postgresql]
        [--baseline REV]

A variant is a name and `cgsvc serve` flags, e.g. `--variant nowait=--audit-cohort-wait-ms=0`;
without one, the defaults run. `--baseline REV` runs every variant a second time on the server
of another commit (a temporary `git worktree`; the client is this checkout's for both), so a
change is measured against its parent in one run: `--baseline HEAD` for uncommitted work. Each
round runs the variants in turn, in reverse order every other round. CPU is read from /proc
(user + system) over the measured seconds plus the one-second warm-up, so it is an upper bound
per request (with --postgresql also every PostgreSQL process's, whatever else they serve);
batch figures come from the server's Prometheus metrics (cgsvc_audit_batch_records,
cgsvc_audit_append_seconds).

With two variants or more (a baseline counts), it ends with each against the first, round by
round: the rounds' req/s ratios and their median, and the server's CPU a request over the load
client's (the same client code for every variant, so it discounts how fast the machine was at the
moment). On a VM whose speed moves by tens of percent a minute, ten rounds or more are needed
before a 10 % difference means anything (bench/RESULTS.md, round 28).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resolve_load import ROOT, drive, pg_schema_url, start_server, stop_server  # noqa: E402

METRIC = re.compile(r'^(cgsvc_audit_\w+?)(_sum|_count|_bucket)(?:\{le="([^"]+)"\})? ([0-9.e+-]+)$')


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_pids() -> list[int]:
    """Every PostgreSQL server process on this machine (its backends, WAL writer, checkpointer)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
    return pids


def cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each of these processes still running."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = cpu_seconds(pid)
    return out


def scrape(url: str) -> dict[tuple[str, str | None], float]:
    out: dict[tuple[str, str | None], float] = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        m = METRIC.match(line)
        if m:
            out[(m.group(1) + m.group(2), m.group(3))] = float(m.group(4))
    return out


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[tuple[Path, str]]:
    """A detached checkout of `rev` in a temporary directory: (path, its short commit id)."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"--baseline: git cannot find {rev!r}: {commit.stderr.strip()}")
    path = Path(tempfile.mkdtemp(prefix="cgsvc-baseline-")) / "checkout"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), rev], cwd=ROOT, check=True)
    try:
        yield path, commit.stdout.strip()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)
        shutil.rmtree(path.parent, ignore_errors=True)


@dataclass(frozen=True)
class Row:
    """One op at one load on one variant's server: its table row and the figures the paired
    summary compares (CPU ms a request; None where nothing was served)."""

    op: str
    callers: int
    rate: float
    server: float | None
    client: float | None
    text: str


def run_variant(flags: list[str], levels: list[tuple[str, int]], seconds: float, postgresql: bool,
                root: Path = ROOT) -> list[Row]:
    data_dir = tempfile.mkdtemp(prefix="cgsvc-cpu-")
    url = (pg_schema_url() or "") if postgresql else ""
    if postgresql and not url:
        raise SystemExit("no PostgreSQL server answers (CGSVC_BENCH_PG)")
    proc, address, metrics = start_server(data_dir, url, *flags, metrics=True, root=root)
    rows = []
    try:
        time.sleep(0.5)
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        for op, callers in levels:
            before = {p: cpu_seconds(p) for p in [proc.pid, *children]}
            db0 = cpu_of(postgres_pids()) if postgresql else {}
            m0, client0 = scrape(metrics), time.process_time()
            rate, p50, p99, errors = asyncio.run(drive(address, op, callers, seconds))
            after = {p: cpu_seconds(p) for p in before}
            db1 = cpu_of(list(db0))
            m1, client = scrape(metrics), time.process_time() - client0
            requests = rate * (seconds + 1)  # measured window plus warm-up, which also used CPU

            def ms(total: float, n: float = requests) -> float | None:
                return total / n * 1000 if n else None

            def per_request(total: float) -> str:
                value = ms(total)
                return "-" if value is None else f"{value:.3f}"

            def delta(key: str, le: str | None = None, m0: dict = m0, m1: dict = m1) -> float:  # type: ignore[type-arg]
                return m1.get((key, le), 0.0) - m0.get((key, le), 0.0)

            batches = delta("cgsvc_audit_batch_records_count")
            over = batches - delta("cgsvc_audit_append_seconds_bucket", "0.002")
            server = after[proc.pid] - before[proc.pid]
            text = (
                f"| {op} | {callers} | {rate:.0f} | {p50:.2f} | {p99:.2f} | "
                f"{per_request(server)} | "
                f"{per_request(sum(after[p] - before[p] for p in children))} | {per_request(client)} | "
                + (f"{per_request(sum(db1[p] - db0[p] for p in db1))} | " if postgresql else "")
                + (f"{delta('cgsvc_audit_batch_records_sum') / batches:.1f} | "
                   f"{delta('cgsvc_audit_append_seconds_sum') / batches * 1000:.2f} | {over / batches:.0%} |"
                   if batches else "- | - | - |")
                + f" {errors} |")
            rows.append(Row(op, callers, rate, ms(server), ms(client), text))
    finally:
        stop_server(proc, data_dir, url)
    return rows


def cpu_ratio(rows: list[Row]) -> str:
    """The median over rows of the server's CPU a request over the client's ("-": none served)."""
    shares = [r.server / r.client for r in rows if r.server is not None and r.client]
    return f"{statistics.median(shares):.2f}" if shares else "-"


def paired(results: dict[str, list[list[Row]]]) -> list[str]:
    """Each variant against the first, round by round: a noisy machine moves both rows of a
    round alike, so the median of the rounds' ratios is steadier than a ratio of means. `results`
    maps a variant's name to its rows, one list per round, in the order the variants were given.
    Compares req/s, and the server's CPU a request over the load client's (the client's code is
    the same for every variant, so this ratio discounts the machine's speed of the moment)."""
    names = list(results)
    if len(names) < 2:
        return []
    first = names[0]
    out = [f"# each variant against {first}, round by round (median of the rounds' ratios)",
           "| op | callers | variant | rounds | req/s ratio per round | req/s ratio, median | "
           "server / client CPU, median: variant / first |", "|---|---|---|---|---|---|---|"]
    for name in names[1:]:
        for i, base_row in enumerate(results[first][0]):
            pairs = [(b[i], v[i]) for b, v in zip(results[first], results[name], strict=True)]
            ratios = [v.rate / b.rate for b, v in pairs if b.rate > 0]
            out.append(f"| {base_row.op} | {base_row.callers} | {name} | {len(pairs)} | "
                       f"{', '.join(f'{r:.2f}' for r in ratios) or '-'} | "
                       f"{f'{statistics.median(ratios):.2f}' if ratios else '-'} | "
                       f"{cpu_ratio([v for _, v in pairs])} / {cpu_ratio([b for b, _ in pairs])} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per row (after 1 s of warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="times every variant runs, alternating")
    ap.add_argument("--levels", default="echo@8,resolve@8,echo@32,resolve@32",
                    help="comma-separated OP@CALLERS rows, OP one of echo, resolve")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=FLAG,FLAG: a server variant and its `cgsvc serve` flags (repeatable)")
    ap.add_argument("--postgresql", action="store_true", help="log to a fresh schema on the PostgreSQL server")
    ap.add_argument("--baseline", default="", metavar="REV",
                    help="also run every variant on the server of this git revision (e.g. HEAD, main~1)")
    ns = ap.parse_args()
    levels = []
    for item in ns.levels.split(","):
        op, _, callers = item.partition("@")
        if op not in ("echo", "resolve") or not callers.isdigit():
            ap.error(f"--levels: OP@CALLERS with OP echo or resolve, got {item!r}")
        levels.append((op, int(callers)))
    variants: dict[str, list[str]] = {"default": []} if not ns.variant else {}
    for spec in ns.variant:
        name, _, flags = spec.partition("=")
        variants[name] = [f for f in flags.split(",") if f]
    with contextlib.ExitStack() as stack:
        runs = [(name, flags, ROOT) for name, flags in variants.items()]
        if ns.baseline:
            base, commit = stack.enter_context(worktree(ns.baseline))
            runs += [(f"{name} @{commit}", flags, base) for name, flags in variants.items()]
            print(f"# baseline: {ns.baseline} ({commit}); the other rows run this checkout's server", flush=True)
        db = " | postgres" if ns.postgresql else ""
        print(f"# {os.cpu_count()} CPUs; CPU ms per request (server process, its writer process, the client"
              f"{', every PostgreSQL process' if ns.postgresql else ''}); {ns.seconds:.0f} s per row; "
              f"{'postgresql' if ns.postgresql else 'sqlite'}")
        print(f"| round | variant | op | callers | req/s | p50 ms | p99 ms | server | writer | client{db} | "
              "records/commit | ms/commit | commits > 2 ms | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|" + "---|" * (4 + bool(db)))
        results: dict[str, list[list[Row]]] = {name: [] for name, _, _ in runs}
        for rnd in range(ns.rounds):
            for name, flags, root in (runs if rnd % 2 == 0 else runs[::-1]):
                rows = run_variant(flags, levels, ns.seconds, ns.postgresql, root)
                results[name].append(rows)
                for row in rows:
                    print(f"| {rnd + 1} | {name} {row.text}", flush=True)
        if summary := paired(results):
            print()
            print("\n".join(summary))


if __name__ == "__main__":
    main()
