"""Atomic file writes: a write either completes or leaves the previous file as it was."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def _default_mode() -> int:
    """What a plain open() would give a new file under the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(target: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` fills a temporary file in the target's folder; it is synced to disk, given
    ordinary permissions, and renamed over the target. On any failure the temporary file goes
    and the target is untouched."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
