"""The MPI job of data-parallel training (docs/spec.md section 8): finding the launcher
(launcher.py), the communicator the collective ops run on (comm.py), each rank under a supervisor
(supervisor.py), a failing rank stopping the job (faults.py). A single process never imports
mpi4py; the data-parallel train graph is optim/data_parallel.py's."""
