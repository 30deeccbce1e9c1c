"""How many ranks share this machine's cores, read from the launcher's environment (no MPI or
Slurm needed): hydra's, Open MPI's and MVAPICH2's own counts first, then a Slurm step's tasks on
this node (``srun`` sets none of the former), and the job's size last."""
from __future__ import annotations

import pytest

from toolkit import settings
from toolkit.distributed import launcher
from toolkit.runtime import parallel

VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_ID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
        "SLURM_NTASKS_PER_NODE")
# srun --nodes=3 --mpi=pmi2 with 4, 4 and 2 tasks: PMI says 10 ranks, Slurm the tasks per node
SRUN = {"PMI_SIZE": "10", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2),2"}


@pytest.fixture
def env(monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)

    def set_(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return set_


@pytest.mark.parametrize("values,expected", [
    ({}, 1),                                                           # no launcher
    ({"PMI_SIZE": "8", "MPI_LOCALNRANKS": "3", **{k: v for k, v in SRUN.items() if k != "PMI_SIZE"},
      "SLURM_NODEID": "2"}, 3),                                        # hydra's mpiexec, inside a step too
    ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
    ({**SRUN, "SLURM_NODEID": "0"}, 4),                                # srun: this node's tasks
    ({**SRUN, "SLURM_NODEID": "2"}, 2),
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"}, 1),
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "5(x2)"}, 5),              # no node id: all nodes alike
    ({**SRUN, "SLURM_NTASKS_PER_NODE": "5"}, 5),                       # uneven, no node id: the request
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "", "SLURM_NTASKS_PER_NODE": "2"}, 2),
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "lots", "SLURM_NODEID": "0"}, 10),  # not Slurm's form
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1(x99999999999)", "SLURM_NODEID": "0"}, 10),
    ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "0"}, 1),          # a batch script's one process
])
def test_the_ranks_on_this_machine(env, values, expected):
    env(**values)
    assert launcher.local_ranks() == expected


def test_each_rank_of_an_srun_step_takes_its_share_of_the_cores(env, monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 16)
    env(**SRUN, SLURM_NODEID="1")
    with settings.use(threads=None):
        assert parallel.default_threads() == 4                      # 16 cores, 4 tasks here (not 10)
    env(SLURM_NODEID="2")
    with settings.use(threads=None):
        assert parallel.default_threads() == 8
