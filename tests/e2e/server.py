"""Real server processes for end-to-end tests."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from tests.conftest import ROOT


class PortTaken(RuntimeError):
    """The port picked for a first start was taken before the server bound it."""


def quiet_port() -> int:
    """A loopback port free now and below the ephemeral range, which no connect() or bind(0)
    hands out: a server restarted on it finds it free again."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="utf-8") as fh:
            low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    while True:
        port = random.randrange(max(1025, low // 2), low)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


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
        """Start it; a restart comes back on the port of the first start. That port is picked below
        the kernel's ephemeral range: a port 0 gave was one of it, and while the server was down a
        connection or a bind(0) elsewhere (a worker group's gloo store) could take it, so that the
        restart failed "Address already in use"."""
        if self.port:
            return self._start(self.port, timeout)
        for _ in range(20):
            try:
                return self._start(quiet_port(), timeout)
            except PortTaken:  # another test took it between the check and the bind
                continue
        raise RuntimeError("no free loopback port below the ephemeral range after 20 tries")

    def _start(self, port: int, timeout: float) -> ServerProcess:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # as a careful operator makes one
        address = f"127.0.0.1:{port}"
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
                code, log = self.proc.wait(), self.log_path.read_text()[-2000:]
                if not self.port and f"cannot listen on {address}: Address already in use" in log:
                    raise PortTaken(address)
                raise RuntimeError(f"server exited ({code}): {log}")
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
