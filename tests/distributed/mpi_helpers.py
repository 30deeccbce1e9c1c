"""What the tests under mpiexec share: the launcher beside this Python (the dist extra's MPI
wheel), whether it and mpi4py are there, and the command that runs ``toolkit``."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
TOOLKIT = [sys.executable, "-m", "toolkit.cli"]

try:
    import mpi4py  # noqa: F401
    HAVE_MPI = MPIEXEC.exists()
except ImportError:
    HAVE_MPI = False
