"""The local device inventory: which devices the local dispatcher hands to ranks.

`cgsvc serve --local-devices 0,1,2,3` (or `0-7`) names GPUs; by default the machine's own
GPUs (from nvidia-smi, so the server never imports torch), or, on a machine without GPUs,
`--local-slots` CPU slots named cpu0, cpu1, ... Each rank of a launch gets one device of its
own, and no two active launches share a device.
"""

from __future__ import annotations

import collections
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

MAX_LOCAL_DEVICES = 1024  # a machine's devices or CPU slots: more than any one host holds
MAX_RAY_SLOTS = 65536  # ranks at once on a Ray cluster


class DeviceListError(ValueError):
    """A --local-devices value that names no devices, or one twice."""


def detect_gpus() -> list[str]:
    """The indices of this machine's GPUs, or [] when there are none (or no nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()] if out.returncode == 0 else []


def parse_devices(text: str) -> list[str]:
    """"0,1,2,3" or "0-3" or "cpu0,cpu1" -> the device names, in order (at most
    MAX_LOCAL_DEVICES, checked before a range is made)."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if dash and lo.isdigit() and hi.isdigit():
            if int(hi) < int(lo):
                raise DeviceListError(f"--local-devices: range {part!r} runs backwards")
            if len(out) + int(hi) - int(lo) + 1 > MAX_LOCAL_DEVICES:
                raise DeviceListError(_too_many(text))
            out += [str(i) for i in range(int(lo), int(hi) + 1)]
        else:
            out.append(part)
        if len(out) > MAX_LOCAL_DEVICES:
            raise DeviceListError(_too_many(text))
    if not out:
        raise DeviceListError("--local-devices names no device; give GPU ids such as 0,1,2,3 or 0-7")
    dup = sorted(d for d, n in collections.Counter(out).items() if n > 1)
    if dup:
        raise DeviceListError(f"--local-devices names {', '.join(dup)} more than once")
    return out


def _too_many(text: str) -> str:
    shown = text if len(text) <= 40 else text[:37] + "..."
    return (f"--local-devices: {shown!r} names more than one machine holds: at most {MAX_LOCAL_DEVICES} devices "
            "(GPU ids such as 0-7, or CPU slots)")


@dataclass(frozen=True)
class Inventory:
    devices: tuple[str, ...]
    source: str  # how the list was made, for the start-up line

    @classmethod
    def local(cls, configured: str, cpu_slots: int) -> Inventory:
        if configured:
            return cls(tuple(parse_devices(configured)), "--local-devices")
        gpus = detect_gpus()
        if gpus:
            return cls(tuple(gpus), "this machine's GPUs")
        return cls(tuple(f"cpu{i}" for i in range(cpu_slots)), f"{cpu_slots} CPU slots (no GPU found)")

    def take(self, n: int, busy: Iterable[str]) -> list[str] | None:
        """n free devices (the lowest first), or None when fewer are free."""
        taken = set(busy)
        free = [d for d in self.devices if d not in taken]
        return free[:n] if len(free) >= n else None
