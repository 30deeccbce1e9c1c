"""Data-parallel training over MPI (docs/spec.md section 8): finding the launcher (launcher.py), the
communicator the collective ops run on (comm.py), and the data-parallel train graph with its
gradient buckets (graph.py). A single process never imports mpi4py."""
