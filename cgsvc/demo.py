"""The main job of the quick start (`make demo`), on the embedded defaults:

1. start `cgsvc serve` on a free loopback port (SQLite under var/demo),
2. resolve the Kimi-K2.6 / 4xGB300 TP4 example through it and print the plan,
3. list its audit record and verify the audit chain.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"
DATA = ROOT / "var" / "demo"


def step(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def cli(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], cwd=ROOT).returncode


def start_server() -> tuple[subprocess.Popen[str], str]:
    """Start the server on a free port; return it and the address it printed."""
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
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
        step("the audit record of that request")
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
