"""A failing rank must not leave the others waiting on a collective that will never complete:
whatever stops one rank (a user error, a bug, Ctrl-C) is reported with its rank and then aborts
the whole job through MPI, whose launcher stops every other rank at once. A rank killed outright
(SIGKILL, out of memory) is reported by its supervisor (supervisor.py), whose exit stops the job
the same way."""
from __future__ import annotations

import contextlib
import sys
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
    comm.abort(status)
