"""Is this process one rank of an MPI job? Read from the environment that MPI launchers set,
so that a single process decides without importing the MPI library."""
from __future__ import annotations

import os

from ..errors import UserError

# the job's size as the launchers in use give it: MPICH's and Intel MPI's hydra (PMI), Open
# MPI's mpirun/prterun, MVAPICH2 (each rank's own number then comes from MPI itself)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def _first_number(names, default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def launched_size() -> int:
    """The number of ranks the launcher started (1 when there is no launcher)."""
    return _first_number(_SIZE_VARS, 1)


def local_ranks() -> int:
    """The ranks the launcher started on this machine (1 without a launcher)."""
    return _first_number(_LOCAL_SIZE_VARS, 0) or launched_size()


def missing_extra(e: ImportError) -> UserError:
    return UserError(f"this process was started by an MPI launcher with {launched_size()} ranks, but the MPI "
                     f"layer is not installed ({e}); install it with: pip install 'yamlnet-toolkit[dist]'")


def world():
    """The job's communicator when launched with more than one rank, else None (and then
    mpi4py is never imported)."""
    if launched_size() <= 1:
        return None
    try:
        from mpi4py import MPI  # noqa: F401
    except ImportError as e:
        raise missing_extra(e) from None
    from .comm import MpiCommunicator
    return MpiCommunicator()
