"""Is this process one rank of an MPI job? Read from the environment that MPI launchers set,
so that a single process decides without importing the MPI library."""
from __future__ import annotations

import os

from ..errors import UserError

# (rank variable, size variable) of the launchers in use: MPICH's and Intel MPI's hydra (PMI),
# Open MPI's mpirun/prterun, MVAPICH2, and PMIx-based launchers that set only the rank
_LAUNCHER_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                  ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"))


def launched_size() -> int:
    """The number of ranks the launcher started (1 when there is no launcher)."""
    for _, size_var in _LAUNCHER_VARS:
        value = os.environ.get(size_var, "")
        if value.isdigit():
            return int(value)
    return 1


def launched_rank() -> int:
    for rank_var, _ in _LAUNCHER_VARS:
        value = os.environ.get(rank_var, "")
        if value.isdigit():
            return int(value)
    return 0


def local_ranks() -> int:
    """The ranks the launcher started on this machine (1 without a launcher)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return launched_size()


def world():
    """The job's communicator when launched with more than one rank, else None (and then
    mpi4py is never imported)."""
    if launched_size() <= 1:
        return None
    try:
        from mpi4py import MPI  # noqa: F401
    except ImportError as e:
        raise UserError("this process was started by an MPI launcher with "
                        f"{launched_size()} ranks, but the MPI layer is not installed ({e}); "
                        "install it with: pip install 'toolkit[dist]'") from None
    from .comm import MpiCommunicator
    return MpiCommunicator()
