"""Real server processes for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from tests.conftest import ROOT


class ServerProcess:
    """`cgsvc serve` in its own process, on a free loopback port."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> None:
        """`prefix`: a command the server runs under (it must exec it, keeping the pid)."""
        self.data_dir = data_dir
        self.args = args
        self.prefix = tuple(prefix)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.address = ""
        self.output: list[str] = []
        self.log_path = data_dir / "server.log"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # as a careful operator makes one
        address = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        self._stderr: IO[Any] = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "cgsvc.server.main", "serve", "--address", address,
             "--data-dir", str(self.data_dir), *self.args],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=ROOT, env=self.env)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server exited ({self.proc.wait()}): {self.log_path.read_text()[-2000:]}")
            self.output.append(line)
            m = re.search(r"listening on (\S+):(\d+)", line)
            if m:
                self.port = int(m.group(2))
                self.address = f"127.0.0.1:{self.port}"
                while not self.output[-1].startswith("transport:"):  # start-up lines end with it
                    self.output.append(self.proc.stdout.readline())
                return self
        raise RuntimeError("server did not report its port in time")

    def metrics_text(self) -> str:
        """Its Prometheus metrics, from the address its latest start-up line names."""
        line = next(x for x in reversed(self.output) if x.startswith("transport:"))
        return urllib.request.urlopen(line.split("metrics: ")[1].strip(), timeout=5).read().decode()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
        finally:
            self._stderr.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_refused(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`cgsvc serve` on data_dir that must stop at start (exit 2): its stderr. A later --address in
    args overrides the loopback one."""
    proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                           "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr
