"""Is this process one rank of an MPI job? Read from the environment that MPI launchers set,
so that a single process decides without importing the MPI library.

The ranks on this machine (``local_ranks``, which share its cores among their threads) are read
in this order, the first that is set winning:

1. ``MPI_LOCALNRANKS``: MPICH's and Intel MPI's hydra ``mpiexec``;
2. ``OMPI_COMM_WORLD_LOCAL_SIZE``: Open MPI's ``mpirun``;
3. ``MV2_COMM_WORLD_LOCAL_SIZE``: MVAPICH2;
4. in a Slurm job step (``srun``), which sets none of those: ``SLURM_STEP_TASKS_PER_NODE``, the
   step's tasks on each of its nodes (``2(x3),1``), at this node's index ``SLURM_NODEID``;
5. then ``SLURM_NTASKS_PER_NODE`` (``--ntasks-per-node``, the same on every node);
6. else every rank of the job (``launched_size``), as if they all shared this machine.

Slurm's counts are read only in a step (``SLURM_STEP_ID`` is set): a batch script's one process
sees the allocation's ``SLURM_NTASKS_PER_NODE`` too, and is alone.
"""
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
    """The ranks the launcher started on this machine (1 without a launcher): see the order above."""
    return _first_number(_LOCAL_SIZE_VARS, 0) or _slurm_step_tasks_here() or launched_size()


def _slurm_step_tasks_here() -> int:
    """The tasks of this Slurm job step on this node, 0 where Slurm does not say (or not in a
    step). A value that is not Slurm's form is passed over, as a launcher's unset one is."""
    if "SLURM_STEP_ID" not in os.environ:
        return 0
    counts = _expand_counts(os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = os.environ.get("SLURM_NODEID", "")
    if counts and node.isdigit() and int(node) < len(counts):
        return counts[int(node)]
    if counts and len(set(counts)) == 1:      # every node alike: which one this is does not matter
        return counts[0]
    return _first_number(("SLURM_NTASKS_PER_NODE",), 0)


def _expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts, ``4,2`` or ``2(x3),1``, one per node; [] for anything else."""
    counts: list[int] = []
    for part in text.split(",") if text else []:
        count, _, repeat = part.partition("(x")
        if not count.isdigit() or (repeat and not (repeat.endswith(")") and repeat[:-1].isdigit())):
            return []
        times = int(repeat[:-1]) if repeat else 1
        if len(counts) + times > 1 << 20:     # no real job has a million nodes: not Slurm's
            return []
        counts += [int(count)] * times
    return counts


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
