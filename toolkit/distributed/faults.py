"""A failing rank must not leave the others waiting on a collective that will never complete:
whatever stops one rank (a user error, a bug, Ctrl-C) is reported with its rank and then aborts
the whole job through MPI, whose launcher stops every other rank at once. A rank killed outright
(SIGKILL, out of memory) is reported by its supervisor (supervisor.py), whose exit stops the job
the same way."""
from __future__ import annotations

import array
import contextlib
import os
import stat
import sys
import time
import traceback

from ..errors import UserError


@contextlib.contextmanager
def stop_job_on_failure(comm):
    try:
        yield
    except SystemExit as e:
        if e.code not in (0, None):
            _abort(comm, f"rank {comm.rank} of {comm.size} exited with status {e.code}", 2)
        raise
    except UserError as e:
        lines = [str(p) for p in e.problems] or [str(e)]
        _abort(comm, "\n".join(_named(comm, line) for line in lines), 2)
    except KeyboardInterrupt:
        _abort(comm, f"rank {comm.rank} of {comm.size}: interrupted", 130)
    except GeneratorExit:          # closed unfinished, after an exception left the block: not a failure here
        raise
    except BaseException as e:              # a bug: its traceback, then the job stops
        traceback.print_exc()
        _abort(comm, f"rank {comm.rank} of {comm.size}: internal error: {type(e).__name__}: {e}", 1)


def _named(comm, line: str) -> str:
    if line.startswith("error: "):
        return f"error: rank {comm.rank} of {comm.size}: {line.removeprefix('error: ')}"
    return f"rank {comm.rank} of {comm.size}: {line}"


def _abort(comm, message: str, status: int) -> None:
    print(message, file=sys.stderr, flush=True)
    wait_until_read(sys.stderr)
    comm.abort(status)


def wait_until_read(stream, limit_s: float = 2.0) -> bool:
    """Waits (at most ``limit_s``) until whoever reads ``stream``'s pipe has read all of it; True
    if it has (or the stream is no pipe). A launcher forwards each rank's output from a pipe,
    and MPI_Abort has it stop every process at once: what it had not read of the pipe by then
    was lost, the job ending with its status and no line saying why (seen on a busy machine).
    Once the launcher's proxy has read the line, it forwards it before the abort that follows."""
    try:
        import fcntl
        import termios
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return True
    except (ImportError, AttributeError, OSError, ValueError):      # no pipes to ask (Windows), or no file
        return True
    unread = array.array("i", [0])
    deadline = time.monotonic() + limit_s
    while True:
        try:
            fcntl.ioctl(fd, termios.FIONREAD, unread, True)
        except OSError:
            return True
        if unread[0] == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
