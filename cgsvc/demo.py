"""The main job of the quick start (`make demo`): the whole mission on the embedded defaults.

1. start `cgsvc serve` on a free loopback port (SQLite under var/demo),
2. resolve the Kimi-K2.6 / 4xGB300 TP4 example through it and print the plan,
3. generate a small Kimi-K2.6-shaped checkpoint (no downloads),
4. launch that plan on 4 local CPU worker processes, watch it run, and print the
   requested vs effective modes and the measured TTFT/TPOT,
5. ask what sglang 0.5.17's argument handling would change across the recorded history
   (`policy impact`),
6. list the audit records and verify the audit chain.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"
DATA = ROOT / "var" / "demo"


def step(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def cli(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], cwd=ROOT).returncode


def cli_json(*args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args, "--output", "json"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def start_server() -> tuple[subprocess.Popen[str], str]:
    """Start the server on a free port; return it and the address it printed."""
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(mode=0o700, parents=True)  # the server's files are its own
    log = open(DATA / "server.log", "w")  # noqa: SIM115 - handed to the server process
    proc = subprocess.Popen([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                             "--data-dir", str(DATA)], stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    assert proc.stdout is not None
    address = ""
    for line in proc.stdout:
        print(f"  server: {line.rstrip()}")
        m = re.search(r"listening on (\S+)", line)
        if m:
            address = m.group(1)
        if line.startswith("transport:"):
            return proc, address
    raise SystemExit(f"the server did not start; see {DATA / 'server.log'}")


def main() -> int:
    step("starting cgsvc serve (SQLite under var/demo, insecure loopback)")
    proc, address = start_server()
    try:
        step(f"resolving {EXAMPLE.name} through the server at {address}")
        rc = cli("resolve", "--spec", str(EXAMPLE), "--server", address, "--output", "table")
        plan = cli_json("plans", "list", "--server", address, "--filter", 'policy = "cgsvc"')["plans"][-1]["name"]
        step("generating a small Kimi-K2.6-shaped checkpoint (random weights, hub layout)")
        ckpt = DATA / "tiny-kimi-k2.6"
        rc |= subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "make-checkpoint", "--out", str(ckpt),
                              "--preset", "tiny-kimi"], cwd=ROOT).returncode
        step(f"launching {plan} on 4 local CPU worker processes (TP4 over gloo)")
        rc |= cli("launch", "--plan", plan, "--model-path", str(ckpt), "--input-len", "64", "--output-len", "16",
                  "--requests", "4", "--concurrency", "1", "--wait", "--server", address, "--output", "table")
        step("what sglang 0.5.17's argument handling would change across this history")
        rc |= cli("policy", "impact", "--candidate", "sglang-0.5.17", "--server", address, "--output", "table")
        step("the audit trail: the plan, the launch and its state changes")
        rc |= cli("audit", "list", "--server", address, "--output", "table")
        step("verifying the audit chain")
        rc |= cli("audit", "verify", "--server", address, "--output", "table")
        return rc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        print(f"\nserver stopped; its log and database are in {DATA.relative_to(ROOT)}/")


if __name__ == "__main__":
    sys.exit(main())
