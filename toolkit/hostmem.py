"""The memory this process may still allocate, and sizes in words: what a reader, the weight
fillers and a plan's arenas are checked against before they allocate, so that a net or a file
too big for the machine is one line naming it rather than numpy's MemoryError."""
from __future__ import annotations

import os
import resource


def available_memory() -> int | None:
    """Bytes this process may still allocate: the system's available memory (Linux's
    MemAvailable), lowered by an address-space limit (``ulimit -v``) where one is set; None where
    the system says neither."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            used = 0
        found.append(max(soft - used, 0))
    return min(found) if found else None


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB', up to EiB (and beyond, in EiB)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} EiB"


def too_big(nbytes: int) -> str | None:
    """Why ``nbytes`` cannot be allocated here (None when it can, or the system does not say)."""
    free = available_memory()
    if free is not None and nbytes > free:
        return f"more than the {human_bytes(free)} of memory available"
    return None
