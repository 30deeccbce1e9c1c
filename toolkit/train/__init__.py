"""Training: solvers as graph update ops, lr policies, data sources, checkpoints, the loop."""
