"""Training's graph builders, below the compiler: the solvers' update ops (solvers.py), dynamic
loss scaling (loss_scaling.py) and the data-parallel step (data_parallel.py)."""
