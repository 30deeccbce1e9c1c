"""Each rank of a data-parallel job is two processes: the one the launcher started, which only
supervises, and the rank process it starts, which trains. When the rank process dies by a signal
(SIGKILL, the out-of-memory killer, a crash), its supervisor says which rank died and how, then
exits non-zero; the launcher then stops every other rank at once, as for any failed process.
Without the supervisor the launcher names the dead process by its pid alone.

The rank process inherits the launcher's environment and descriptors (its MPI connection), is
killed with its supervisor (Linux's parent-death signal), and gets the supervisor's SIGINT and
SIGTERM, which the launcher sends to the processes it started. It knows it is one by the marker
``TOOLKIT_RANK_PROCESS`` (the supervisor's pid), an internal variable, not a setting.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from ..settings import RANK_PROCESS
from .launcher import missing_extra

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_PR_SET_PDEATHSIG = 1


def available() -> bool:
    """Supervision needs the parent-death signal: Linux."""
    return sys.platform.startswith("linux")


def in_rank_process() -> bool:
    return os.environ.get(RANK_PROCESS) is not None


def die_with_supervisor() -> None:
    """Called first thing in the rank process: it must not outlive a supervisor that the
    launcher killed (it would wait forever on a collective)."""
    supervisor = int(os.environ[RANK_PROCESS])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor:        # the supervisor died before the line above
        os._exit(1)


def launched_rank() -> str:
    return next((os.environ[v] for v in _RANK_VARS if v in os.environ), "?")


def supervise(argv: list[str], size: int) -> int:
    try:
        import mpi4py  # noqa: F401  (only the package: MPI itself starts in the rank process)
    except ImportError as e:
        raise missing_extra(e) from None
    env = dict(os.environ, **{RANK_PROCESS: str(os.getpid())})
    # a process group of its own: a launcher that signals the supervisor's whole group (hydra
    # does) would otherwise deliver Ctrl-C twice, once directly and once forwarded below, and a
    # second SIGINT landing after the run has checkpointed and put back Python's own handler
    # killed the rank on its way out (the job then ended with 9, not 130)
    child = subprocess.Popen([sys.executable, "-m", "toolkit.cli", *argv], env=env, close_fds=False,
                             process_group=0)

    def forward(signum, frame):
        child.send_signal(signum)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if status >= 0:
        return status
    sig = signal.Signals(-status)
    hint = " (out of memory?)" if sig == signal.SIGKILL else ""
    print(f"error: rank {launched_rank()} of {size} (pid {child.pid}) was killed by {sig.name}{hint}; "
          f"the job stops", file=sys.stderr, flush=True)
    return 128 + sig.value
