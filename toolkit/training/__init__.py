"""Training: the loop, lr policies, data sources, checkpoints, progress and metrics. The graph
builders it runs (solvers, loss scaling, the data-parallel step) are optim/'s, below the
compiler."""
