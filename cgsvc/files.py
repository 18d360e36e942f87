"""Files replaced whole: the one way cgsvc rewrites a file that someone else may read meanwhile
(a token file a server reloads, a witness's kept checkpoint, a worker's report)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_atomically(path: str | Path, text: str, mode: int | None = None) -> None:
    """Replace the file at `path` with `text`: written to a new file beside it, flushed to disk,
    renamed over it, and the directory synced, so that a crash or a reader at that moment finds
    the old file or the new one, never half of one. `mode`: the new file's permissions (None: as
    open() makes a file, under the umask). A failure leaves no temporary file behind."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
