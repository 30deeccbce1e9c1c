"""Running ``toolkit`` in a child process under resource limits, for the tests of hostile input:
an address-space limit where bounded memory is the point, a file-size limit that makes writes
fail as a full disk does (CPython ignores SIGXFSZ, so a write past it fails with EFBIG), and a
wall-clock bound."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Bounded:
    status: int
    out: str
    err: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.err.strip().splitlines()


def run_toolkit(*args, memory_mb: int | None = None, file_kb: int | None = None, timeout: float = 60,
                env: dict | None = None, cwd=None) -> Bounded:
    """``toolkit ARGS`` with at most ``memory_mb`` of address space and files of at most
    ``file_kb``; fails the test if it runs past ``timeout`` seconds."""
    def limit():
        if memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        if file_kb is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_kb << 10, file_kb << 10))
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], capture_output=True, text=True,
                          preexec_fn=limit, env=environment, cwd=cwd or ROOT, timeout=timeout)
    return Bounded(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


def run_python(code: str, memory_mb: int | None = None, timeout: float = 60, cwd=None) -> Bounded:
    """``python -c CODE`` (the Python API's cases) under the same bounds as ``run_toolkit``."""
    def limit():
        if memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit,
                          env=environment, cwd=cwd or ROOT, timeout=timeout)
    return Bounded(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)
